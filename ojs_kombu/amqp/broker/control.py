"""CANCEL, BEAT and INFO over OJS control queues (AMQP binding sections 5.6 to 5.8).

Control messages go to ``ojs.exchange.direct`` with the control queue's name
as routing key, into ``ojs.queue.control.{q}``; the body is JSON and the
``type`` property says what it is.  :class:`ControlClient` is the client side,
usable from any Python process with only a broker URL.

Every producer can publish to every control queue (RabbitMQ checks *write* on
the exchange, never the routing key), so a worker trusts only what the broker
vouches for: the ``user_id`` property (RabbitMQ refuses a publish whose
``user_id`` is not the connection's user) and a ``reply_to`` that is the
requester's own reply queue (:func:`reply_to_problem`, :func:`reply_queue_problem`).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

import amqp
from kombu import Connection

from ...spec.errors import BrokerBackingOff, ControlError, ControlForbidden, ControlTimeout
from ...spec.job_ids import is_task_id, new_job_id
from ..binding import Binding
from ..job_channel import JobChannel, JobConnection
from ..wire.drain import drain_until
from .connection import connect_on_demand

CANCEL = "ojs.control.cancel"
HEARTBEAT = "ojs.control.heartbeat"
INFO = "ojs.control.info"
CONTROL_TYPES = (CANCEL, HEARTBEAT, INFO)
#: RabbitMQ's direct reply-to: a requester consuming it sends this as ``reply_to``,
#: and the broker rewrites it to ``amq.rabbitmq.reply-to.<its channel>``.
DIRECT_REPLY_TO = "amq.rabbitmq.reply-to"
#: The names RabbitMQ gives the queues it names (``queue.declare`` with no name).
SERVER_NAMED = "amq.gen-"
#: The ``state`` of an INFO answer refused to its requester (nothing about the job).
FORBIDDEN = "forbidden"


def reply_to_problem(reply_to: str | None) -> str | None:
    """Why an INFO answer must not go to ``reply_to`` (``None``: it has the form of a
    requester's own reply queue; a server-named one still needs
    :func:`reply_queue_problem`).

    Only direct reply-to as the broker rewrote it and server-named queues: any other
    name could be a job, dead-letter or control queue the requester may not write
    (the worker publishes through the default exchange, which reaches every queue).
    The bare ``amq.rabbitmq.reply-to`` is what a requester wrote itself; publishing
    to it closes the worker's connection on RabbitMQ 3.x (541)."""
    if not reply_to:
        return "it has no reply_to"
    if reply_to.startswith(DIRECT_REPLY_TO + ".") and len(reply_to) > len(DIRECT_REPLY_TO) + 1:
        return None
    if reply_to.startswith(SERVER_NAMED) and len(reply_to) > len(SERVER_NAMED):
        return None
    return (f"reply_to {reply_to[:200]!r} is not a reply queue of the requester's own "
            f"(direct reply-to {DIRECT_REPLY_TO!r} or an exclusive server-named "
            f"{SERVER_NAMED}* queue)")


def reply_queue_problem(connection: amqp.Connection, reply_to: str) -> str | None:
    """Why the server-named ``reply_to`` is not a reply queue of the requester's own:
    it must be exclusive to another connection than ``connection``, which RabbitMQ
    shows by refusing a passive declare with 405 RESOURCE_LOCKED.  On a throwaway
    channel: a refused passive declare closes its channel."""
    if not reply_to.startswith(SERVER_NAMED):
        return None  # direct reply-to: nothing to declare
    channel = connection.channel()
    try:
        channel.queue_declare(reply_to, passive=True)
    except amqp.exceptions.ResourceLocked:
        return None
    except amqp.exceptions.NotFound:
        return f"reply_to {reply_to!r} does not exist"
    except amqp.exceptions.ChannelError as exc:
        return f"reply_to {reply_to!r} could not be checked ({exc.reply_code})"
    with contextlib.suppress(Exception):
        channel.close()
    return f"reply_to {reply_to!r} is not exclusive to the requester's connection"


