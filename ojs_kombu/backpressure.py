"""Backpressure (``ojs-backpressure.md``) mapped onto RabbitMQ queue arguments (pure policy).

RabbitMQ enforces the bound: a job queue declared with ``x-max-length`` /
``x-max-length-bytes`` and ``x-overflow=reject-publish`` answers a publish
into a full queue with ``Basic.Nack``, and the message is not stored.  The
transport turns that nack into :class:`~ojs_kombu.errors.QueueFullError`
(the AMQP form of HTTP 429) through :meth:`BackpressureMonitor.nack_error`;
:meth:`BackpressureMonitor.publish` adds what the broker cannot do: the
``block`` strategy (publish again until a timeout), producer-side retries with
exponential backoff and the circuit breaker of section 8, pressure sampling
for the warning threshold, the ``backpressure.*`` events and the
``ojs.backpressure.*`` metrics.  For a batch, :meth:`BackpressureMonitor.admit_batch`
refuses the whole batch up front when it cannot fit (section 9.3) and
:meth:`BackpressureMonitor.batch_error` maps the nacks of a race that got part
of it refused anyway.  ``drop_oldest`` is ``x-overflow=drop-head``:
RabbitMQ drops the head and dead-letters it (reason ``maxlen``) into the
queue's DLQ, because every job queue has a dead-letter exchange.

No I/O here: sending, reading a queue's depth, the clock and sleeping are
passed in, so every rule is unit-tested without a broker.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from .errors import (
    BatchPublishError,
    BatchQueueFullError,
    JobNackedError,
    OJSConfigurationError,
    QueueFullError,
)
from .events.side import SideEvents

logger = logging.getLogger("ojs_kombu.backpressure")

Strategy = Literal["reject", "block", "drop_oldest"]
QueueType = Literal["classic", "quorum"]
DeadLetterStrategy = Literal["at-most-once", "at-least-once"]

#: Event types of the backpressure extension (section 10.1).  They are not in the
#: OJS event catalog (``event.schema.json`` enumerates ``type``), so they are not
#: sent to the OJS event sinks; see :meth:`BackpressureMonitor.subscribe`.
BACKPRESSURE_EVENT_TYPES = ("backpressure.warning", "backpressure.rejected",
                            "backpressure.dropped", "backpressure.cleared")
#: ``x-max-priority`` used for ``priority=True`` when ``ojs_max_priority`` is off.
DEFAULT_MAX_PRIORITY = 10
_REJECTING = ("reject-publish", "reject-publish-dlx")


class QueueConfig(BaseModel):
    """One job queue's ``ojs_queues`` entry (or ``ojs_queue_defaults``).

    Bounds follow section 6.2 (``0`` means unbounded).  ``priority``: ``None``
    takes ``ojs_max_priority`` on classic queues, ``True``/``False`` switch
    ``x-max-priority`` on/off, an integer is the ``x-max-priority``.
    ``dead_letter_strategy="at-least-once"`` (quorum only) makes RabbitMQ keep a
    dead-lettered job until its target queue confirmed it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    max_depth: int = Field(default=0, ge=0)
    max_size_bytes: int = Field(default=0, ge=0)
    strategy: Strategy = "reject"
    #: Fraction of ``max_depth`` at which ``backpressure.warning`` fires (section 6.2).
    warn_at: float = Field(default=0.8, gt=0, le=1)
    #: ``block``: seconds a producer keeps trying before it raises ``QueueFullError``.
    block_timeout: float = Field(default=30.0, gt=0)
    priority: bool | int | None = None
    type: QueueType = "classic"
    dead_letter_strategy: DeadLetterStrategy = "at-most-once"

    @property
    def bounded(self) -> bool:
        return bool(self.max_depth or self.max_size_bytes)


