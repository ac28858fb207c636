"""Worker side of reconnection (AMQP-025..027): reporting what the consumer restored.

On a lost connection Celery's consumer closes it, opens a new one through
:class:`~ojs_kombu.amqp.broker.connection.BrokerConnection` (so with the OJS backoff
schedule), re-declares every queue it consumes (an OJS job queue's
declaration is its whole topology: exchanges, queue, bindings, dead-letter
queue) and registers every consumer again with the same prefetch count.
:class:`ConsumerReconnections` runs after that restart and reports it: a log
line, ``ojs_amqp_reconnections_total{outcome="succeeded", role="worker"}``
and a ``connection.reconnected`` event naming the queues and the prefetch.

A connection that no retry can establish (a TLS handshake the broker or the
client refuses for good: :class:`~ojs_kombu.spec.errors.BrokerTLSError`) is
not a lost connection: :class:`PermanentConnectFailure` stops the worker with
one error line and Celery's exit code for a failed start (1), at start or on
a later reconnection, where Celery would log the exception's traceback.
"""

from __future__ import annotations

import logging
from time import monotonic
from typing import Any

from celery import bootsteps
from celery.exceptions import WorkerShutdown
from celery.platforms import EX_FAILURE
from celery.worker import state as worker_state

from ..amqp.broker.connection import report_reconnection
from ..spec.errors import BrokerTLSError
from .events import consumed_queues

logger = logging.getLogger(__name__)


class ConsumerReconnections(bootsteps.StartStopStep):
    """Consumer bootstep: report each restart of the consumer after a lost connection."""

    name = "ojs_kombu.reconnections"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._lost_at: float | None = None

    def start(self, parent: Any) -> None:
        if self._lost_at is None:
            return
        lost_at, self._lost_at = self._lost_at, None
        connection = parent.connection
        report_reconnection(
            parent.app.amqp.binding, role="worker",
            broker=connection.as_uri() if connection is not None else "?",
            attempts=getattr(connection, "_ojs_attempts", 0) + 1,
            duration_s=monotonic() - lost_at, worker_id=parent.hostname,
            queues=consumed_queues(parent.app), prefetch_count=_prefetch(parent))

    def stop(self, parent: Any) -> None:
        """Called on every consumer restart (a lost connection) and at shutdown."""
        if worker_state.should_stop is None and worker_state.should_terminate is None:
            self._lost_at = monotonic()


def _prefetch(parent: Any) -> int | None:
    qos = getattr(parent, "qos", None)
    value = getattr(qos, "value", None)
    return int(value) if value is not None else None


class PermanentConnectFailure(bootsteps.Step):
    """Consumer bootstep: a consumer connection that fails for good stops the worker."""

    name = "ojs_kombu.permanent_connect_failure"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        connect = parent.connect  # what Celery's Connection step calls, each (re)start

        def connect_or_stop() -> Any:
            try:
                return connect()
            except BrokerTLSError as exc:
                logger.critical("worker %s stops: %s", parent.hostname, exc)
                raise WorkerShutdown(EX_FAILURE) from exc

        parent.connect = connect_or_stop
