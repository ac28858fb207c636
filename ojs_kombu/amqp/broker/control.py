"""CANCEL, BEAT and INFO over OJS control queues (AMQP binding sections 5.6 to 5.8).

Control messages go to ``ojs.exchange.direct`` with the control queue's name
as routing key, into ``ojs.queue.control.{q}``; the body is JSON and the
``type`` property says what it is.  :class:`ControlClient` is the client side,
usable from any Python process with only a broker URL.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

import amqp
from kombu import Connection

from ...spec.errors import BrokerBackingOff, ControlError, ControlTimeout
from ...spec.job_ids import is_task_id, new_job_id
from ..binding import Binding
from ..job_channel import JobChannel, JobConnection
from ..wire.drain import drain_until
from .connection import connect_on_demand

CANCEL = "ojs.control.cancel"
HEARTBEAT = "ojs.control.heartbeat"
INFO = "ojs.control.info"
CONTROL_TYPES = (CANCEL, HEARTBEAT, INFO)


def control_message(kind: str, body: Mapping[str, Any], **properties: Any) -> amqp.Message:
    """A control message: JSON body, ``type`` = ``ojs.control.*``, persistent."""
    return amqp.Message(
        json.dumps(dict(body), separators=(",", ":")).encode(), type=kind,
        content_type="application/json", content_encoding="utf-8", delivery_mode=2,
        app_id="ojs", message_id=new_job_id(), timestamp=int(time.time()), **properties)


def parse_control(message: amqp.Message) -> tuple[str, dict[str, Any]]:
    """``(type, body)`` of a control message; ``ValueError`` naming what is wrong."""
    kind = message.properties.get("type")
    if kind not in CONTROL_TYPES:
        raise ValueError(f"unknown control message type {kind!r} (expected one of "
                         f"{', '.join(CONTROL_TYPES)})")
    try:
        body = json.loads(message.body)
    except ValueError:
        raise ValueError(f"{kind} body is not JSON") from None
    if not isinstance(body, dict) or not isinstance(body.get("job_id"), str):
        raise ValueError(f"{kind} body must be an object with a string job_id")
    if not is_task_id(body["job_id"]):
        raise ValueError(f"{kind}: job_id {body['job_id']!r} is neither a job id nor a task id")
    return kind, body


class ControlClient:
    """Sends CANCEL and INFO requests; one connection, one exclusive reply queue.

    ``ControlClient("ojs://guest:guest@localhost//")`` or ``ControlClient(app)``.
    Thread-safe: INFO replies are matched by ``correlation_id``, so requests made
    at the same time (or with :meth:`info_many`) never get each other's answer.
    """

    def __init__(self, app_or_url: Any, connect_timeout: float = 5.0, prefix: str = "") -> None:
        if isinstance(app_or_url, str):
            options = {"ojs_prefix": prefix} if prefix else {}
            self._connection = Connection(app_or_url, connect_timeout=connect_timeout,
                                          transport_options=options)
        else:
            self._connection = app_or_url.connection_for_write()
        try:
            connect_on_demand(self._connection, "control")
        except BrokerBackingOff as exc:
            raise ControlError(str(exc)) from None
        except Exception as exc:
            where = self._connection.as_uri()
            raise ControlError(f"cannot reach the broker at {where}: {exc}") from None
        amqp_connection = self._connection.connection
        if not isinstance(amqp_connection, JobConnection):
            raise ControlError("control requests need an ojs:// broker URL")
        self._amqp = amqp_connection
        self.binding: Binding = amqp_connection.ojs
        self._lock = threading.Lock()
        self._channel: JobChannel = amqp_connection.channel()
        self._reply_queue: str | None = None
        self._replies: dict[str, dict[str, Any]] = {}

    # -- CANCEL ------------------------------------------------------------------

    def cancel(self, job_id: str, queue: str, *, reason: str | None = None,
               cancelled_by: str | None = None, terminate: bool = False) -> None:
        """Ask the workers to cancel ``job_id`` (confirmed by the broker).

        A job that has not started never starts; a running one is asked to stop
        (``terminate=True``: its pool process is killed).  Cancelling an unknown
        or finished job is a no-op, reported by the workers in their logs.
        """
        if not is_task_id(job_id):
            raise ControlError(f"{job_id!r} is neither a job id (UUIDv7) nor a Celery task id")
        body = {"job_id": job_id, "reason": reason, "cancelled_by": cancelled_by,
                "terminate": terminate}
        self._send_control(queue, control_message(CANCEL, {k: v for k, v in body.items()
                                                           if v is not None}))

    # -- INFO ---------------------------------------------------------------------

    def info(self, job_id: str, queue: str, timeout: float = 5.0) -> dict[str, Any]:
        """The job's OJS state, answered by a worker of ``queue`` (RPC, section 5.8)."""
        return self.info_many([(job_id, queue)], timeout)[job_id]

    def info_many(self, jobs: Iterable[tuple[str, str]], timeout: float = 5.0
                  ) -> dict[str, dict[str, Any]]:
        """Several INFO requests at once; answers are matched by ``correlation_id``."""
        with self._lock:
            reply_queue = self._ensure_reply_queue()
            waiting: dict[str, str] = {}
            for job_id, queue in jobs:
                correlation_id = new_job_id()
                waiting[correlation_id] = job_id
                self._send_control(queue, control_message(
                    INFO, {"job_id": job_id}, reply_to=reply_queue,
                    correlation_id=correlation_id))
            if not drain_until(self._amqp, lambda: all(c in self._replies for c in waiting),
                               timeout):
                missing = sorted(job for c, job in waiting.items() if c not in self._replies)
                raise ControlTimeout(f"no INFO answer within {timeout}s for job(s) "
                                     f"{', '.join(missing)}: is a worker consuming "
                                     "their queue?")
            return {waiting[c]: self._replies.pop(c) for c in list(waiting)}

    def _ensure_reply_queue(self) -> str:
        if self._reply_queue is None:
            name, _, _ = self._channel.queue_declare("", exclusive=True, auto_delete=True)
            self._channel.basic_consume(name, no_ack=True, callback=self._on_reply)
            self._reply_queue = name
        return self._reply_queue

    def _on_reply(self, message: amqp.Message) -> None:
        correlation_id = message.properties.get("correlation_id")
        try:
            self._replies[correlation_id] = json.loads(message.body)
        except ValueError:
            self._replies[correlation_id] = {"state": "error", "error": "unreadable answer"}

    def _send_control(self, queue: str, message: amqp.Message) -> None:
        ojs_queue = self.binding.names.ojs_queue(queue)
        self._amqp.ensure_topology(ojs_queue)
        control = self.binding.names.control_queue(ojs_queue)
        self._channel.publish_confirmed(message, self.binding.names.direct_exchange, control,
                                        job_id=message.properties["message_id"],
                                        queue=ojs_queue)

    def close(self) -> None:
        self._connection.release()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def cancel(app_or_url: Any, job_id: str, queue: str, reason: str | None = None,
           **options: Any) -> None:
    """Cancel ``job_id`` of ``queue`` (see :meth:`ControlClient.cancel`)."""
    with ControlClient(app_or_url) as client:
        client.cancel(job_id, queue, reason=reason, **options)


def info(app_or_url: Any, job_id: str, queue: str, timeout: float = 5.0) -> dict[str, Any]:
    """The OJS state of ``job_id`` (see :meth:`ControlClient.info`)."""
    with ControlClient(app_or_url) as client:
        return client.info(job_id, queue, timeout)