def merged_config(queue: str, defaults: QueueConfig, own: QueueConfig | None) -> QueueConfig:
    """``own``'s explicitly given fields over ``defaults``; checked (raises naming ``queue``)."""
    if own is None:
        config = defaults
    else:
        values = defaults.model_dump(include=defaults.model_fields_set)
        values.update(own.model_dump(include=own.model_fields_set))
        config = QueueConfig(**values)
    explicit_priority = own is not None and "priority" in own.model_fields_set
    check_config(queue, config, explicit_priority or "priority" in defaults.model_fields_set)
    return config


def check_config(queue: str, config: QueueConfig, explicit_priority: bool = True,
                 where: str | None = None) -> None:
    """Refuse what RabbitMQ would refuse (or silently ignore) before anything is declared."""
    where = where or f"ojs_queues[{queue!r}]"
    if config.strategy == "drop_oldest" and not config.bounded:
        raise OJSConfigurationError(
            f"{where}: strategy 'drop_oldest' needs max_depth or max_size_bytes "
            "(it drops jobs only when the bound is reached)")
    if config.type == "classic" and config.dead_letter_strategy == "at-least-once":
        raise OJSConfigurationError(
            f"{where}: dead_letter_strategy 'at-least-once' needs type 'quorum' "
            "(classic queues dead-letter at most once)")
    if config.dead_letter_strategy == "at-least-once" and config.strategy == "drop_oldest":
        raise OJSConfigurationError(
            f"{where}: strategy 'drop_oldest' (x-overflow=drop-head) cannot be combined with "
            "dead_letter_strategy 'at-least-once', which needs x-overflow=reject-publish; "
            "RabbitMQ would fall back to at-most-once dead-lettering")
    if config.type == "quorum" and explicit_priority and config.priority not in (None, False):
        raise OJSConfigurationError(
            f"{where}: priority needs a classic queue; quorum queues refuse x-max-priority "
            "(RabbitMQ 3.x) - set priority=False or type='classic'")
    if isinstance(config.priority, int) and not isinstance(config.priority, bool) \
            and not 1 <= config.priority <= 255:
        raise OJSConfigurationError(f"{where}: priority {config.priority} is not in 1..255")


def queue_arguments(config: QueueConfig, default_max_priority: int | None) -> dict[str, Any]:
    """The ``Queue.Declare`` arguments ``config`` stands for (beyond dead-lettering)."""
    args: dict[str, Any] = {}
    if config.type == "quorum":
        args["x-queue-type"] = "quorum"
    if config.max_depth:
        args["x-max-length"] = config.max_depth
    if config.max_size_bytes:
        args["x-max-length-bytes"] = config.max_size_bytes
    if config.dead_letter_strategy == "at-least-once":
        args["x-dead-letter-strategy"] = "at-least-once"
        args["x-overflow"] = "reject-publish"
    elif config.bounded:
        args["x-overflow"] = "drop-head" if config.strategy == "drop_oldest" else "reject-publish"
    priority = config.priority
    if priority is None:
        priority = default_max_priority if config.type == "classic" else None
    elif priority is True:
        priority = default_max_priority or DEFAULT_MAX_PRIORITY
    if priority:
        args["x-max-priority"] = int(priority)
    return args


def drops_head(arguments: Mapping[str, Any]) -> bool:
    """Whether a job queue declared with ``arguments`` drops its oldest jobs when full
    (``drop_oldest``), which makes RabbitMQ dead-letter them with reason ``maxlen``."""
    bounded = "x-max-length" in arguments or "x-max-length-bytes" in arguments
    return bounded and arguments.get("x-overflow") == "drop-head"


def maxlen_death(headers: Mapping[str, Any], job_queue: str) -> Mapping[str, Any] | None:
    """The ``x-death`` entry of a message RabbitMQ dropped from ``job_queue`` (the
    AMQP name) because the queue was at its bound, else ``None``.

    The entry that counts is the latest, ``x-death[0]``: a retried or scheduled
    job arrives through TTL queues, so its ``x-first-death-reason`` is
    ``expired`` even when it is later dropped for ``maxlen``.
    """
    deaths = headers.get("x-death")
    if not isinstance(deaths, list | tuple) or not deaths:
        return None
    latest = deaths[0]
    if (isinstance(latest, Mapping) and latest.get("reason") == "maxlen"
            and latest.get("queue") == job_queue):
        return latest
    return None


