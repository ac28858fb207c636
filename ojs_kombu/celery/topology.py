"""The app's OJS topology, declared ahead of the first publish or consume."""

from __future__ import annotations

from collections.abc import Iterable

from celery import Celery

from ..amqp.broker.connection import connect_on_demand
from ..amqp.broker.entities import JobQueue
from ..amqp.job_channel import JobConnection
from ..spec.errors import OJSConfigurationError


def declare_topology(app: Celery, queues: Iterable[str] | None = None) -> list[str]:
    """Eagerly declare the OJS topology of ``queues`` (default: every queue of the app).

    Idempotent; returns the OJS queue names declared.  Raises
    :class:`~ojs_kombu.spec.errors.TopologyConflictError` when the broker holds a
    queue with different arguments.
    """
    table = app.amqp.queues
    selected = [table[name] for name in queues] if queues is not None else list(table.values())
    ojs_names = [q.ojs_queue for q in selected if isinstance(q, JobQueue)]
    with app.connection_for_write() as connection:
        connect_on_demand(connection, "declaring the topology")
        amqp_connection = connection.connection
        if not isinstance(amqp_connection, JobConnection):
            raise OJSConfigurationError(
                f"declare_topology needs an ojs:// broker; {connection.as_uri()} is "
                f"{connection.transport_cls!r}")
        amqp_connection.ensure_topologies(ojs_names)
    return ojs_names
