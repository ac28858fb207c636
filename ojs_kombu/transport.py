"""The ``ojs`` kombu transport: py-amqp, speaking the OJS AMQP binding.

A thin subclass of kombu's pyamqp transport with two seams:

* **publish** (:meth:`Channel.basic_publish`): a message carrying a Celery
  ``task`` header is rewritten into an OJS job (envelope body, OJS properties
  and ``x-ojs-*`` headers), published to ``ojs.exchange.direct`` with
  ``mandatory=True`` and waited on with publisher confirms; a return, a nack
  or a missing confirm raises a typed exception naming job and queue.
* **consume** (:meth:`Channel.basic_consume`): deliveries from an
  ``ojs.queue.{q}`` queue are validated before kombu sees them; a message that
  is not a runnable OJS job is dead-lettered into ``ojs.queue.dlx.{q}`` with
  ``x-ojs-error-code``/``x-ojs-error-message`` and never reaches Celery.

Everything else (Celery's remote control, its monitoring events, the
``rpc://`` result backend) passes through untouched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from time import monotonic
from typing import Any

import amqp
from amqp import spec
from amqp.exceptions import RecoverableConnectionError
from kombu.transport import pyamqp

from .codec import decode_job_message, encode_task_message
from .errors import (
    JobNackedError,
    JobRejected,
    JobRoutingError,
    OJSConfigurationError,
    PublishConfirmTimeout,
    QueueNameError,
    UnroutableJobError,
)
from .settings import Binding
from .topology import declare_queue_topology

logger = logging.getLogger(__name__)

#: Key under which a validated job's ``(args, kwargs, embed)`` rides from the
#: consume hook to :meth:`Channel.message_to_python` (popped there).
_PAYLOAD_KEY = "_ojs_payload"
_MAX_ERROR_MESSAGE = 1024


class _PendingPublish:
    __slots__ = ("job_id", "nacked", "queue", "returned", "settled")

    def __init__(self, job_id: str, queue: str) -> None:
        self.job_id = job_id
        self.queue = queue
        self.settled = False
        self.nacked = False
        self.returned: str | None = None


def _argsrepr(args: Any) -> str:
    from kombu.utils.encoding import safe_repr

    text = safe_repr(args)
    return text if len(text) <= _MAX_ERROR_MESSAGE else text[:_MAX_ERROR_MESSAGE] + "..."


class JobMessage(pyamqp.Message):
    """A delivery from an OJS job queue, as Celery sees it.

    The binding forbids ``Basic.Nack(requeue=true)`` for failed jobs (section
    5.4: it loops).  Celery requeues a job that hit its hard time limit, or
    whose task raised ``Reject(requeue=True)``; such a job is dead-lettered
    instead, so nothing is redelivered forever.
    """

    def reject(self, requeue: bool = False) -> None:
        if requeue:
            logger.warning("job %s: OJS jobs are never requeued immediately (AMQP binding "
                           "5.4); dead-lettering it instead", self.properties.get("message_id"))
        super().reject(requeue=False)

    def requeue(self) -> None:
        self.reject(requeue=True)


class Channel(pyamqp.Channel):
    """pyamqp channel that maps Celery task messages onto OJS jobs."""

    connection: Connection

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ojs_reset()

    def _ojs_reset(self) -> None:
        self._ojs_confirming = False
        self._ojs_seq = 0
        self._ojs_pending: dict[int, _PendingPublish] = {}
        self._ojs_by_id: dict[str, _PendingPublish] = {}
        self._ojs_qos_set = False

    def _do_revive(self) -> None:
        self._ojs_reset()
        super()._do_revive()

    @property
    def ojs(self) -> Binding:
        return self.connection.ojs

    # -- publish -----------------------------------------------------------

    def basic_publish(  # type: ignore[override]
        self,
        msg: amqp.Message,
        exchange: str = "",
        routing_key: str = "",
        mandatory: bool = False,
        immediate: bool = False,
        timeout: float | None = None,
        confirm_timeout: float | None = None,
        **kwargs: Any,
    ) -> Any:
        headers = msg.properties.get("application_headers")
        if headers and "task" in headers:
            return self._publish_job(msg, headers, exchange, routing_key, timeout, confirm_timeout)
        if self.connection.ojs_confirm_all:
            pending = self._publish_tracked(
                msg, exchange, routing_key, mandatory, timeout, confirm_timeout,
                job_id=msg.properties.get("message_id") or "", queue=routing_key,
            )
            if pending.nacked:
                raise amqp.exceptions.MessageNacked()
            return None
        if self._ojs_confirming:
            self._ojs_seq += 1  # the broker numbers every publish of a confirm-mode channel
        return self._basic_publish(msg, exchange, routing_key, mandatory, immediate, timeout)

    def _publish_job(
        self,
        msg: amqp.Message,
        headers: dict[str, Any],
        exchange: str,
        routing_key: str,
        timeout: float | None,
        confirm_timeout: float | None,
    ) -> None:
        task = headers["task"]
        queue = self._job_queue_for(task, exchange, routing_key)
        ojs = self.ojs
        job = encode_task_message(
            body=msg.body,
            content_type=msg.properties.get("content_type"),
            properties=msg.properties,
            headers=headers,
            job_type=ojs.job_types.type_for(task),
            queue=queue,
        )
        self.connection.ensure_topology(queue)
        self.publish_confirmed(
            amqp.Message(job.body, **job.properties),
            ojs.names.direct_exchange, queue,
            job_id=job.job_id, queue=queue, timeout=timeout, confirm_timeout=confirm_timeout,
        )

    def _job_queue_for(self, task: str, exchange: str, routing_key: str) -> str:
        """The OJS queue a Celery route points at (AMQP-005: direct exchange, key = queue)."""
        names = self.ojs.names
        if exchange not in (names.direct_exchange, ""):
            raise JobRoutingError(
                f"task {task!r} was routed to exchange {exchange!r} (routing key "
                f"{routing_key!r}); OJS jobs go through {names.direct_exchange!r} with the "
                "queue name as routing key. Call ojs_kombu.install(app) and route tasks "
                "with queue=..., not exchange=/routing_key=",
            )
        try:
            return names.ojs_queue(routing_key)
        except QueueNameError as exc:
            raise JobRoutingError(f"task {task!r}: {exc}") from None

    def publish_confirmed(
        self,
        message: amqp.Message,
        exchange: str,
        routing_key: str,
        *,
        job_id: str,
        queue: str,
        timeout: float | None = None,
        confirm_timeout: float | None = None,
    ) -> None:
        """Publish with ``mandatory=True`` and wait for the broker's confirm (AMQP-014..016)."""
        pending = self._publish_tracked(message, exchange, routing_key, True, timeout,
                                        confirm_timeout, job_id=job_id, queue=queue)
        if pending.returned is not None:
            self.connection.forget_topology(queue)  # the next publish re-declares it
            raise UnroutableJobError(
                f"job {job_id} for queue {queue!r} was returned by the broker "
                f"({pending.returned}): no queue is bound to {exchange!r} with routing key "
                f"{routing_key!r}; it was not enqueued",
                job_id=job_id, queue=queue,
            )
        if pending.nacked:
            raise JobNackedError(
                f"job {job_id} for queue {queue!r} was refused by the broker (Basic.Nack); "
                "it was not enqueued", job_id=job_id, queue=queue,
            )

    def _publish_tracked(self, message: amqp.Message, exchange: str, routing_key: str,
                         mandatory: bool, timeout: float | None, confirm_timeout: float | None,
                         *, job_id: str, queue: str) -> _PendingPublish:
        """Publish on this channel in confirm mode and block until the publish is settled."""
        self._confirm_mode()
        self._ojs_seq += 1
        tag = self._ojs_seq
        pending = self._ojs_pending[tag] = _PendingPublish(job_id, queue)
        if job_id:
            self._ojs_by_id[job_id] = pending
        try:
            self._send_publish(message, exchange, routing_key, mandatory, timeout)
            self._wait_settled(pending, confirm_timeout)
        finally:
            self._ojs_pending.pop(tag, None)
            self._ojs_by_id.pop(job_id, None)
        return pending

    def _send_publish(self, message: amqp.Message, exchange: str, routing_key: str,
                      mandatory: bool, timeout: float | None) -> None:
        """``Basic.Publish`` without py-amqp's per-publish non-blocking read.

        py-amqp polls the socket before every publish for a pending
        ``connection.blocked``; a confirmed publish reads every incoming frame
        right afterwards anyway, so that poll is pure cost on this path.
        """
        if not self.connection:
            raise RecoverableConnectionError("basic_publish: connection closed")
        try:
            with self.connection.transport.having_timeout(timeout):
                self.send_method(spec.Basic.Publish, "Bssbb",
                                 (0, exchange, routing_key, mandatory, False), message)
        except TimeoutError:
            raise RecoverableConnectionError("basic_publish: timed out") from None

    def _confirm_mode(self) -> None:
        if self._ojs_confirming:
            return
        self.confirm_select()
        self._confirm_selected = True
        self.events["basic_ack"].add(self._on_confirm_ack)
        self.events["basic_nack"].add(self._on_confirm_nack)
        self.events["basic_return"].add(self._on_return)
        self._ojs_confirming = True
        self._ojs_seq = 0

    def _settle(self, delivery_tag: int, multiple: bool, nacked: bool) -> None:
        if multiple:
            settled = [p for t, p in self._ojs_pending.items() if t <= delivery_tag]
        else:
            one = self._ojs_pending.get(delivery_tag)
            settled = [one] if one is not None else []
        for pending in settled:
            pending.settled = True
            pending.nacked = pending.nacked or nacked

    def _on_confirm_ack(self, delivery_tag: int, multiple: bool) -> None:
        self._settle(delivery_tag, multiple, nacked=False)

    def _on_confirm_nack(self, delivery_tag: int, multiple: bool) -> None:
        self._settle(delivery_tag, multiple, nacked=True)

    def _on_return(self, exc: Exception, exchange: str, routing_key: str,
                   message: amqp.Message) -> None:
        message_id = message.properties.get("message_id")
        pending = self._ojs_by_id.get(message_id) if message_id else None
        if pending is not None:
            pending.returned = str(exc)
        else:
            logger.warning("message %s returned by the broker from exchange %r key %r: %s",
                           message_id, exchange, routing_key, exc)

    def _wait_settled(self, pending: _PendingPublish, confirm_timeout: float | None) -> None:
        limit = confirm_timeout or self.ojs.settings.confirm_timeout
        deadline = monotonic() + limit
        while not pending.settled:
            remaining = deadline - monotonic()
            if remaining <= 0:
                raise PublishConfirmTimeout(
                    f"no publisher confirm for job {pending.job_id} (queue {pending.queue!r}) "
                    f"within {limit}s: it may or may not be enqueued",
                    job_id=pending.job_id, queue=pending.queue,
                )
            try:
                self.connection.drain_events(timeout=remaining)
            except TimeoutError:
                continue

    # -- consume -----------------------------------------------------------

    def basic_qos(self, prefetch_size: int, prefetch_count: int, a_global: bool,
                  *args: Any, **kwargs: Any) -> Any:
        self._ojs_qos_set = True
        return super().basic_qos(prefetch_size, prefetch_count, a_global, *args, **kwargs)

    def basic_consume(self, queue: str = "", consumer_tag: str = "", no_local: bool = False,
                      no_ack: bool = False, exclusive: bool = False, nowait: bool = False,
                      callback: Callable[[amqp.Message], Any] | None = None,
                      *args: Any, **kwargs: Any) -> Any:
        ojs_queue = self.ojs.names.queue_from_job_queue(queue)
        if ojs_queue is not None and callback is not None:
            if no_ack:
                raise OJSConfigurationError(
                    f"{queue!r} is an OJS job queue: it is consumed with manual acks "
                    "(no_ack=False, AMQP-006)"
                )
            if not self._ojs_qos_set:
                logger.warning("consuming %s before Basic.Qos; setting prefetch_count=%d",
                               queue, self.ojs.settings.default_prefetch)
                self.basic_qos(0, self.ojs.settings.default_prefetch, False)
            callback = self._job_receiver(ojs_queue, callback)
        return super().basic_consume(queue, consumer_tag, no_local, no_ack, exclusive, nowait,
                                     callback, *args, **kwargs)

    def _job_receiver(self, queue: str, callback: Callable[[amqp.Message], Any]
                      ) -> Callable[[amqp.Message], Any]:
        resolve_task = self.ojs.job_types.task_for

        def receive_job(raw: amqp.Message) -> Any:
            try:
                job = decode_job_message(raw.body, raw.properties, resolve_task=resolve_task,
                                         argsrepr=_argsrepr)
            except JobRejected as rejected:
                return self.dead_letter(raw, queue, rejected.code, rejected.message)
            properties = raw.properties
            properties["application_headers"] = job.headers
            properties["correlation_id"] = job.envelope.id
            properties[_PAYLOAD_KEY] = job.payload
            return callback(raw)

        return receive_job

    def message_to_python(self, raw_message: amqp.Message) -> Any:
        payload = raw_message.properties.pop(_PAYLOAD_KEY, None)
        if payload is None:
            return self.Message(raw_message, channel=self)
        message = JobMessage(raw_message, channel=self)
        message._decoded_cache = payload
        return message

    def dead_letter(self, raw: amqp.Message, queue: str, code: str, text: str) -> None:
        """Move a delivery to ``ojs.queue.dlx.{queue}`` with error headers, then ack it.

        ``Basic.Nack`` cannot add headers, so the copy is published to the DLX
        and confirmed first; only then is the original acked.  If that fails,
        the delivery is nacked without requeue, which the queue's own
        dead-letter arguments route to the same DLQ (without the headers).
        """
        names = self.ojs.names
        headers = {
            k: v for k, v in (raw.properties.get("application_headers") or {}).items()
            if k != "x-death" and not str(k).startswith(("x-first-death", "x-last-death"))
        }
        headers["x-ojs-error-code"] = code
        headers["x-ojs-error-message"] = text[:_MAX_ERROR_MESSAGE]
        properties = {k: v for k, v in raw.properties.items() if k != _PAYLOAD_KEY}
        properties["application_headers"] = headers
        message_id = properties.get("message_id") or f"delivery-{raw.delivery_tag}"
        logger.error("dead-lettering message %s from queue %r: %s: %s",
                     message_id, queue, code, text)
        try:
            self.connection.ensure_topology(queue)
            self.publish_confirmed(amqp.Message(raw.body, **properties), names.dlx_exchange,
                                   queue, job_id=str(message_id), queue=queue)
        except Exception:
            logger.exception("could not publish message %s to the dead-letter exchange; "
                             "nacking it so the queue's dead-letter routing takes it", message_id)
            self.basic_nack(raw.delivery_tag, multiple=False, requeue=False)
            return
        self.basic_ack(raw.delivery_tag)

    def basic_nack(self, delivery_tag: int, multiple: bool = False, requeue: bool = False) -> None:
        """``Basic.Nack`` (py-amqp only sends ``Basic.Reject``)."""
        self.send_method(spec.Basic.Nack, "Lbb", (delivery_tag, multiple, requeue))

    def basic_reject(self, delivery_tag: int, requeue: bool, argsig: str = "Lb") -> None:
        """Rejections go out as ``Basic.Nack(multiple=false)`` (AMQP-009)."""
        self.basic_nack(delivery_tag, multiple=False, requeue=requeue)