def check_arguments(queue: str, arguments: Mapping[str, Any]) -> None:
    """Refuse argument combinations RabbitMQ rejects, whatever setting they came from."""
    quorum = arguments.get("x-queue-type") == "quorum"
    overflow = arguments.get("x-overflow")
    if quorum and "x-max-priority" in arguments:
        raise OJSConfigurationError(
            f"queue {queue!r}: x-max-priority is a classic-queue argument; quorum queues "
            "refuse it (RabbitMQ 3.x). Turn priority off for this queue")
    if quorum and overflow == "reject-publish-dlx":
        raise OJSConfigurationError(
            f"queue {queue!r}: quorum queues support x-overflow drop-head or reject-publish, "
            "not reject-publish-dlx")
    if arguments.get("x-dead-letter-strategy") == "at-least-once":
        if not quorum:
            raise OJSConfigurationError(
                f"queue {queue!r}: x-dead-letter-strategy=at-least-once needs "
                "x-queue-type=quorum")
        if overflow != "reject-publish":
            raise OJSConfigurationError(
                f"queue {queue!r}: x-dead-letter-strategy=at-least-once needs "
                f"x-overflow=reject-publish (got {overflow!r}); RabbitMQ would dead-letter at "
                "most once")


@dataclass(frozen=True, slots=True)
class Bounds:
    """A queue's bound as declared, and the strategy its producers follow."""

    max_depth: int | None = None
    max_bytes: int | None = None
    overflow: str | None = None
    strategy: Strategy = "reject"
    warn_at: float = 0.8
    block_timeout: float = 30.0

    @classmethod
    def of(cls, arguments: Mapping[str, Any], config: QueueConfig) -> Bounds:
        """From the final ``Queue.Declare`` arguments (also ``ojs_queue_arguments``/Celery ones)."""
        depth, size = arguments.get("x-max-length"), arguments.get("x-max-length-bytes")
        return cls(int(depth) if depth is not None else None,
                   int(size) if size is not None else None,
                   arguments.get("x-overflow"), config.strategy, config.warn_at,
                   config.block_timeout)

    @property
    def bounded(self) -> bool:
        return self.max_depth is not None or self.max_bytes is not None

    @property
    def drops(self) -> bool:
        """Whether the broker drops the oldest job when the queue is full (``drop_oldest``)."""
        return self.bounded and self.overflow == "drop-head"

    @property
    def rejects(self) -> bool:
        """Whether the broker nacks publishes into the full queue (RabbitMQ's default
        overflow is drop-head)."""
        return self.bounded and self.overflow in _REJECTING

    @property
    def bound(self) -> int | None:
        return self.max_depth if self.max_depth is not None else self.max_bytes

    def pressure(self, depth: int | None) -> float | None:
        """depth / max_depth in 0.0..1.0 (section 7.3); ``None`` without a depth bound."""
        if depth is None or self.max_depth is None:
            return None
        if self.max_depth == 0:
            return 1.0
        return min(max(depth / self.max_depth, 0.0), 1.0)


