"""Publishing OJS jobs on one channel, with publisher confirms (AMQP-014..016).

A job goes to ``ojs.exchange.direct`` with ``mandatory=True`` (or into the
scheduling ladder or the delayed exchange when it is due later) and the caller
waits for the broker's confirm: a return, a nack or a missing confirm raises a
typed exception naming job and queue.  Frames are encoded by
:mod:`ojs_kombu.amqp.wire.publish_frames`, and numbered and written by the channel's
:class:`~ojs_kombu.amqp.publishing.ledger.ConfirmLedger`; batches are in
:mod:`ojs_kombu.amqp.publishing.batch`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from time import monotonic
from typing import Any

import amqp
from amqp.exceptions import MessageNacked, RecoverableConnectionError

from ...events.job_info import JobInfo
from ...events.tracing import with_current_trace
from ...spec.delays import check_schedule_delay, schedule_levels, schedule_routing_key
from ...spec.encode import OutgoingJob, encode_task_message
from ...spec.errors import (
    JobEncodeError,
    JobNackedError,
    JobRoutingError,
    PublishConfirmTimeout,
    QueueNameError,
    UnroutableJobError,
)
from ...spec.naming import TopologyNames
from ...spec.settings import OJSSettings
from ...spec.trace_context import trace_id_of
from ..binding import Binding
from ..job_channel import JobChannel, JobConnection
from ..wire.publish_frames import PublishFrames
from .app_sends import refuse_uninstalled_send
from .deferred import DeferredConfirms
from .ledger import ConfirmLedger, Publish, Replaced

logger = logging.getLogger(__name__)

#: A job's way to the broker when it is due later: exchange, routing key,
#: ``mandatory``, and what declares that way (given a declaring function, ``None``:
#: at once).
ScheduleRoute = tuple[str, str, bool, Callable[[Any], None]]


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


def encode_task(binding: Binding, body: Any, content_type: str | None,
                properties: Mapping[str, Any], headers: Mapping[str, Any], exchange: str,
                routing_key: str) -> OutgoingJob:
    """The OJS job of a Celery task message published to ``exchange`` with ``routing_key``
    (:func:`~ojs_kombu.spec.encode.encode_task_message`, the job's type, queue and retry
    policy from ``binding``, the current trace context when the headers carry none)."""
    task = headers["task"]
    if "traceparent" not in headers:
        headers = with_current_trace(headers)
    return encode_task_message(
        body=body, content_type=content_type, properties=properties, headers=headers,
        job_type=binding.job_types.type_for(task),
        queue=job_queue_for(binding.names, task, exchange, routing_key),
        retry_policy=binding.retry_policy_for(task) if binding.retry_policy_for else None,
        max_job_bytes=binding.settings.max_job_bytes,
    )


def schedule_route(connection: JobConnection, properties: dict[str, Any], job_id: str,
                   queue: str, delay_ms: int) -> ScheduleRoute:
    """The way of a job due in ``delay_ms`` (AMQP-022, section 9): the delayed exchange
    when configured (``x-delay`` added to ``properties``), else the schedule ladder."""
    try:
        check_schedule_delay(delay_ms)
    except ValueError as exc:
        raise JobEncodeError(f"job {job_id}: {exc}", job_id=job_id, queue=queue) from None
    ojs = connection.ojs
    names = ojs.names
    if ojs.settings.delayed_exchange:
        properties.setdefault("application_headers", {})["x-delay"] = delay_ms
        # The plugin routes only when the delay is over: mandatory would always return.
        return (names.delayed_exchange, queue, False,
                lambda via: connection.ensure_delayed_exchange(queue))
    entry = names.schedule_exchange(schedule_levels(delay_ms)[0])
    return (entry, schedule_routing_key(delay_ms, queue), True,
            lambda via: connection.ensure_schedule(queue, via))


class JobPublisher:
    """The confirmed publishes of one channel of the ``ojs`` transport.

    In confirm mode the broker numbers every publish of the channel: each goes
    through the channel's :class:`~ojs_kombu.amqp.publishing.ledger.ConfirmLedger`, which
    counts also the publishes nobody waits for (:meth:`count_unconfirmed`).
    """

    def __init__(self, channel: JobChannel) -> None:
        self._channel = channel
        #: Jobs published without waiting (``ojs_publish_confirms="deferred"``).
        self.deferred = DeferredConfirms(self)
        self.reset()

    def reset(self) -> None:
        """The channel was (re)opened: confirm mode and frame numbers start anew."""
        self.deferred.channel_lost()
        ledger = getattr(self, "ledger", None)
        if ledger is not None:
            ledger.close()  # lost with the channel: whoever waits sees it
        self._confirming = False
        connection = self._channel.connection
        self.ledger = ConfirmLedger(connection.write_frames,
                                    getattr(connection, "ojs_write_lock", None))
        self._frames: PublishFrames | None = None

    # -- jobs -----------------------------------------------------------------

    def publish_task(self, message: amqp.Message, headers: dict[str, Any], exchange: str,
                     routing_key: str, timeout: float | None,
                     confirm_timeout: float | None) -> None:
        """A Celery task message another kombu producer serialised, published as an OJS
        job (Celery's own sender hands the transport the job: :meth:`publish_job`).
        One a Celery app's sender sent without ``install()`` is refused
        (:mod:`.app_sends`)."""
        if not getattr(self._channel.connection, "ojs_app_binding", True):
            refuse_uninstalled_send(headers)
        properties = message.properties
        job = encode_task(self._channel.ojs, message.body, properties.get("content_type"),
                          properties, headers, exchange, routing_key)
        self.publish_job(job, timeout=timeout, confirm_timeout=confirm_timeout)

    def publish_job(self, job: OutgoingJob, *, timeout: float | None = None,
                    confirm_timeout: float | None = None) -> None:
        """Publish one encoded job and return once the broker took it."""
        ojs = self._channel.ojs
        connection = self._channel.connection
        queue = job.queue
        connection.ensure_topology(queue)
        message = amqp.Message(job.body, **job.properties)
        self.announce(job)
        publish = (self.publish_confirmed if ojs.settings.publish_confirms == "wait"
                   else self.publish_deferred)
        if job.delay_ms > 0:
            exchange, routing_key, mandatory = self.route_scheduled(
                message.properties, job.job_id, queue, job.delay_ms)
            publish(message, exchange, routing_key, job_id=job.job_id, queue=queue,
                    mandatory=mandatory, timeout=timeout, confirm_timeout=confirm_timeout)
        else:  # under the queue's backpressure strategy (ojs_kombu.spec.backpressure)
            ojs.backpressure.publish(
                queue, job.job_id, job.job_type, lambda: publish(
                    message, ojs.names.direct_exchange, queue, job_id=job.job_id, queue=queue,
                    timeout=timeout, confirm_timeout=confirm_timeout),
                connection.queue_depth)
        ojs.hook.message_published(queue, 1)

    def publish_deferred(self, message: amqp.Message, exchange: str, routing_key: str, *,
                         job_id: str, queue: str, mandatory: bool = True,
                         timeout: float | None = None,
                         confirm_timeout: float | None = None) -> None:
        """Publish in confirm mode and return without waiting (:mod:`.deferred`)."""
        self.deferred.publish(message, exchange, routing_key, job_id=job_id, queue=queue,
                              mandatory=mandatory, timeout=timeout)

    def announce(self, job: OutgoingJob) -> None:
        """``job.enqueued``/``job.scheduled``, before the publish: a worker may start the
        job before the confirm arrives, and a job's events come in lifecycle order."""
        self._channel.ojs.hook.job_enqueued(JobInfo(
            job.job_id, job.job_type, job.queue,
            trace_id=trace_id_of(job.properties["application_headers"].get("x-ojs-trace-id"))),
            job.properties.get("priority"), job.delay_ms / 1000)

    def route_scheduled(self, properties: dict[str, Any], job_id: str, queue: str,
                        delay_ms: int) -> tuple[str, str, bool]:
        """:func:`schedule_route`, declared at once (a producer may wait for replies)."""
        exchange, routing_key, mandatory, prepare = schedule_route(
            self._channel.connection, properties, job_id, queue, delay_ms)
        prepare(None)
        return exchange, routing_key, mandatory

    # -- confirmed publishes --------------------------------------------------

    def publish_confirmed(self, message: amqp.Message, exchange: str, routing_key: str, *,
                          job_id: str, queue: str, mandatory: bool = True,
                          timeout: float | None = None, confirm_timeout: float | None = None,
                          measure: bool = True, replaces: int | None = None) -> None:
        """Publish and wait for the broker's confirm; a return or nack raises.
        ``replaces``: the delivery tag, on this channel, of the delivery the message
        replaces, acked by the ledger once the broker confirmed it (``dlq replay``)."""
        channel = self._channel
        ojs = channel.ojs
        started = monotonic()
        pending = self.publish_tracked(
            message, exchange, routing_key, mandatory, timeout, confirm_timeout,
            job_id=job_id, queue=queue,
            replaces=None if replaces is None else Replaced(channel, replaces))
        if measure:
            ojs.hook.message_confirmed(monotonic() - started)
        if pending.lost:
            raise PublishConfirmTimeout(
                f"job {job_id} (queue {queue!r}): its channel closed before the broker "
                "confirmed it; it may or may not be enqueued", job_id=job_id, queue=queue)
        if pending.returned is not None:
            channel.connection.forget_topology(queue)  # the next publish re-declares it
            raise UnroutableJobError(
                f"job {job_id} for queue {queue!r} was returned by the broker "
                f"({pending.returned}): no queue is bound to {exchange!r} with routing key "
                f"{routing_key!r}; it was not enqueued",
                job_id=job_id, queue=queue,
            )
        if pending.nacked:
            if exchange == ojs.names.direct_exchange:  # QueueFullError when it is full
                raise ojs.backpressure.nack_error(queue, job_id, channel.connection.queue_depth)
            raise JobNackedError(
                f"job {job_id} for queue {queue!r} was refused by the broker (Basic.Nack); "
                "it was not enqueued", job_id=job_id, queue=queue,
            )

    def publish_tracked(self, message: amqp.Message, exchange: str, routing_key: str,
                        mandatory: bool, timeout: float | None, confirm_timeout: float | None,
                        *, job_id: str, queue: str, replaces: Replaced | None = None
                        ) -> Publish:
        """Publish in confirm mode and block until the broker settled the publish."""
        self.confirm_mode()
        entry = self.send(message, exchange, routing_key, mandatory, timeout,
                          job_id=job_id, queue=queue, replaces=replaces)
        try:
            self._wait_settled(entry, confirm_timeout)
        finally:
            self.ledger.forget(entry)
        return entry

    def publish_many_confirmed(self, messages: list[tuple[amqp.Message, str, str]],
                               confirm_timeout: float | None = None, *,
                               mandatory: bool = False,
                               replaces: Sequence[int] | None = None) -> list[bool]:
        """Pipelined publishes and one wait for all their confirms; ``True`` for each
        message the broker accepted (``mandatory``: and routed).  ``replaces[i]``: the
        delivery tag, on this channel, of the delivery message ``i`` replaces, acked by
        the ledger once the broker confirmed that copy (``dlq replay``)."""
        self.confirm_mode()
        ledger = self.ledger
        tracked: list[Publish] = []
        channel = self._channel
        try:
            for i, (message, exchange, routing_key) in enumerate(messages):
                tracked.append(self.send(
                    message, exchange, routing_key, mandatory, None, hold=True,
                    job_id=message.properties.get("message_id") or "", queue=exchange,
                    replaces=None if replaces is None else Replaced(channel, replaces[i])))
            ledger.flush()
            for entry in tracked:
                self._wait_settled(entry, confirm_timeout)
        finally:
            for entry in tracked:
                ledger.forget(entry)
        return [entry.confirmed for entry in tracked]

    def publish_other(self, message: amqp.Message, exchange: str, routing_key: str,
                      mandatory: bool, timeout: float | None,
                      confirm_timeout: float | None) -> None:
        """A message that is not a job, confirmed as kombu's ``confirm_publish=True`` asks
        (:class:`~amqp.exceptions.MessageNacked` when the broker refused it)."""
        pending = self.publish_tracked(
            message, exchange, routing_key, mandatory, timeout, confirm_timeout,
            job_id=message.properties.get("message_id") or "", queue=routing_key)
        if pending.nacked or pending.lost:
            raise MessageNacked()

    def count_unconfirmed(self) -> None:
        """A publish through py-amqp's own path (the caller holds :attr:`ledger`'s lock
        around both): the broker numbers it too."""
        if self._confirming:
            self.ledger.skip()

    def wait_outstanding(self, most: int, limit: float) -> bool:
        """Read confirms until at most ``most`` tracked publishes are unconfirmed;
        ``False`` when ``limit`` seconds passed first."""
        ledger = self.ledger
        ledger.flush()
        return self._channel.connection.wait_until(lambda: ledger.outstanding <= most, limit)

    def _wait_settled(self, pending: Publish, confirm_timeout: float | None) -> None:
        limit = confirm_timeout or self._channel.ojs.settings.confirm_timeout
        if not self._channel.connection.wait_until(lambda: pending.done, limit):
            raise PublishConfirmTimeout(
                f"no publisher confirm for job {pending.job_id} (queue {pending.queue!r}) "
                f"within {limit}s: it may or may not be enqueued",
                job_id=pending.job_id, queue=pending.queue,
            )

    # -- what deferred confirms use (ojs_kombu.amqp.publishing.deferred) -------------------

    @property
    def settings(self) -> OJSSettings:
        return self._channel.ojs.settings

    def read_arrived(self, timeout: float) -> None:
        """Read and handle one incoming method (:class:`TimeoutError`: none in time)."""
        self._channel.connection.drain_events(timeout=timeout)

    def forget_topology(self, queue: str) -> None:
        self._channel.connection.forget_topology(queue)

    # -- the wire -------------------------------------------------------------

    def send(self, message: amqp.Message, exchange: str, routing_key: str, mandatory: bool,
             timeout: float | None, *, job_id: str, queue: str, hold: bool = False,
             item: Any = None, on_settled: Callable[[Publish], None] | None = None,
             replaces: Replaced | None = None) -> Publish:
        """``Basic.Publish`` of ``message``: :meth:`write`."""
        return self.write(message.body, message.properties, exchange, routing_key, mandatory,
                          timeout, job_id=job_id, queue=queue, hold=hold, item=item,
                          on_settled=on_settled, replaces=replaces)

    def write(self, body: bytes | str, properties: dict[str, Any], exchange: str,
              routing_key: str, mandatory: bool, timeout: float | None, *, job_id: str,
              queue: str, hold: bool = False, item: Any = None,
              on_settled: Callable[[Publish], None] | None = None,
              replaces: Replaced | None = None) -> Publish:
        """``Basic.Publish`` numbered by the channel's ledger, in one write (``hold``: with
        the next unheld publish or :meth:`ConfirmLedger.flush`).

        py-amqp polls the socket before every publish for a pending
        ``connection.blocked``; a confirmed publish reads every incoming frame
        right afterwards anyway, so that poll is pure cost on this path.
        """
        connection = self._channel.connection
        if not connection:
            raise RecoverableConnectionError("basic_publish: connection closed")
        data = self.frames().encode(exchange, routing_key, mandatory, body, properties)
        # a batch's publishes (no timeout): no socket timeout to set and reset for each
        guard = (nullcontext() if timeout is None
                 else connection.transport.having_timeout(timeout))
        try:
            with guard:
                return self.ledger.publish(
                    data, job_id=job_id, queue=queue, exchange=exchange,
                    routing_key=routing_key, mandatory=mandatory, body=body,
                    properties=properties, hold=hold, item=item, on_settled=on_settled,
                    replaces=replaces)
        except TimeoutError:
            raise RecoverableConnectionError("basic_publish: timed out") from None

    def frames(self) -> PublishFrames:
        """The channel's publish encoder, shared by single and batch publishes (its
        method frames are cached per destination)."""
        if self._frames is None:
            channel = self._channel
            self._frames = PublishFrames(channel.channel_id, channel.connection.frame_max)
        return self._frames

    def confirm_mode(self) -> None:
        if self._confirming:
            return
        channel = self._channel
        channel.confirm_select()
        ledger = self.ledger
        ledger.start()
        channel.events["basic_ack"].add(self._on_ack)
        channel.events["basic_nack"].add(self._on_nack)
        channel.events["basic_return"].add(self._on_return)
        self._confirming = True

    def _on_ack(self, delivery_tag: int, multiple: bool) -> None:
        self.ledger.ack(delivery_tag, multiple)

    def _on_nack(self, delivery_tag: int, multiple: bool) -> None:
        self.ledger.nack(delivery_tag, multiple)

    def _on_return(self, exc: Exception, exchange: str, routing_key: str,
                   message: amqp.Message) -> None:
        self._channel.ojs.hook.message_returned(routing_key)
        if self.ledger.returned(exchange, routing_key, message, str(exc)) is None:
            logger.warning("message %s returned by the broker from exchange %r key %r: %s",
                           message.properties.get("message_id"), exchange, routing_key, exc)
