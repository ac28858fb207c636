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
import threading
from collections.abc import Callable, Sequence
from contextlib import suppress
from datetime import UTC, datetime
from functools import partial
from time import monotonic, sleep
from typing import Any

import amqp
from amqp import spec
from amqp.exceptions import ConsumerCancelled, RecoverableConnectionError
from kombu.transport import pyamqp
from kombu.utils.encoding import safe_repr

from ..events.metrics import track_connection
from ..events.tracing import with_current_trace
from ..spec.decode import decode_job_message
from ..spec.delays import (
    check_schedule_delay,
    retry_delay_ms,
    schedule_levels,
    schedule_routing_key,
)
from ..spec.encode import OutgoingJob, encode_task_message
from ..spec.envelope import JobEnvelope
from ..spec.errors import (
    BatchPublishError,
    JobEncodeError,
    JobNackedError,
    JobRejected,
    JobRoutingError,
    OJSConfigurationError,
    PublishConfirmTimeout,
    QueueNameError,
    UnroutableJobError,
)
from ..spec.failures import EXPIRED, Action, Delivered, Happened, JobFailure, Outcome, decide
from ..spec.naming import TopologyNames
from ..spec.strict_input import INVALID_ENVELOPE, INVALID_PAYLOAD
from ..spec.times import format_time
from ..spec.trace_context import trace_id_of
from .acks import PendingAcks, ack_frames
from .binding import Binding
from .confirms import ConfirmTracker, PendingPublish
from .delivery import JobDelivery, JobMessage
from .frames import UNDECODABLE_HEADER, guarded_frame_handler, locked_frame_writer
from .outcomes import OutcomePublisher
from .publish_frames import PublishFrames
from .read_ahead import LoopReads, LoopWake, ReadAheadTCPTransport
from .reconnect import CONSUMER_CANCELLED, DEFAULT_POLICY
from .reconnect import emit as emit_connection_event
from .settle import settle
from .topology import (
    RETRY_QUEUE_IDLE_MS,
    bind_scheduled_delivery,
    declare_delayed_exchange,
    declare_queue_topology,
    declare_retry_queue,
    declare_schedule_ladder,
    queue_message_count,
)

logger = logging.getLogger(__name__)

#: Key under which a validated job's ``(args, kwargs, embed)`` rides from the
#: consume hook to :meth:`Channel.message_to_python` (popped there).
_PAYLOAD_KEY = "_ojs_payload"
_DELIVERY_KEY = "_ojs_delivery"
_MAX_ARGSREPR = 1024
#: A consumed job due later than this is sent back to the broker to wait
#: rather than held in the worker's memory.
EARLY_TOLERANCE_S = 0.05
#: Publishes of a batch sent before reading confirms (at most twice this in flight).
BATCH_WINDOW = 500
#: Publishes of a batch written to the socket in one write: small enough that the
#: broker starts on a batch while the rest is still being framed (a window in one
#: write left it idle meanwhile, measured about 7 % slower), big enough to spare
#: a syscall per job.
BATCH_WRITE = 64
#: Longest wait for the reply to one declaration.
DECLARE_TIMEOUT_S = 30.0
#: Longest wait at close for the confirms of retries and dead letters in flight.
OUTCOME_CLOSE_WAIT_S = 5.0
#: Runs a :mod:`ojs_kombu.amqp.topology` declaration: ``(declare, *args)``.
Declarer = Callable[..., None]


class _BatchWriter:
    """A batch's ``Basic.Publish`` frames, written to the socket a few at a time.

    py-amqp writes every publish with its own ``sendall``; a batch encodes them
    with its channel's :class:`~ojs_kombu.amqp.publish_frames.PublishFrames` and sends
    every :data:`BATCH_WRITE` of them in one write.
    """

    def __init__(self, connection: Connection, frames: PublishFrames) -> None:
        self._connection = connection
        self._frames = frames
        self._data: list[bytes] = []

    def publish(self, body: bytes, properties: dict[str, Any], exchange: str,
                routing_key: str, mandatory: bool) -> None:
        self._data.append(self._frames.encode(exchange, routing_key, mandatory, body,
                                              properties))

    def flush(self) -> None:
        if self._data:
            self._connection.write_frames(b"".join(self._data))
            self._data.clear()


def job_queue_for(names: TopologyNames, task: str, exchange: str, routing_key: str) -> str:
    """The OJS queue a Celery route points at (AMQP-005: direct exchange, key = queue)."""
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


def _batch_error(tracked: list[PendingPublish], failed: list[PendingPublish],
                 unsent: list[str], limit: float) -> BatchPublishError:
    rejected = {
        p.job_id: (f"returned by the broker ({p.returned}): no queue bound for {p.queue!r}"
                   if p.returned is not None else f"refused by the broker (Basic.Nack), "
                   f"queue {p.queue!r}")
        for p in failed if p.settled
    }
    unconfirmed = tuple(p.job_id for p in failed if not p.settled)
    accepted = tuple(p.job_id for p in tracked if p.settled and not p.nacked
                     and p.returned is None)
    parts = [f"{job_id}: {reason}" for job_id, reason in rejected.items()]
    parts += [f"{job_id}: no confirm within {limit}s (may or may not be enqueued)"
              for job_id in unconfirmed]
    parts += [f"{job_id}: not sent (the broker stopped confirming)" for job_id in unsent]
    rejected.update((job_id, "not sent (the broker stopped confirming)") for job_id in unsent)
    total = len(tracked) + len(unsent)
    return BatchPublishError(
        f"{len(failed) + len(unsent)} of {total} jobs were not accepted: " + "; ".join(parts),
        rejected=rejected, unconfirmed=unconfirmed, accepted=accepted,
    )