class ProducerBackpressure(BaseModel):
    """``ojs_backpressure``: how producers react to a full queue (sections 8.1, 8.2)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    #: Automatic re-publishes of a rejected job before ``QueueFullError`` reaches the
    #: caller (``reject`` queues; ``block`` queues retry until their ``block_timeout``).
    retries: int = Field(default=0, ge=0)
    #: First wait (the ``Retry-After`` hint), doubled per consecutive rejection.
    retry_delay: float = Field(default=1.0, gt=0)
    max_retry_delay: float = Field(default=30.0, gt=0)
    #: Shortest wait between two publishes of a ``block`` producer.
    block_poll: float = Field(default=0.05, gt=0)
    #: Refuse jobs for a queue without sending them after ``breaker_threshold``
    #: consecutive rejections, for ``breaker_cooldown`` seconds (section 8.2).
    circuit_breaker: bool = False
    breaker_threshold: int = Field(default=5, ge=1)
    breaker_cooldown: float = Field(default=10.0, gt=0)
    #: Seconds between two depth reads of a bounded queue by one producer (0: after
    #: every publish); they drive ``backpressure.warning``/``cleared`` and the gauge.
    sample_interval: float = Field(default=1.0, ge=0)


def backoff(initial: float, maximum: float, failures: int) -> float:
    """Section 8.1: ``initial`` doubled per earlier consecutive failure, capped at ``maximum``."""
    return min(initial * 2 ** max(failures - 1, 0), maximum)


class CircuitBreaker:
    """Section 8.2 for one queue: closed -> open after ``threshold`` consecutive
    rejections -> half-open (one trial publish) after ``cooldown`` -> closed on success."""

    def __init__(self, threshold: int, cooldown: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold = threshold
        self.cooldown = cooldown
        self.clock = clock
        self.failures = 0
        self.opened_at: float | None = None
        self._trial = False

    @property
    def state(self) -> Literal["closed", "open", "half-open"]:
        if self.opened_at is None:
            return "closed"
        return "open" if self.clock() - self.opened_at < self.cooldown else "half-open"

    def allow(self) -> float:
        """0.0 when a publish may go ahead, else the seconds until the circuit half-opens."""
        state = self.state
        if state == "closed":
            return 0.0
        if state == "half-open" and not self._trial:
            self._trial = True
            return 0.0
        assert self.opened_at is not None
        return max(self.cooldown - (self.clock() - self.opened_at), self.cooldown / 10)

    def failure(self) -> None:
        self.failures += 1
        if self._trial or self.failures >= self.threshold:
            self.opened_at = self.clock()
        self._trial = False

    def success(self) -> None:
        self.failures = 0
        self.opened_at = None
        self._trial = False

    def release(self) -> None:
        """The trial ended without a verdict (e.g. the connection was lost): the next
        publish may try again."""
        self._trial = False


EventCallback = Callable[[dict[str, Any]], object]
DepthReader = Callable[[str], "int | None"]


class _QueueState:
    __slots__ = ("breaker", "consecutive", "last_sample", "pressure", "warned")

    def __init__(self, breaker: CircuitBreaker | None) -> None:
        self.breaker = breaker
        self.consecutive = 0
        self.last_sample = float("-inf")
        self.pressure: float | None = None
        self.warned = False


class BackpressureMonitor:
    """A process's producer side of backpressure, per queue; thread-safe.

    ``bounds_for(queue)`` gives a queue's :class:`Bounds`; ``metrics`` is an
    :class:`~ojs_kombu.metrics.OJSMetrics` (or ``None``).
    """

    def __init__(self, settings: ProducerBackpressure, bounds_for: Callable[[str], Bounds],
                 *, source: str = "ojs://ojs-kombu", metrics: Any = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.settings = settings
        self.bounds_for = bounds_for
        self.source = source
        self.metrics = metrics
        self.clock = clock
        self.sleep = sleep
        self._lock = threading.Lock()
        self._queues: dict[str, _QueueState] = {}
        self._events = SideEvents("backpressure")
        if metrics is not None:
            metrics.observe_backpressure(self.pressures)

    # -- events -------------------------------------------------------------

    def subscribe(self, callback: EventCallback) -> Callable[[], None]:
        """Call ``callback(event)`` with every ``backpressure.*`` event (an OJS-envelope
        dict: specversion, id, type, source, time, subject = queue, data); returns a
        function that unsubscribes."""
        return self._events.subscribe(callback)

    def emit(self, event_type: str, queue: str, **data: Any) -> dict[str, Any]:
        details = {k: v for k, v in data.items() if v is not None}
        level = logging.INFO if event_type == "backpressure.cleared" else logging.WARNING
        logger.log(level, "%s: queue %r %s", event_type, queue, details)
        return self._events.emit(event_type, self.source, queue, {"queue": queue, **details})

    def dropped(self, queue: str, job_id: str | None, job_type: str | None,
                dropped_at: str | None = None) -> dict[str, Any]:
        """A ``drop_oldest`` queue dropped a job (section 5.3): ``backpressure.dropped``
        and ``ojs.backpressure.dropped_total``.  Called by the worker that consumes
        the queue's dropped-job tap, once per dropped job."""
        if self.metrics is not None:
            self.metrics.backpressure_dropped.add(1, {"queue": queue})
        return self.emit("backpressure.dropped", queue, job_id=job_id, job_type=job_type,
                         dropped_at=dropped_at)

    def pressures(self) -> list[tuple[str, float]]:
        """``(queue, depth / bound)`` last sampled, for the ``ojs.backpressure.pressure`` gauge."""
        with self._lock:
            return [(q, s.pressure) for q, s in self._queues.items() if s.pressure is not None]

    # -- publishing -----------------------------------------------------------

    def _state(self, queue: str) -> _QueueState:
        state = self._queues.get(queue)
        if state is None:
            with self._lock:
                breaker = (CircuitBreaker(self.settings.breaker_threshold,
                                          self.settings.breaker_cooldown, self.clock)
                           if self.settings.circuit_breaker else None)
                state = self._queues.setdefault(queue, _QueueState(breaker))
        return state

    def retry_after(self, queue: str) -> float:
        """The wait recommended after the latest rejection by ``queue`` (``Retry-After``)."""
        s = self.settings
        return backoff(s.retry_delay, s.max_retry_delay, self._state(queue).consecutive)

    def nack_error(self, queue: str, job_id: str, read_depth: DepthReader | None = None
                   ) -> JobNackedError:
        """The exception for a ``Basic.Nack`` of ``job_id``'s publish into ``queue``:
        :class:`QueueFullError` when the queue rejects on overflow, else ``JobNackedError``.

        Counted in ``ojs.backpressure.rejected_total``.  ``read_depth`` (best-effort)
        fills in the depth.  Both the single and the batch publish path call this.
        """
        bounds = self.bounds_for(queue)
        if not bounds.rejects:
            return JobNackedError(
                f"job {job_id} for queue {queue!r} was refused by the broker (Basic.Nack); "
                "it was not enqueued", job_id=job_id, queue=queue)
        state = self._state(queue)
        state.consecutive += 1
        depth = _read(read_depth, queue)
        if depth is not None:
            state.pressure = bounds.pressure(depth)
        if self.metrics is not None:
            self.metrics.backpressure_rejected.add(1, {"queue": queue})
        return self._full(queue, job_id, bounds, depth)

    def _full(self, queue: str, job_id: str, bounds: Bounds, depth: int | None,
              *, circuit_open: bool = False, retry_after: float | None = None
              ) -> QueueFullError:
        which = "depth" if bounds.max_depth is not None else "size"
        limit = (f"{bounds.max_depth} jobs" if bounds.max_depth is not None
                 else f"{bounds.max_bytes} bytes")
        retry_after = self.retry_after(queue) if retry_after is None else retry_after
        why = ("the producer's circuit breaker is open after repeated rejections"
               if circuit_open else f"the queue has reached its {which} bound ({limit})")
        return QueueFullError(
            f"job {job_id} for queue {queue!r} not enqueued: {why}"
            f"{f', depth {depth}' if depth is not None else ''}; retry after "
            f"{retry_after:g}s", queue=queue, job_id=job_id, depth=depth, bound=bounds.bound,
            strategy=bounds.strategy, retry_after=retry_after, circuit_open=circuit_open)

    def publish(self, queue: str, job_id: str, job_type: str, send: Callable[[], None],
                read_depth: DepthReader | None = None) -> None:
        """Run ``send`` (one confirmed publish that raises ``QueueFullError`` on a
        rejection) under the queue's strategy, retries and circuit breaker."""
        bounds = self.bounds_for(queue)
        if not bounds.bounded:
            send()
            return
        state = self._state(queue)
        settings = self.settings
        deadline = self.clock() + bounds.block_timeout if bounds.strategy == "block" else None
        retries = settings.retries
        while True:
            wait = state.breaker.allow() if state.breaker is not None else 0.0
            if wait:
                error = self._full(queue, job_id, bounds, None, circuit_open=True,
                                   retry_after=wait)
            else:
                try:
                    send()
                except QueueFullError as exc:
                    error = exc
                    if state.breaker is not None:
                        state.breaker.failure()
                except BaseException:  # no verdict (e.g. a lost connection): free the trial
                    if state.breaker is not None:
                        state.breaker.release()
                    raise
                else:
                    state.consecutive = 0
                    if state.breaker is not None:
                        state.breaker.success()
                    self._sample(queue, bounds, state, read_depth)
                    return
            if deadline is not None:
                pause = min(max(settings.block_poll, backoff(
                    settings.block_poll, settings.max_retry_delay, state.consecutive)),
                    deadline - self.clock())
                if pause > 0:
                    self.sleep(pause)
                    continue
            elif retries > 0:
                retries -= 1
                self.sleep(error.retry_after)
                continue
            self.emit("backpressure.rejected", queue, depth=error.depth, bound=error.bound,
                      job_type=job_type, job_id=job_id, strategy=bounds.strategy,
                      retry_after=error.retry_after, circuit_open=error.circuit_open or None)
            raise error

    def _sample(self, queue: str, bounds: Bounds, state: _QueueState,
                read_depth: DepthReader | None) -> None:
        if read_depth is None or bounds.max_depth is None:
            return
        now = self.clock()
        if now - state.last_sample < self.settings.sample_interval:
            return
        state.last_sample = now
        depth = _read(read_depth, queue)
        self.observe(queue, depth)

    def observe(self, queue: str, depth: int | None) -> None:
        """Record a depth reading: the gauge, and ``warning``/``cleared`` on crossing
        ``warn_at`` (section 10.1)."""
        bounds = self.bounds_for(queue)
        pressure = bounds.pressure(depth)
        if pressure is None:
            return
        state = self._state(queue)
        state.pressure = pressure
        if pressure >= bounds.warn_at and not state.warned:
            state.warned = True
            self.emit("backpressure.warning", queue, depth=depth, bound=bounds.max_depth,
                      pressure=round(pressure, 4))
        elif pressure < bounds.warn_at and state.warned:
            state.warned = False
            self.emit("backpressure.cleared", queue, depth=depth, bound=bounds.max_depth,
                      pressure=round(pressure, 4))

    # -- batches ----------------------------------------------------------------

    def admit_batch(self, jobs: Sequence[BatchJob], read_depth: DepthReader | None = None
                    ) -> BatchAdmission:
        """Section 9.3 before a batch is sent, for each ``reject``/``block`` queue it
        publishes into: refuse the whole batch (:class:`BatchQueueFullError`, nothing
        is sent) while the queue's circuit breaker is open, or when its jobs do not
        fit at the depth read now; a ``block`` queue first waits for room, reading the
        depth again, up to its ``block_timeout``.

        A race with other producers can still get part of the batch nacked; see
        :meth:`batch_error`.  Report the broker's answer to the returned admission.
        """
        by_queue: dict[str, list[BatchJob]] = {}
        for job in jobs:
            if job.delay_ms <= 0:  # scheduled jobs enter their queue later
                by_queue.setdefault(job.queue, []).append(job)
        bounded = {q: queued for q, queued in by_queue.items() if self.bounds_for(q).rejects}
        admission = BatchAdmission(self, bounded)
        if not bounded:
            return admission
        try:
            for queue, queued in bounded.items():
                breaker = self._state(queue).breaker
                wait = breaker.allow() if breaker is not None else 0.0
                if wait:
                    raise self._refuse_batch(jobs, queue, queued, None, circuit_open=True,
                                             retry_after=wait)
                admission.trials.append(queue)
            for queue, queued in bounded.items():
                self._wait_for_room(jobs, queue, queued, read_depth)
        except BaseException:
            admission.release()
            raise
        return admission

    def _wait_for_room(self, jobs: Sequence[BatchJob], queue: str, queued: list[BatchJob],
                       read_depth: DepthReader | None) -> None:
        bounds = self.bounds_for(queue)
        count = len(queued)
        fits_at_all = bounds.max_depth is None or count <= bounds.max_depth
        deadline = (self.clock() + bounds.block_timeout
                    if bounds.strategy == "block" and fits_at_all else None)
        waits = 0
        while True:
            depth = _read(read_depth, queue)
            if depth is None or bounds.max_depth is None or depth + count <= bounds.max_depth:
                return  # the broker still enforces the bound: see batch_error
            pause = 0.0
            if deadline is not None:
                waits += 1
                pause = min(max(self.settings.block_poll, backoff(
                    self.settings.block_poll, self.settings.max_retry_delay, waits)),
                    deadline - self.clock())
            if pause <= 0:
                state = self._state(queue)
                state.consecutive += 1
                state.pressure = bounds.pressure(depth)
                if state.breaker is not None:
                    state.breaker.failure()
                raise self._refuse_batch(jobs, queue, queued, depth)
            self.sleep(pause)

    def _refuse_batch(self, jobs: Sequence[BatchJob], queue: str, queued: list[BatchJob],
                      depth: int | None, *, circuit_open: bool = False,
                      retry_after: float | None = None) -> BatchQueueFullError:
        """The error of a batch refused before sending: every job of it is rejected."""
        bounds = self.bounds_for(queue)
        retry_after = self.retry_after(queue) if retry_after is None else retry_after
        if circuit_open:
            why = "the producer's circuit breaker is open after repeated rejections"
        elif bounds.max_depth is not None and len(queued) > bounds.max_depth:
            why = f"they exceed its depth bound ({bounds.max_depth} jobs)"
        else:
            why = (f"they do not fit under its depth bound ({bounds.max_depth} jobs) at "
                   f"depth {depth}")
        cause = f"queue {queue!r} cannot take the batch's {len(queued)} job(s)"
        own = {job.job_id for job in queued}
        rejected = {job.job_id: f"not sent: {cause}" if job.job_id in own
                    else f"not sent: the batch was refused ({cause})" for job in jobs}
        if self.metrics is not None and not circuit_open:
            self.metrics.backpressure_rejected.add(len(queued), {"queue": queue})
        self._emit_batch_rejected(queue, queued, bounds, depth, retry_after, circuit_open)
        return BatchQueueFullError(
            f"batch of {len(jobs)} job(s) not enqueued: queue {queue!r} cannot take its "
            f"{len(queued)} job(s): {why}; nothing was sent; retry after {retry_after:g}s",
            queue=queue, depth=depth, bound=bounds.bound, strategy=bounds.strategy,
            retry_after=retry_after, circuit_open=circuit_open, rejected=rejected)

    def _emit_batch_rejected(self, queue: str, queued: Sequence[BatchJob], bounds: Bounds,
                             depth: int | None, retry_after: float,
                             circuit_open: bool) -> None:
        """One ``backpressure.rejected`` per queue and batch (``count`` jobs); ``job_type``
        when they share one."""
        types = {job.job_type for job in queued}
        self.emit("backpressure.rejected", queue, depth=depth, bound=bounds.bound,
                  job_type=types.pop() if len(types) == 1 else None, count=len(queued),
                  strategy=bounds.strategy, retry_after=retry_after,
                  circuit_open=circuit_open or None)

    def batch_error(self, jobs: Sequence[BatchJob], error: BatchPublishError,
                    nacked: Collection[str], read_depth: DepthReader | None = None
                    ) -> BatchPublishError:
        """The exception for a sent batch the broker did not wholly accept: ``error``
        itself, unless jobs of a ``reject``/``block`` queue are among the ``nacked``
        job ids; then a :class:`BatchQueueFullError` with ``error``'s lists (the
        nacks of full queues named as such), describing the first full queue.

        Counted in ``ojs.backpressure.rejected_total``; one ``backpressure.rejected``
        per full queue.
        """
        by_queue: dict[str, list[BatchJob]] = {}
        for job in jobs:
            if job.job_id in nacked and job.delay_ms <= 0:
                by_queue.setdefault(job.queue, []).append(job)
        full: list[QueueFullError] = []
        rejected = dict(error.rejected)
        for queue, refused in by_queue.items():
            first = self.nack_error(queue, refused[0].job_id, read_depth)
            if not isinstance(first, QueueFullError):
                continue
            if self.metrics is not None and len(refused) > 1:
                self.metrics.backpressure_rejected.add(len(refused) - 1, {"queue": queue})
            bounds = self.bounds_for(queue)
            self._emit_batch_rejected(queue, refused, bounds, first.depth, first.retry_after,
                                      False)
            for job in refused:
                rejected[job.job_id] = (f"refused by the broker (Basic.Nack): queue {queue!r} "
                                        f"is at its bound ({bounds.bound})")
            full.append(first)
        if not full:
            return error
        head = full[0]
        names = ", ".join(repr(f.queue) for f in full)
        return BatchQueueFullError(
            f"queue(s) {names} full (depth {head.depth}, bound {head.bound}); retry after "
            f"{head.retry_after:g}s: {error}", queue=head.queue or "", depth=head.depth,
            bound=head.bound, strategy=head.strategy, retry_after=head.retry_after,
            rejected=rejected, unconfirmed=error.unconfirmed, accepted=error.accepted)