def login_user(connection: Connection) -> str | None:
    """The broker user ``connection`` logs in as (what RabbitMQ checks ``user_id``
    against), ``None`` when the broker derives it (EXTERNAL: a client certificate)."""
    if str(connection.login_method or "").upper() == "EXTERNAL":
        return None
    user = connection.userid or connection.transport.default_connection_params.get("userid")
    return str(user) if user else None


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
    """Sends CANCEL and INFO requests; one connection, answers by direct reply-to.

    ``ControlClient("ojs://guest:guest@localhost//")`` or ``ControlClient(app)``.
    Thread-safe: INFO replies are matched by ``correlation_id`` (and the answer must
    name the job asked about), so requests made at the same time (or with
    :meth:`info_many`) never get each other's answer.  Every request carries
    ``user_id``: the connection's user, or ``user_id=`` when the broker derives the
    user (EXTERNAL login with a client certificate); workers honour it only for
    users ``ojs_control_users`` authorises.
    """

    def __init__(self, app_or_url: Any, connect_timeout: float = 5.0, prefix: str = "",
                 user_id: str | None = None) -> None:
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
        self.user_id = user_id or login_user(self._connection)
        self.binding: Binding = amqp_connection.ojs
        self._lock = threading.Lock()
        self._channel: JobChannel = amqp_connection.channel()
        self._reply_queue: str | None = None
        self._replies: dict[str, dict[str, Any]] = {}
        self._waiting: dict[str, str] = {}  # correlation id -> job id asked about

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
            try:
                for job_id, queue in jobs:
                    correlation_id = new_job_id()
                    # before the publish: its answer can come while the confirm is awaited
                    waiting[correlation_id] = self._waiting[correlation_id] = job_id
                    self._send_control(queue, control_message(
                        INFO, {"job_id": job_id}, reply_to=reply_queue,
                        correlation_id=correlation_id))
                if not drain_until(self._amqp,
                                   lambda: all(c in self._replies for c in waiting), timeout):
                    missing = sorted(job for c, job in waiting.items()
                                     if c not in self._replies)
                    raise ControlTimeout(f"no INFO answer within {timeout}s for job(s) "
                                         f"{', '.join(missing)}: is a worker consuming "
                                         "their queue?")
                answers = {waiting[c]: self._replies.pop(c) for c in list(waiting)}
            finally:
                for correlation_id in waiting:
                    self._waiting.pop(correlation_id, None)
                    self._replies.pop(correlation_id, None)
        for job_id, answer in answers.items():
            if answer.get("state") == FORBIDDEN:
                raise ControlForbidden(f"INFO for job {job_id} refused: "
                                       f"{answer.get('reason') or 'not authorised'}")
        return answers

    def _ensure_reply_queue(self) -> str:
        """RabbitMQ's direct reply-to on the channel the requests go out on: no queue to
        declare (any broker user can ask INFO), and no name another party could use."""
        if self._reply_queue is None:
            self._channel.basic_consume(DIRECT_REPLY_TO, no_ack=True, callback=self._on_reply)
            self._reply_queue = DIRECT_REPLY_TO
        return self._reply_queue

    def _on_reply(self, message: amqp.Message) -> None:
        """Keep an answer to a request of ours about the job it was asked for; anything
        else in the reply queue (a stray or planted message) is dropped."""
        correlation_id = message.properties.get("correlation_id")
        job_id = self._waiting.get(correlation_id)
        if job_id is None:
            return
        try:
            answer = json.loads(message.body)
        except ValueError:
            answer = {"state": "error", "error": "unreadable answer"}
        if not isinstance(answer, dict):
            answer = {"state": "error", "error": "unreadable answer"}
        elif job_id not in (answer.get("job_id", job_id), answer.get("task_id")):
            return  # an answer about another job under our correlation id
        self._replies[correlation_id] = answer

    def _send_control(self, queue: str, message: amqp.Message) -> None:
        if self.user_id:
            message.properties["user_id"] = self.user_id
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