class Connection(pyamqp.Connection):
    """py-amqp connection that knows its OJS binding and the queues it declared."""

    Channel = Channel

    def __init__(self, *args: Any, confirm_publish: bool = False, **kwargs: Any) -> None:
        options = {k: kwargs.pop(k) for k in list(kwargs) if k.startswith("ojs_")}
        self.ojs = Binding.from_options(options)
        #: ``confirm_publish=True`` (kombu's option) also confirms non-job publishes.
        self.ojs_confirm_all = confirm_publish
        self._ojs_declared: set[str] = set()
        super().__init__(*args, confirm_publish=False, **kwargs)

    def ensure_topology(self, queue: str) -> None:
        """Declare the OJS topology of ``queue`` once per connection (lazy and eager paths)."""
        if queue in self._ojs_declared:
            return
        arguments = self.ojs.declare_arguments(queue)
        channel = self.channel()
        try:
            declare_queue_topology(channel, self.ojs.names, queue, arguments)
        finally:
            if channel.is_open:
                channel.close()
        self._ojs_declared.add(queue)

    def forget_topology(self, queue: str | None = None) -> None:
        """Make the next use re-declare ``queue`` (or every queue)."""
        if queue is None:
            self._ojs_declared.clear()
        else:
            self._ojs_declared.discard(queue)


class Transport(pyamqp.Transport):
    """kombu transport ``ojs://``: RabbitMQ through py-amqp, jobs as OJS jobs."""

    Connection = Connection

    def qos_semantics_matches_spec(self, connection: Any) -> bool:
        # Per-consumer prefetch (Basic.Qos global=false) as in the binding's
        # section 5.2; RabbitMQ 4 refuses global QoS on quorum queues.
        return True


class SSLTransport(Transport):
    """``ojss://``: the ``ojs`` transport over TLS (same as ``ojs://`` with ``ssl=True``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.client.ssl:
            self.client.ssl = True


def register_transport() -> None:
    """Make ``ojs://`` and ``ojss://`` broker URLs resolve to this transport."""
    from kombu.transport import TRANSPORT_ALIASES

    TRANSPORT_ALIASES.setdefault("ojs", f"{__name__}:Transport")
    TRANSPORT_ALIASES.setdefault("ojss", f"{__name__}:SSLTransport")