class BatchJob(Protocol):
    """What the monitor reads of a batch's job (``ojs_kombu.codec.OutgoingJob``)."""

    @property
    def job_id(self) -> str: ...
    @property
    def job_type(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def delay_ms(self) -> int: ...


class BatchAdmission:
    """The bounded queues of a batch :meth:`BackpressureMonitor.admit_batch` let through.

    Their circuit breakers may have taken the batch as their half-open trial, so
    the batch's outcome must come back: :meth:`settle` with the nacked job ids,
    or :meth:`release` when it never got an answer (a lost connection).
    """

    def __init__(self, monitor: BackpressureMonitor, queues: Mapping[str, list[BatchJob]]
                 ) -> None:
        self.monitor = monitor
        self.queues = queues
        self.trials: list[str] = []

    def settle(self, nacked: Collection[str], read_depth: DepthReader | None = None) -> None:
        """A queue whose jobs were all accepted closes its breaker (and samples its
        depth, as after a single publish); one with a nacked job counts a failure."""
        monitor = self.monitor
        for queue, queued in self.queues.items():
            state = monitor._state(queue)
            if any(job.job_id in nacked for job in queued):
                if state.breaker is not None:
                    state.breaker.failure()
                continue
            state.consecutive = 0
            if state.breaker is not None:
                state.breaker.success()
            monitor._sample(queue, monitor.bounds_for(queue), state, read_depth)
        self.trials.clear()

    def release(self) -> None:
        """Free the breakers' trials without a verdict (no-op after :meth:`settle`)."""
        for queue in self.trials:
            breaker = self.monitor._state(queue).breaker
            if breaker is not None:
                breaker.release()
        self.trials.clear()


def _read(read_depth: DepthReader | None, queue: str) -> int | None:
    if read_depth is None:
        return None
    try:
        return read_depth(queue)
    except Exception:  # a depth reading is a hint; never let it replace the real error
        logger.debug("could not read the depth of queue %r", queue, exc_info=True)
        return None
