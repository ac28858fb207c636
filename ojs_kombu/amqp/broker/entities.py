"""kombu entities for OJS job queues.

A :class:`JobQueue` is what a Celery task queue becomes under ojs_kombu:
AMQP name ``ojs.queue.{q}``, bound to ``ojs.exchange.direct`` with routing
key ``{q}``, and an alias ``{q}`` so ``celery worker -Q email`` and
``apply_async(queue="email")`` keep working.  Declaring it declares the
queue's whole OJS topology through the ``ojs`` transport connection, once
per connection.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kombu import Exchange, Queue

from ...spec.errors import OJSConfigurationError
from ...spec.naming import TopologyNames
from ..job_channel import JobConnection
from .topology import OWNED_ARGUMENTS, job_queue_arguments

#: Arguments Celery must not see on its queue objects: Celery's native delayed
#: delivery switches itself on for quorum queues and would reroute countdowns.
HIDDEN_ARGUMENTS = ("x-queue-type",)


class JobQueue(Queue):
    """A Celery task queue that is an OJS job queue."""

    # kombu infers Queue.attrs as a tuple of fixed length: one more entry is the
    # documented way to add an attribute, which its hints do not allow for
    attrs = (*Queue.attrs, ("ojs_queue", None))  # type: ignore[assignment]
    ojs_queue: str

    def declare(self, nowait: bool = False, channel: Any = None) -> str:
        channel = channel or self.channel
        connection = channel.connection if channel is not None else None
        if not isinstance(connection, JobConnection):
            raise OJSConfigurationError(
                f"{self.name!r} is an OJS job queue and needs the ojs:// broker transport "
                f"(got a {type(channel).__module__} channel)"
            )
        connection.ensure_topology(self.ojs_queue)
        return self.name


def job_queue(names: TopologyNames, queue: str, arguments: dict[str, Any] | None = None
              ) -> JobQueue:
    """The :class:`JobQueue` of OJS queue ``queue``; ``arguments`` are shown to Celery."""
    visible = {
        k: v for k, v in job_queue_arguments(names, queue, arguments).items()
        if k not in HIDDEN_ARGUMENTS
    }
    return JobQueue(
        names.job_queue(queue),
        Exchange(names.direct_exchange, "direct", durable=True, auto_delete=False),
        routing_key=queue,
        durable=True,
        exclusive=False,
        auto_delete=False,
        queue_arguments=visible,
        alias=queue,
        ojs_queue=queue,
    )


def declare_job_queues(connection: Any, queues: Iterable[Queue]) -> None:
    """Declare the OJS topology of every :class:`JobQueue` of ``queues`` at once, over
    ``connection`` (a kombu connection or channel of the ``ojs`` transport): a worker
    consuming many queues starts without one queue's declarations waiting for the
    last's.  Their own ``declare`` then finds them declared."""
    transport_connection = getattr(connection, "connection", None)
    if isinstance(transport_connection, JobConnection):
        transport_connection.ensure_topologies(
            queue.ojs_queue for queue in queues if isinstance(queue, JobQueue))


def extra_arguments(queue: Queue) -> dict[str, Any]:
    """The user-defined ``Queue.Declare`` arguments of a Celery queue (no OJS-owned ones)."""
    from kombu.transport.base import to_rabbitmq_queue_arguments

    # kombu sets these from Queue.attrs at run time; its hints do not declare them
    entity: Any = queue
    args = to_rabbitmq_queue_arguments(
        dict(entity.queue_arguments or {}),
        expires=entity.expires, message_ttl=entity.message_ttl, max_length=entity.max_length,
        max_length_bytes=entity.max_length_bytes, max_priority=entity.max_priority,
    )
    return {k: v for k, v in args.items() if k not in OWNED_ARGUMENTS}
