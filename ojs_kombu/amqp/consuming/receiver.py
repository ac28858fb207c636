"""Receiving OJS jobs on one channel (AMQP-006, sections 5.2, 8 and 9).

Deliveries from an ``ojs.queue.{q}`` queue are validated before kombu sees
them: a message that is not a runnable OJS job is dead-lettered into
``ojs.queue.dlx.{q}`` with ``x-ojs-error-code``/``x-ojs-error-message`` and
never reaches Celery; an expired job is dead-lettered and an early one sent
back to the broker to wait.  What reaches Celery is a
:class:`~ojs_kombu.amqp.consuming.delivery.JobMessage` carrying its decoded payload.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from time import sleep
from typing import Any

import amqp
from amqp import spec
from amqp.exceptions import ConsumerCancelled
from kombu.utils.encoding import safe_repr

from ...spec.decode import decode_job_message
from ...spec.envelope import JobEnvelope
from ...spec.errors import JobRejected, OJSConfigurationError
from ...spec.failures import EXPIRED, Delivered, Happened, JobFailure, decide
from ...spec.strict_input import INVALID_ENVELOPE, INVALID_PAYLOAD
from ...spec.times import format_time
from ..broker.reconnect import DEFAULT_POLICY
from ..job_channel import JobChannel, JobDelivery
from ..wire.frames import UNDECODABLE_HEADER
from ..wire.kombu_seam import set_decoded
from .delivery import JobMessage
from .settle import settle

logger = logging.getLogger(__name__)

#: Key under which a validated job's ``(args, kwargs, embed)`` rides from the
#: consume hook to :meth:`JobReceiver.job_message` (popped there).
_PAYLOAD_KEY = "_ojs_payload"
_DELIVERY_KEY = "_ojs_delivery"
_MAX_ARGSREPR = 1024
#: A consumed job due later than this is sent back to the broker to wait
#: rather than held in the worker's memory.
EARLY_TOLERANCE_S = 0.05


def _argsrepr(args: Any) -> str:
    if not args and type(args) is list:  # a job without arguments: no repr to make
        return "[]"
    text = safe_repr(args)
    return text if len(text) <= _MAX_ARGSREPR else text[:_MAX_ARGSREPR] + "..."


class JobReceiver:
    """The job consumers of one channel of the ``ojs`` transport, and their deliveries
    not yet settled (the consumer readings of :mod:`ojs_kombu.events.metrics`)."""

    def __init__(self, channel: JobChannel) -> None:
        self._channel = channel
        self.reset()

    def reset(self) -> None:
        """The channel was (re)opened: no consumer, no delivery yet."""
        self._qos_set = False
        #: delivery tag -> OJS queue of job deliveries not yet settled (metrics labels)
        self._unsettled: dict[int, str] = {}
        #: the last ``Basic.Qos`` prefetch count and the OJS queues consumed (metrics)
        self.prefetch_count = 0
        self.consumed_queues: set[str] = set()

    def qos(self, prefetch_count: int) -> None:
        """A ``Basic.Qos`` the channel sent."""
        self._qos_set = True
        self.prefetch_count = prefetch_count

    def unacked(self) -> list[str]:
        """The OJS queue of each job delivery not yet settled."""
        return list(self._unsettled.values())

    def settled(self, delivery_tag: int) -> str | None:
        """A delivery was acked or nacked: its OJS queue when it was a job's."""
        return self._unsettled.pop(delivery_tag, None)

    def consume(self, queue: str, no_ack: bool, callback: Callable[[amqp.Message], Any],
                args: tuple[Any, ...], kwargs: dict[str, Any]
                ) -> Callable[[amqp.Message], Any]:
        """The callback ``Basic.Consume`` registers for ``queue``: for an OJS job queue one
        that validates each delivery first (``kwargs`` get an ``on_cancel``)."""
        channel = self._channel
        ojs = channel.ojs
        ojs_queue = ojs.names.queue_from_job_queue(queue)
        if ojs_queue is None:
            return callback
        if no_ack:
            raise OJSConfigurationError(
                f"{queue!r} is an OJS job queue: it is consumed with manual acks "
                "(no_ack=False, AMQP-006)"
            )
        if not self._qos_set:
            logger.warning("consuming %s before Basic.Qos; setting prefetch_count=%d",
                           queue, ojs.settings.default_prefetch)
            channel.basic_qos(0, ojs.settings.default_prefetch, False)
        self.consumed_queues.add(ojs_queue)
        if len(args) < 2 and kwargs.get("on_cancel") is None:  # (arguments, on_cancel)
            kwargs["on_cancel"] = partial(self._on_consumer_cancelled, ojs_queue)
        return self._job_receiver(ojs_queue, callback)

    def job_message(self, raw: amqp.Message) -> JobMessage | None:
        """The :class:`JobMessage` of a validated job delivery (``None``: not one)."""
        payload = raw.properties.pop(_PAYLOAD_KEY, None)
        if payload is None:
            return None
        message = JobMessage(raw, channel=self._channel)
        set_decoded(message, payload)
        message.ojs = raw.properties.pop(_DELIVERY_KEY)
        return message

    def _on_consumer_cancelled(self, queue: str, consumer_tag: str) -> None:
        """``Basic.Cancel`` from the broker (section 10.4, AMQP-027): usually the queue was
        deleted under the consumer.

        Logged and handed to the hook (``consumer_cancelled``, the ``consumer.cancelled`` event);
        then, after the first delay of the reconnection schedule,
        :class:`~amqp.exceptions.ConsumerCancelled` (a recoverable connection
        error) hands over to the reconnection path:
        Celery's consumer (or kombu's ``ConsumerMixin``/``ensure``) reconnects,
        re-declares the queue's whole topology and registers every consumer again
        with the same prefetch.
        """
        delay = DEFAULT_POLICY.delay(1)
        logger.warning("the broker cancelled consumer %s of queue %r (Basic.Cancel: was the "
                       "queue deleted?); re-declaring it and consuming again in %.1fs",
                       consumer_tag, queue, delay)
        self._channel.ojs.hook.consumer_cancelled(
            queue, {"consumer_tag": consumer_tag, "retry_in_ms": round(delay * 1000)})
        self._channel.connection.forget_topology(queue)
        sleep(delay)
        raise ConsumerCancelled(f"consumer {consumer_tag} of queue {queue!r} cancelled by the "
                                "broker", spec.Basic.Cancel)

    def _job_receiver(self, queue: str, callback: Callable[[amqp.Message], Any]
                      ) -> Callable[[amqp.Message], Any]:
        channel = self._channel
        ojs = channel.ojs
        resolve_task = ojs.job_types.task_for
        max_type_map_entries = ojs.settings.max_type_map_entries
        max_job_bytes = ojs.settings.max_job_bytes
        hook = ojs.hook

        def receive_job(raw: amqp.Message) -> Any:
            self._unsettled[raw.delivery_tag] = queue
            hook.message_consumed(queue)
            undecodable = (raw.properties.get("application_headers") or {}).get(
                UNDECODABLE_HEADER)
            if undecodable is not None:
                return self.dead_letter(raw, queue, INVALID_PAYLOAD, "the message's AMQP "
                                        f"properties could not be decoded ({undecodable})")
            try:
                job = decode_job_message(raw.body, raw.properties, resolve_task=resolve_task,
                                         argsrepr=_argsrepr, queue=queue,
                                         max_type_map_entries=max_type_map_entries,
                                         max_job_bytes=max_job_bytes)
            except JobRejected as rejected:
                return self.dead_letter(raw, queue, rejected.code, rejected.message)
            except Exception as exc:  # never let one message stop the worker
                logger.exception("a message on %s could not be decoded; dead-lettering it",
                                 queue)
                return self.dead_letter(raw, queue, INVALID_ENVELOPE,
                                        f"undecodable: {type(exc).__name__}: {exc}")
            delivery = JobDelivery(queue, job.envelope.id, raw.body, dict(raw.properties),
                                   job.envelope.type)
            envelope = job.envelope
            try:
                if self._held_back(envelope, delivery, raw.delivery_tag):
                    return None
            except channel.connection.connection_errors:
                raise
            except Exception as exc:  # never let one message stop the worker
                logger.exception("job %s: could not expire or reschedule it", delivery.job_id)
                return self.dead_letter(raw, queue, INVALID_ENVELOPE, f"unprocessable: {exc}")
            # Scheduled and retried jobs arrive through other exchanges; Celery
            # routes follow-up messages by delivery_info, so show it the OJS route.
            raw.delivery_info["exchange"] = ojs.names.direct_exchange
            raw.delivery_info["routing_key"] = queue
            properties = raw.properties
            properties["application_headers"] = job.headers
            properties["correlation_id"] = job.headers["id"]  # the Celery task id
            if properties.get("priority") is None:  # kombu's producer always sends one: 0
                properties["priority"] = 0
            properties[_PAYLOAD_KEY] = job.payload
            properties[_DELIVERY_KEY] = delivery
            return callback(raw)

        return receive_job

    def _held_back(self, envelope: JobEnvelope, delivery: JobDelivery, delivery_tag: int
                   ) -> bool:
        """Settle a job that must not run now: expired (dead-lettered) or early (sent back
        to wait); ``True`` when it was settled.  The clock is read only for a job that
        has ``expires_at`` or ``scheduled_at``."""
        if envelope.expires_at is None and envelope.scheduled_at is None:
            return False
        now = datetime.now(UTC)
        if envelope.expires_at is not None and envelope.expires_at <= now:
            failure = JobFailure(EXPIRED, EXPIRED, "job expired at "
                                 f"{format_time(envelope.expires_at)} before it started")
            self._settle_now(delivery, delivery_tag, Delivered(Happened.EXPIRED, failure))
            self._channel.ojs.hook.job_expired(delivery.info(), envelope.created_at,
                                               envelope.expires_at)
            return True
        if envelope.scheduled_at is not None:
            early = (envelope.scheduled_at - now).total_seconds()
            if early > EARLY_TOLERANCE_S:
                self._settle_now(delivery, delivery_tag, Delivered(Happened.EARLY, delay_s=early))
                return True
        return False

    def _settle_now(self, delivery: JobDelivery, delivery_tag: int, what: Delivered) -> None:
        """Decide and settle a delivery that never reaches Celery (no retry policy applies)."""
        settle(self._channel, delivery, delivery_tag, decide(what, delivery.attempt))

    def dead_letter(self, raw: amqp.Message, queue: str, code: str, text: str) -> None:
        """Dead-letter a delivery that is not a runnable job, with ``x-ojs-error-*``."""
        properties = dict(raw.properties)
        job_id = str(properties.get("message_id") or f"delivery-{raw.delivery_tag}")
        delivery = JobDelivery(queue, job_id, raw.body, properties)
        try:
            self._settle_now(delivery, raw.delivery_tag,
                             Delivered(Happened.INVALID, JobFailure(code, code, text)))
        except self._channel.connection.connection_errors:
            raise
        except Exception:
            logger.exception("could not dead-letter message %s with its error headers; "
                             "nacking it into its dead-letter queue", job_id)
            self._channel.basic_nack(raw.delivery_tag, multiple=False, requeue=False)