def _argsrepr(args: Any) -> str:
    text = safe_repr(args)
    return text if len(text) <= _MAX_ARGSREPR else text[:_MAX_ARGSREPR] + "..."


class Channel(pyamqp.Channel):
    """pyamqp channel that maps Celery task messages onto OJS jobs."""

    connection: Connection

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ojs_reset()

    #: Bumped whenever the channel is reset: a delivery tag from an earlier
    #: generation must not be settled on it.
    generation = 0

    def _ojs_reset(self) -> None:
        self.generation += 1
        self._ojs_confirming = False
        self._ojs_confirms = ConfirmTracker()
        self._ojs_qos_set = False
        #: delivery tag -> OJS queue of job deliveries not yet settled (metrics labels)
        self._ojs_unsettled: dict[int, str] = {}
        #: the last ``Basic.Qos`` prefetch count and the OJS queues consumed (metrics)
        self.ojs_prefetch_count = 0
        self.ojs_consumed_queues: set[str] = set()
        #: every delivery that needs an ack, and the acks the event loop collected
        self._ojs_acks = PendingAcks()
        self._ojs_frames: PublishFrames | None = None

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
            self._ojs_confirms.skip()  # the broker numbers every publish of the channel
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
        if "traceparent" not in headers:
            headers = with_current_trace(headers)
        job = encode_task_message(
            body=msg.body,
            content_type=msg.properties.get("content_type"),
            properties=msg.properties,
            headers=headers,
            job_type=ojs.job_types.type_for(task),
            queue=queue,
            retry_policy=ojs.retry_policy_for(task) if ojs.retry_policy_for else None,
            max_job_bytes=ojs.settings.max_job_bytes,
        )
        self.publish_job(job, timeout=timeout, confirm_timeout=confirm_timeout)

    def publish_job(self, job: OutgoingJob, *, timeout: float | None = None,
                    confirm_timeout: float | None = None) -> None:
        """Publish one encoded job, confirmed and ``mandatory``, and return once the
        broker took it: ``apply_async`` through kombu's producer and its direct path
        (:mod:`ojs_kombu.celery.publish`) both end here."""
        ojs = self.ojs
        queue = job.queue
        self.connection.ensure_topology(queue)
        message = amqp.Message(job.body, **job.properties)
        self._announce(job)
        if job.delay_ms > 0:
            self.publish_scheduled(message, queue, job.delay_ms, job_id=job.job_id,
                                   timeout=timeout, confirm_timeout=confirm_timeout)
        else:  # under the queue's backpressure strategy (ojs_kombu.spec.backpressure)
            ojs.backpressure.publish(
                queue, job.job_id, job.job_type, lambda: self.publish_confirmed(
                    message, ojs.names.direct_exchange, queue, job_id=job.job_id, queue=queue,
                    timeout=timeout, confirm_timeout=confirm_timeout),
                self.connection.queue_depth)
        ojs.events.metrics.published.add(1, {"queue": queue})

    def _announce(self, job: OutgoingJob) -> None:
        """``job.enqueued``/``job.scheduled``, before the publish: a worker may start the
        job before the confirm arrives, and a job's events come in lifecycle order."""
        self.ojs.events.enqueued(
            job.job_id, job.job_type, job.queue, priority=job.properties.get("priority"),
            delay_s=job.delay_ms / 1000,
            trace_id=trace_id_of(job.properties["application_headers"].get("x-ojs-trace-id")))

    def publish_scheduled(self, message: amqp.Message, queue: str, delay_ms: int, *,
                          job_id: str, timeout: float | None = None,
                          confirm_timeout: float | None = None) -> None:
        """Publish a job that the broker holds for ``delay_ms`` (AMQP-022, section 9)."""
        exchange, routing_key, mandatory = self._schedule_route(message.properties, job_id,
                                                                queue, delay_ms)
        self.publish_confirmed(message, exchange, routing_key, job_id=job_id, queue=queue,
                               mandatory=mandatory, timeout=timeout,
                               confirm_timeout=confirm_timeout)

    def _job_queue_for(self, task: str, exchange: str, routing_key: str) -> str:
        return job_queue_for(self.ojs.names, task, exchange, routing_key)

    def publish_confirmed(
        self,
        message: amqp.Message,
        exchange: str,
        routing_key: str,
        *,
        job_id: str,
        queue: str,
        mandatory: bool = True,
        timeout: float | None = None,
        confirm_timeout: float | None = None,
        measure: bool = True,
    ) -> None:
        """Publish with ``mandatory=True`` and wait for the broker's confirm (AMQP-014..016)."""
        started = monotonic()
        pending = self._publish_tracked(message, exchange, routing_key, mandatory, timeout,
                                        confirm_timeout, job_id=job_id, queue=queue)
        if measure:
            self.ojs.events.metrics.confirm_latency.record(monotonic() - started)
        if pending.returned is not None:
            self.connection.forget_topology(queue)  # the next publish re-declares it
            raise UnroutableJobError(
                f"job {job_id} for queue {queue!r} was returned by the broker "
                f"({pending.returned}): no queue is bound to {exchange!r} with routing key "
                f"{routing_key!r}; it was not enqueued",
                job_id=job_id, queue=queue,
            )
        if pending.nacked:
            if exchange == self.ojs.names.direct_exchange:  # QueueFullError when it is full
                raise self.ojs.backpressure.nack_error(queue, job_id, self.connection.queue_depth)
            raise JobNackedError(
                f"job {job_id} for queue {queue!r} was refused by the broker (Basic.Nack); "
                "it was not enqueued", job_id=job_id, queue=queue,
            )

    def _publish_tracked(self, message: amqp.Message, exchange: str, routing_key: str,
                         mandatory: bool, timeout: float | None, confirm_timeout: float | None,
                         *, job_id: str, queue: str) -> PendingPublish:
        """Publish on this channel in confirm mode and block until the publish is settled."""
        self._confirm_mode()
        tag, pending = self._ojs_confirms.track(job_id, queue)
        try:
            self._send_publish(message, exchange, routing_key, mandatory, timeout)
            self._wait_settled(pending, confirm_timeout)
        finally:
            self._ojs_confirms.forget(tag, pending)
        return pending

    def publish_many_confirmed(self, messages: list[tuple[amqp.Message, str, str]],
                               confirm_timeout: float | None = None) -> list[bool]:
        """Pipelined publishes (not mandatory) and one wait for all their confirms;
        ``True`` for each message the broker accepted."""
        self._confirm_mode()
        tracked = []
        try:
            for message, exchange, routing_key in messages:
                tag, pending = self._ojs_confirms.track("", exchange)
                tracked.append((tag, pending))
                self._send_publish(message, exchange, routing_key, False, None)
            for _, pending in tracked:
                self._wait_settled(pending, confirm_timeout)
        finally:
            for tag, pending in tracked:
                self._ojs_confirms.forget(tag, pending)
        return [not pending.nacked for _, pending in tracked]

    def publish_jobs(self, jobs: Sequence[OutgoingJob], *, confirm_timeout: float | None = None,
                     window: int = BATCH_WINDOW) -> None:
        """Batch PUSH (section 5): pipelined, mandatory publishes on this one channel.

        Before sending, a bounded ``reject``/``block`` queue that cannot take the
        batch's jobs at its current depth (or whose circuit breaker is open)
        refuses the whole batch: :class:`BatchQueueFullError`, nothing sent
        (backpressure section 9.3).  At most ``2 * window`` publishes are in
        flight; returns once the broker confirmed every job, else raises
        :class:`BatchPublishError` (:class:`BatchQueueFullError` when a full queue
        nacked some) naming each job that was refused, returned or left
        unconfirmed (no partial success goes unreported, nothing is retried).
        """
        self._confirm_mode()
        ojs = self.ojs
        names = ojs.names
        connection = self.connection
        tracker = self._ojs_confirms
        tracked: list[tuple[int, PendingPublish]] = []
        limit = confirm_timeout or ojs.settings.confirm_timeout
        if not connection:
            raise RecoverableConnectionError("publish_jobs: connection closed")
        for queue in dict.fromkeys(job.queue for job in jobs):
            connection.ensure_topology(queue)  # before its depth is read
        admission = ojs.backpressure.admit_batch(jobs, connection.queue_depth)
        writer = _BatchWriter(connection, self._publish_frames())
        try:
            try:
                for index, job in enumerate(jobs):
                    queue = job.queue
                    exchange, routing_key, mandatory = names.direct_exchange, queue, True
                    if job.delay_ms > 0:
                        exchange, routing_key, mandatory = self._schedule_route(
                            job.properties, job.job_id, queue, job.delay_ms)
                    self._announce(job)
                    tracked.append(tracker.track(job.job_id, queue))
                    writer.publish(job.body, job.properties, exchange, routing_key, mandatory)
                    window_full = index % window == window - 1
                    if window_full or index % BATCH_WRITE == BATCH_WRITE - 1:
                        writer.flush()
                    if window_full and not self._wait_outstanding(window, limit):
                        break  # the broker stopped confirming: send no more
                writer.flush()
                self._wait_outstanding(0, limit)
            finally:
                for tag, pending in tracked:
                    tracker.forget(tag, pending)
            outcome = [p for _, p in tracked]
            nacked = {p.job_id for p in outcome if p.nacked}
            admission.settle(nacked, connection.queue_depth)
        finally:
            admission.release()  # no answer from the broker: no verdict for the breakers
        published = ojs.events.metrics.published
        for pending in outcome:
            if pending.settled and not pending.nacked and pending.returned is None:
                published.add(1, {"queue": pending.queue})
        failed = [p for p in outcome if not p.settled or p.nacked or p.returned is not None]
        unsent = [job.job_id for job in jobs[len(outcome):]]
        if failed or unsent:
            raise ojs.backpressure.batch_error(jobs, _batch_error(outcome, failed, unsent, limit),
                                               nacked, connection.queue_depth)

    def _schedule_route(self, properties: dict[str, Any], job_id: str, queue: str,
                        delay_ms: int) -> tuple[str, str, bool]:
        """:meth:`schedule_route`, declared at once (a producer may wait for replies)."""
        exchange, routing_key, mandatory, prepare = self.schedule_route(
            properties, job_id, queue, delay_ms)
        prepare(None)
        return exchange, routing_key, mandatory

    def _wait_outstanding(self, most: int, limit: float) -> bool:
        """Read confirms until at most ``most`` tracked publishes are unconfirmed;
        ``False`` when ``limit`` seconds passed first."""
        tracker = self._ojs_confirms
        return self._drain_until(lambda: tracker.outstanding <= most, limit)

    def _drain_until(self, done: Callable[[], bool], limit: float) -> bool:
        """Read incoming frames until ``done()``; ``False`` when ``limit`` seconds passed
        first."""
        deadline = monotonic() + limit
        self.connection.flush_acks_in_loop()  # no ack waits behind a confirm
        self.connection.ojs_outcomes.flush()
        while not done():
            remaining = deadline - monotonic()
            if remaining <= 0:
                return False
            try:
                self.connection.drain_events(timeout=remaining)
            except TimeoutError:
                continue
        return True

    def _send_publish(self, message: amqp.Message, exchange: str, routing_key: str,
                      mandatory: bool, timeout: float | None) -> None:
        """``Basic.Publish`` in one write, encoded by :mod:`ojs_kombu.amqp.publish_frames`.

        py-amqp polls the socket before every publish for a pending
        ``connection.blocked``; a confirmed publish reads every incoming frame
        right afterwards anyway, so that poll is pure cost on this path.  Like
        every kombu channel, this one is used by one thread at a time.
        """
        connection = self.connection
        if not connection:
            raise RecoverableConnectionError("basic_publish: connection closed")
        data = self._publish_frames().encode(exchange, routing_key, mandatory, message.body,
                                             message.properties)
        try:
            with connection.transport.having_timeout(timeout):
                connection.write_frames(data)
        except TimeoutError:
            raise RecoverableConnectionError("basic_publish: timed out") from None

    def _publish_frames(self) -> PublishFrames:
        """This channel's publish encoder, shared by single and batch publishes (its
        method frames are cached per destination)."""
        if self._ojs_frames is None:
            self._ojs_frames = PublishFrames(self.channel_id, self.connection.frame_max)
        return self._ojs_frames

    def _confirm_mode(self) -> None:
        if self._ojs_confirming:
            return
        self.confirm_select()
        self._confirm_selected = True
        self.events["basic_ack"].add(self._on_confirm_ack)
        self.events["basic_nack"].add(self._on_confirm_nack)
        self.events["basic_return"].add(self._on_return)
        self._ojs_confirming = True
        self._ojs_confirms = ConfirmTracker()

    def _on_confirm_ack(self, delivery_tag: int, multiple: bool) -> None:
        self._ojs_confirms.settle(delivery_tag, multiple, nacked=False)

    def _on_confirm_nack(self, delivery_tag: int, multiple: bool) -> None:
        self._ojs_confirms.settle(delivery_tag, multiple, nacked=True)

    def _on_return(self, exc: Exception, exchange: str, routing_key: str,
                   message: amqp.Message) -> None:
        message_id = message.properties.get("message_id")
        self.ojs.events.metrics.returned.add(1, {"queue": routing_key})
        if not self._ojs_confirms.returned(message_id, str(exc)):
            logger.warning("message %s returned by the broker from exchange %r key %r: %s",
                           message_id, exchange, routing_key, exc)

    def _wait_settled(self, pending: PendingPublish, confirm_timeout: float | None) -> None:
        limit = confirm_timeout or self.ojs.settings.confirm_timeout
        if not self._drain_until(lambda: pending.settled, limit):
            raise PublishConfirmTimeout(
                f"no publisher confirm for job {pending.job_id} (queue {pending.queue!r}) "
                f"within {limit}s: it may or may not be enqueued",
                job_id=pending.job_id, queue=pending.queue,
            )

    # -- consume -----------------------------------------------------------

    def basic_qos(self, prefetch_size: int, prefetch_count: int, a_global: bool,
                  *args: Any, **kwargs: Any) -> Any:
        self._ojs_qos_set = True
        self.ojs_prefetch_count = prefetch_count
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
            self.ojs_consumed_queues.add(ojs_queue)
            if len(args) < 2 and kwargs.get("on_cancel") is None:  # (arguments, on_cancel)
                kwargs["on_cancel"] = partial(self._on_consumer_cancelled, ojs_queue)
        return super().basic_consume(queue, consumer_tag, no_local, no_ack, exclusive, nowait,
                                     callback, *args, **kwargs)

    def ojs_unacked(self) -> list[str]:
        """The OJS queue of each job delivery not yet settled (``ojs_kombu.events.metrics``)."""
        return list(self._ojs_unsettled.values())

    def _on_consumer_cancelled(self, queue: str, consumer_tag: str) -> None:
        """``Basic.Cancel`` from the broker (section 10.4, AMQP-027): usually the queue was
        deleted under the consumer.

        Logged and emitted as ``consumer.cancelled`` (:func:`ojs_kombu.amqp.reconnect.subscribe`);
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
        emit_connection_event(CONSUMER_CANCELLED, queue, self.ojs.events.source, queue=queue,
                              consumer_tag=consumer_tag, retry_in_ms=round(delay * 1000))
        self.connection.forget_topology(queue)
        sleep(delay)
        raise ConsumerCancelled(f"consumer {consumer_tag} of queue {queue!r} cancelled by the "
                                "broker", spec.Basic.Cancel)

    def _job_receiver(self, queue: str, callback: Callable[[amqp.Message], Any]
                      ) -> Callable[[amqp.Message], Any]:
        resolve_task = self.ojs.job_types.task_for
        events, labels = self.ojs.events, {"queue": queue}

        def receive_job(raw: amqp.Message) -> Any:
            self._ojs_unsettled[raw.delivery_tag] = queue
            events.metrics.consumed.add(1, labels)  # metrics may be swapped while consuming
            undecodable = (raw.properties.get("application_headers") or {}).get(
                UNDECODABLE_HEADER)
            if undecodable is not None:
                return self.dead_letter(raw, queue, INVALID_PAYLOAD, "the message's AMQP "
                                        f"properties could not be decoded ({undecodable})")
            try:
                job = decode_job_message(raw.body, raw.properties, resolve_task=resolve_task,
                                         argsrepr=_argsrepr, queue=queue)
            except JobRejected as rejected:
                return self.dead_letter(raw, queue, rejected.code, rejected.message)
            delivery = JobDelivery(queue, job.envelope.id, raw.body, dict(raw.properties),
                                   job.envelope.type)
            envelope = job.envelope
            try:
                if self._held_back(envelope, delivery, raw.delivery_tag):
                    return None
            except self.connection.connection_errors:
                raise
            except Exception as exc:  # never let one message stop the worker
                logger.exception("job %s: could not expire or reschedule it", delivery.job_id)
                return self.dead_letter(raw, queue, INVALID_ENVELOPE, f"unprocessable: {exc}")
            # Scheduled and retried jobs arrive through other exchanges; Celery
            # routes follow-up messages by delivery_info, so show it the OJS route.
            raw.delivery_info["exchange"] = self.ojs.names.direct_exchange
            raw.delivery_info["routing_key"] = queue
            properties = raw.properties
            properties["application_headers"] = job.headers
            properties["correlation_id"] = envelope.id
            properties[_PAYLOAD_KEY] = job.payload
            properties[_DELIVERY_KEY] = delivery
            return callback(raw)

        return receive_job

    def message_to_python(self, raw_message: amqp.Message) -> Any:
        payload = raw_message.properties.pop(_PAYLOAD_KEY, None)
        if payload is None:
            return self.Message(raw_message, channel=self)
        message = JobMessage(raw_message, channel=self)
        message._decoded_cache = payload
        message.ojs = raw_message.properties.pop(_DELIVERY_KEY)
        return message

    # -- outcomes (sections 5.4, 5.5, 8, 9: ojs_kombu.amqp.settle) -----------------

    def settle_job(self, delivery: JobDelivery, delivery_tag: int, outcome: Outcome,
                   on_settled: Callable[[], None] | None = None) -> None:
        """Carry out a decided outcome for one delivery of this channel; never waits."""
        settle(self, delivery, delivery_tag, outcome, on_settled)

    def retry_job(self, delivery: JobDelivery, delivery_tag: int, failure: JobFailure,
                  delay_s: float, timeout: float | None = None) -> int:
        """Retry ``delivery`` and wait until the broker confirmed the copy (for callers
        outside a worker's loop, such as ``ojs-kombu conformance``); returns the delay
        queue's delay in ms."""
        done: list[bool] = []
        self.settle_job(delivery, delivery_tag, Outcome(Action.RETRY, failure, delay_s),
                        lambda: done.append(True))
        limit = timeout or self.ojs.settings.confirm_timeout
        if not self._drain_until(lambda: bool(done), limit):
            raise PublishConfirmTimeout(f"no confirm for the retry of job {delivery.job_id} "
                                        f"within {limit}s", job_id=delivery.job_id,
                                        queue=delivery.queue)
        return retry_delay_ms(delay_s)

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
            self.ojs.events.expired(delivery.info(), envelope.created_at, envelope.expires_at)
            return True
        if envelope.scheduled_at is not None:
            early = (envelope.scheduled_at - now).total_seconds()
            if early > EARLY_TOLERANCE_S:
                self._settle_now(delivery, delivery_tag, Delivered(Happened.EARLY, delay_s=early))
                return True
        return False

    def _settle_now(self, delivery: JobDelivery, delivery_tag: int, what: Delivered) -> None:
        """Decide and settle a delivery that never reaches Celery (no retry policy applies)."""
        self.settle_job(delivery, delivery_tag, decide(what, delivery.attempt))

    def schedule_route(self, properties: dict[str, Any], job_id: str, queue: str,
                       delay_ms: int) -> tuple[str, str, bool, Callable[[Any], None]]:
        """Exchange, routing key and ``mandatory`` of a job due in ``delay_ms``, and what
        declares its way there (given a declaring function, ``None``: at once): the
        delayed exchange when configured (``x-delay`` added to ``properties``), else
        the schedule ladder."""
        try:
            check_schedule_delay(delay_ms)
        except ValueError as exc:
            raise JobEncodeError(f"job {job_id}: {exc}", job_id=job_id, queue=queue) from None
        names, connection = self.ojs.names, self.connection
        if self.ojs.settings.delayed_exchange:
            properties.setdefault("application_headers", {})["x-delay"] = delay_ms
            # The plugin routes only when the delay is over: mandatory would always return.
            return (names.delayed_exchange, queue, False,
                    lambda via: connection.ensure_delayed_exchange(queue))
        entry = names.schedule_exchange(schedule_levels(delay_ms)[0])
        return (entry, schedule_routing_key(delay_ms, queue), True,
                lambda via: connection.ensure_schedule(queue, via))

    def dead_letter(self, raw: amqp.Message, queue: str, code: str, text: str) -> None:
        """Dead-letter a delivery that is not a runnable job, with ``x-ojs-error-*``."""
        properties = dict(raw.properties)
        job_id = str(properties.get("message_id") or f"delivery-{raw.delivery_tag}")
        delivery = JobDelivery(queue, job_id, raw.body, properties)
        try:
            self._settle_now(delivery, raw.delivery_tag,
                             Delivered(Happened.INVALID, JobFailure(code, code, text)))
        except self.connection.connection_errors:
            raise
        except Exception:
            logger.exception("could not dead-letter message %s with its error headers; "
                             "nacking it into its dead-letter queue", job_id)
            self.basic_nack(raw.delivery_tag, multiple=False, requeue=False)

    def _on_basic_deliver(self, consumer_tag: str, delivery_tag: int, redelivered: bool,
                          exchange: str, routing_key: str, msg: amqp.Message) -> None:
        if consumer_tag not in self.no_ack_consumers:
            self._ojs_acks.delivered(delivery_tag)
        connection = self.connection
        if connection is not None and connection.ojs_jobs_run_in_loop:
            # With the solo pool the job runs right here: the acks collected so far
            # go first, so a finished job's ack never waits for the next job.
            connection.flush_acks_in_loop()
        super()._on_basic_deliver(consumer_tag, delivery_tag, redelivered, exchange,
                                  routing_key, msg)

    def basic_get(self, queue: str = "", no_ack: bool = False, argsig: str = "Bsb"
                  ) -> amqp.Message | None:
        message = super().basic_get(queue, no_ack, argsig)
        if message is not None and not no_ack:
            self._ojs_acks.delivered(message.delivery_tag)
        return message

    def basic_nack(self, delivery_tag: int, multiple: bool = False, requeue: bool = False) -> None:
        """``Basic.Nack`` (py-amqp only sends ``Basic.Reject``)."""
        connection = self.connection
        if connection is not None:
            connection.flush_acks_in_loop()  # a multiple nack must not overtake an ack
        self.send_method(spec.Basic.Nack, "Lbb", (delivery_tag, multiple, requeue))
        self._ojs_acks.settled(delivery_tag, multiple)
        queue = self._ojs_unsettled.pop(delivery_tag, None)
        if queue is not None:
            self.ojs.events.metrics.nacked.add(1, {"queue": queue})

    def basic_ack(self, delivery_tag: int, multiple: bool = False, argsig: str = "Lb") -> None:
        """From the event loop's thread the ack is collected and written with the others of
        the same loop iteration (:meth:`Connection.flush_acks`); elsewhere at once."""
        connection = self.connection
        if connection is None:  # closed: py-amqp raises its connection error
            return super().basic_ack(delivery_tag, multiple, argsig)
        queue = self._ojs_unsettled.pop(delivery_tag, None)
        if queue is not None:
            self.ojs.events.metrics.acked.add(1, {"queue": queue})
        if connection.ojs_loop_thread == threading.get_ident():
            if not multiple:
                if self._ojs_acks.ack(delivery_tag):
                    connection.ojs_ack_channels.append(self)
                return None
            self.flush_acks()
        super().basic_ack(delivery_tag, multiple, argsig)
        self._ojs_acks.settled(delivery_tag, multiple)
        return None

    def flush_acks(self) -> None:
        """Write the collected acks, in one write (from the event loop's thread only:
        the write does not take py-amqp's frame lock)."""
        connection = self.connection
        if self._ojs_acks and connection is not None:
            frames = self._ojs_acks.take(connection.ojs.settings.acks == "multiple")
            connection.write_frames(ack_frames(self.channel_id, frames))

    def queue_purge(self, queue: str = "", *args: Any, **kwargs: Any) -> Any:
        """``celery purge -Q email`` names the Celery queue: purge its job queue
        ``ojs.queue.email`` when that exists.  Other names are purged as given."""
        names = self.ojs.names
        with suppress(QueueNameError, amqp.exceptions.NotFound):
            ojs_queue = names.ojs_queue(queue)
            if names.job_queue(ojs_queue) != queue:
                self.connection.queue_depth(ojs_queue)  # NotFound: no such job queue
                queue = names.job_queue(ojs_queue)
        return super().queue_purge(queue, *args, **kwargs)

    def close(self, *args: Any, **kwargs: Any) -> Any:
        connection = self.connection
        if (self._ojs_acks and self.is_open and connection is not None
                and connection.transport is not None):
            self.flush_acks()
        return super().close(*args, **kwargs)

    def basic_reject(self, delivery_tag: int, requeue: bool, argsig: str = "Lb") -> None:
        """Rejections go out as ``Basic.Nack(multiple=false)`` (AMQP-009)."""
        self.basic_nack(delivery_tag, multiple=False, requeue=requeue)


class Connection(pyamqp.Connection):
    """py-amqp connection that knows its OJS binding and the queues it declared."""

    Channel = Channel

    def __init__(self, *args: Any, confirm_publish: bool = False, **kwargs: Any) -> None:
        options = {k: kwargs.pop(k) for k in list(kwargs) if k.startswith("ojs_")}
        self.ojs = Binding.from_options(options)
        self._ojs_connect_args = (args, {**kwargs, "ojs_binding": self.ojs})
        #: ``confirm_publish=True`` (kombu's option) also confirms non-job publishes.
        self.ojs_confirm_all = confirm_publish
        self._ojs_declared: set[str] = set()
        self._ojs_scheduled: set[str] = set()
        self._ojs_ladder = False
        self._ojs_retry_declared: dict[tuple[str, int], float] = {}
        #: The thread of the event loop this connection is registered with: its acks
        #: are collected per loop iteration (:meth:`flush_acks`).
        self.ojs_loop_thread: int | None = None
        #: Channels holding collected acks.
        self.ojs_ack_channels: list[Channel] = []
        #: Jobs run inside their delivery (Celery's solo pool; set by the Celery wiring):
        #: collected acks are written before each delivery.
        self.ojs_jobs_run_in_loop = False
        self._ojs_loop: Any = None
        #: Every write of this connection takes it (py-amqp's frame writer too): green
        #: pools write from many greenlets.  Reentrant: an outcome is numbered and
        #: written under it.
        self.ojs_write_lock = threading.RLock()
        super().__init__(*args, confirm_publish=False, **kwargs)
        self.frame_handler_cls = guarded_frame_handler
        self.frame_writer_cls = locked_frame_writer
        #: Retries, dead letters and reschedules of this connection's deliveries.
        self.ojs_outcomes = OutcomePublisher(self, lambda: self.frame_max)
        self._ojs_loop_wake: LoopWake | None = None
        track_connection(self)

    def join_loop_wake(self, wake: LoopWake) -> None:
        """Frames this connection reads ahead in the event loop wake it through ``wake``
        (:mod:`ojs_kombu.amqp.read_ahead`); closed with the connection or the loop."""
        self._close_loop_wake()
        self._ojs_loop_wake = wake
        self.transport.loop_wake = wake.wake

    def _close_loop_wake(self) -> None:
        wake, self._ojs_loop_wake = self._ojs_loop_wake, None
        if wake is not None:
            wake.close()

    def Transport(self, host: str, connect_timeout: float | None, ssl: Any = False,
                  read_timeout: float | None = None, write_timeout: float | None = None,
                  **kwargs: Any) -> Any:
        """py-amqp's socket transport (py-amqp passes the first five positionally);
        over plain TCP the one that reads ahead (:mod:`ojs_kombu.amqp.read_ahead`)."""
        if ssl:
            return super().Transport(host, connect_timeout, ssl, read_timeout, write_timeout,
                                     **kwargs)
        return ReadAheadTCPTransport(host, connect_timeout=connect_timeout,
                                     read_timeout=read_timeout, write_timeout=write_timeout,
                                     **kwargs)

    def register_with_loop(self, loop: Any) -> None:
        """Collect acks made in ``loop``'s thread and write them once per loop iteration.

        Called where the loop runs (Celery registers its connection from the loop's
        thread); the hub's ``on_tick`` runs after the callbacks that ack (Celery's
        ``call_soon``) and before the loop polls again.  When the hub closes or
        resets (shutdown, connection error), what was collected is written and acks
        go out one by one again.
        """
        self.unregister_from_loop()
        self.ojs_loop_thread = threading.get_ident()
        self._ojs_loop = loop
        loop.on_tick.add(self.flush_acks)
        loop.on_close.add(self._on_loop_closed)

    def unregister_from_loop(self) -> None:
        loop, self._ojs_loop = self._ojs_loop, None
        if loop is not None:
            loop.on_tick.discard(self.flush_acks)
            loop.on_close.discard(self._on_loop_closed)
        self.ojs_loop_thread = None

    def _on_loop_closed(self, _loop: Any) -> None:
        self.unregister_from_loop()
        self._write_collected_acks("the event loop closed")

    def _write_collected_acks(self, why: str) -> None:
        """Last chance for the collected acks; a connection that cannot take them any
        more redelivers those jobs anyway."""
        if not self.ojs_ack_channels:
            return
        try:
            if self.connected:
                self.flush_acks()
        except Exception:
            logger.warning("could not write %d collected ack(s) as %s",
                           sum(len(c._ojs_acks) for c in self.ojs_ack_channels), why,
                           exc_info=True)
        finally:
            self.ojs_ack_channels.clear()

    def flush_acks(self) -> None:
        """Write every ack collected since the last flush."""
        channels = self.ojs_ack_channels
        while channels:
            channel = channels.pop()
            if channel.is_open:
                channel.flush_acks()

    def write_frames(self, data: bytes) -> None:
        """Frames ojs_kombu encoded itself (publishes, collected acks), in one write,
        counted as py-amqp counts its own writes: its heartbeat check reads
        ``bytes_sent`` to know whether anything went out since the last tick."""
        with self.ojs_write_lock:
            self.transport.write(data)
            self.bytes_sent += 1

    def flush_acks_in_loop(self) -> None:
        """:meth:`flush_acks` if called from the event loop's thread (before an ack or nack
        that must not overtake them, before a job starts, before a blocking wait)."""
        if self.ojs_ack_channels and self.ojs_loop_thread == threading.get_ident():
            self.flush_acks()

    def close(self, *args: Any, **kwargs: Any) -> Any:
        self.unregister_from_loop()
        self._close_loop_wake()
        self._settle_outcomes(OUTCOME_CLOSE_WAIT_S)
        self._write_collected_acks("the connection closed")
        self.ojs_outcomes.reset()
        return super().close(*args, **kwargs)

    def collect(self) -> None:
        self.ojs_outcomes.reset()  # lost: the broker delivers those jobs again
        self._close_loop_wake()
        super().collect()

    def drain_events(self, timeout: float | None = None) -> Any:
        """py-amqp's, first publishing again the outcomes whose backoff is over, for
        loops without kombu's hub (gevent's and eventlet's); with a hub its tick does
        (:meth:`Transport.register_with_event_loop`)."""
        if self._ojs_loop is None:
            self.ojs_outcomes.run_due()
        return super().drain_events(timeout=timeout)

    def _settle_outcomes(self, limit: float) -> None:
        """On close, read confirms for outcomes in flight for up to ``limit`` seconds, so
        their deliveries are acked; those still unsettled stay unacked and the broker
        delivers them again."""
        outcomes = self.ojs_outcomes
        if not outcomes.in_flight or not self.connected:
            return
        deadline = monotonic() + limit
        try:
            outcomes.flush()
            while outcomes.in_flight and monotonic() < deadline:
                outcomes.run_due()
                with suppress(TimeoutError):
                    super().drain_events(timeout=min(0.2, max(deadline - monotonic(), 0.01)))
        except Exception as exc:
            logger.warning("stopped waiting for %d retries or dead letters at close: %r",
                           outcomes.in_flight, exc)
        if outcomes.in_flight:
            logger.warning("%d jobs whose retry or dead letter was not confirmed by close "
                           "stay in their queues; the broker delivers them again",
                           outcomes.in_flight)

    def ensure_topology(self, queue: str, via: Declarer | None = None) -> None:
        """Declare the OJS topology of ``queue`` once per connection (lazy and eager paths).

        ``via`` runs the declarations another way (the outcome channel's, without
        waiting for replies); by default on a channel of their own, waiting.
        """
        if queue in self._ojs_declared:
            return
        (via or self._declare_with)(declare_queue_topology, queue,
                                    self.ojs.declare_arguments(queue))
        self._ojs_declared.add(queue)

    def ensure_retry_queue(self, queue: str, delay_ms: int, via: Declarer | None = None) -> None:
        """Declare ``ojs.queue.retry.{queue}.{delay_ms}``; re-declared while in use so that
        its ``x-expires`` (idle expiry) never removes it under waiting jobs."""
        key = (queue, delay_ms)
        declared = self._ojs_retry_declared.get(key)
        if declared is not None and monotonic() - declared < RETRY_QUEUE_IDLE_MS / 2000:
            return
        (via or self._declare_with)(declare_retry_queue, queue, delay_ms,
                                    self.ojs.declare_arguments(queue))
        self._ojs_retry_declared[key] = monotonic()

    def ensure_schedule(self, queue: str, via: Declarer | None = None) -> None:
        """The scheduling ladder (once per connection) and ``queue``'s way out of it."""
        if queue in self._ojs_scheduled:
            return
        self.ensure_topology(queue, via)
        declare = via or self._declare_with
        if not self._ojs_ladder:
            declare(declare_schedule_ladder, self.ojs.settings.schedule_queue_arguments)
            self._ojs_ladder = True
        declare(bind_scheduled_delivery, queue)
        self._ojs_scheduled.add(queue)

    def ensure_delayed_exchange(self, queue: str) -> None:
        """``ojs.exchange.delayed`` bound to ``queue``, declared over a connection of its own:
        without the plugin RabbitMQ closes the whole connection (503), and this one must
        survive to report it and publish on."""
        if queue in self._ojs_scheduled:
            return
        self.ensure_topology(queue)
        args, kwargs = self._ojs_connect_args
        probe = type(self)(*args, **kwargs)
        probe.connect()
        try:
            probe._declare_with(declare_delayed_exchange, queue)
        finally:
            with suppress(Exception):
                probe.close()
        self._ojs_scheduled.add(queue)

    def _declare_with(self, declare: Callable[..., None], *args: Any) -> None:
        """Run ``declare`` on a channel of its own, with a blocking socket.

        In a worker's main process the socket belongs to the event loop and is
        non-blocking; declarations are synchronous RPCs and must wait for replies.
        """
        sock = self.transport.sock
        previous = sock.gettimeout()
        sock.settimeout(DECLARE_TIMEOUT_S)
        try:
            channel = self.channel()
            try:
                declare(channel, self.ojs.names, *args)
            except BaseException:
                with suppress(Exception):  # the broker may have closed it: keep the cause
                    if channel.is_open:
                        channel.close()
                raise
            channel.close()
        finally:
            with suppress(OSError):
                sock.settimeout(previous)

    def queue_depth(self, queue: str) -> int | None:
        """Ready jobs in ``ojs.queue.{queue}`` (a passive declare on a channel of its own)."""
        counts: list[int] = []
        self._declare_with(lambda channel, names: counts.append(
            queue_message_count(channel, names, queue)))
        return counts[0] if counts else None

    def forget_topology(self, queue: str | None = None) -> None:
        """Make the next use re-declare ``queue`` (or every queue)."""
        if queue is None:
            self._ojs_declared.clear()
            self._ojs_scheduled.clear()
            self._ojs_ladder = False
            self._ojs_retry_declared.clear()
        else:
            self._ojs_declared.discard(queue)
            self._ojs_scheduled.discard(queue)
            for key in [k for k in self._ojs_retry_declared if k[0] == queue]:
                del self._ojs_retry_declared[key]


class Transport(pyamqp.Transport):
    """kombu transport ``ojs://``: RabbitMQ through py-amqp, jobs as OJS jobs."""

    Connection = Connection

    def register_with_event_loop(self, connection: Connection, loop: Any) -> None:
        super().register_with_event_loop(connection, loop)
        loop.on_tick.add(connection.ojs_outcomes.run_due)
        if connection.ojs.settings.acks != "each":
            connection.register_with_loop(loop)
        transport = connection.transport
        if isinstance(transport, ReadAheadTCPTransport):
            connection.join_loop_wake(LoopWake(loop))
            transport.in_event_loop = True
            if transport.holds_frames:  # read before the loop watched the socket
                loop.call_soon(self.on_readable, connection, loop)
                transport.loop_wake()

    def _make_reader(self, connection: Connection, *args: Any, **kwargs: Any) -> Any:
        return super()._make_reader(LoopReads(connection), *args, **kwargs)

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

