"""Producer-side backpressure (``ojs-backpressure.md`` sections 8-10) around a publish.

:class:`BackpressureMonitor` adds what the broker cannot do to a bounded queue
(whose arguments :mod:`ojs_kombu.spec.backpressure` maps): the ``block``
strategy (publish again until a timeout), producer retries with backoff, the
circuit breaker of section 8.2, pressure sampling for the warning threshold,
the ``backpressure.*`` events and the ``ojs.backpressure.*`` metrics.  For a
batch, :meth:`BackpressureMonitor.admit_batch` refuses the whole batch up front
when it cannot fit (section 9.3).  Sending, reading a queue's depth, the clock
and sleeping are passed in, so every rule is unit-tested without a broker.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Literal, Protocol

from ..events.side import SideEvents
from ..spec.backoff import backoff
from ..spec.backpressure import (
    Bounds,
    ProducerBackpressure,
)
from ..spec.errors import (
    BatchPublishError,
    BatchQueueFullNacked,
    BatchQueueFullRefused,
    JobNackedError,
    QueueFullError,
    QueueFullNacked,
    QueueFullRefused,
)

logger = logging.getLogger("ojs_kombu.amqp.backpressure")


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
    :class:`~ojs_kombu.events.metrics.OJSMetrics` (or ``None``).
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
        :class:`QueueFullNacked` when the queue rejects on overflow, else ``JobNackedError``.

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
        which = "depth" if bounds.max_depth is not None else "size"
        limit = (f"{bounds.max_depth} jobs" if bounds.max_depth is not None
                 else f"{bounds.max_bytes} bytes")
        retry_after = self.retry_after(queue)
        return QueueFullNacked(
            f"job {job_id} for queue {queue!r} not enqueued: the queue has reached its "
            f"{which} bound ({limit}){f', depth {depth}' if depth is not None else ''}; "
            f"retry after {retry_after:g}s", queue=queue, job_id=job_id, depth=depth,
            bound=bounds.bound, strategy=bounds.strategy, retry_after=retry_after)

    def _circuit_open(self, queue: str, job_id: str, bounds: Bounds, retry_after: float
                      ) -> QueueFullRefused:
        """The refusal of a job the open circuit breaker keeps from being sent."""
        return QueueFullRefused(
            f"job {job_id} for queue {queue!r} not enqueued: the producer's circuit breaker "
            f"is open after repeated rejections; retry after {retry_after:g}s",
            queue=queue, job_id=job_id, bound=bounds.bound, strategy=bounds.strategy,
            retry_after=retry_after, circuit_open=True)

    def publish(self, queue: str, job_id: str, job_type: str, send: Callable[[], None],
                read_depth: DepthReader | None = None) -> None:
        """Run ``send`` (one confirmed publish that raises :class:`QueueFullNacked` on a
        rejection) under the queue's strategy, retries and circuit breaker; the last
        refusal reaches the caller (:class:`QueueFullRefused` when the open circuit
        breaker sent nothing)."""
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
            error: QueueFullError
            if wait:
                error = self._circuit_open(queue, job_id, bounds, wait)
            else:
                try:
                    send()
                except QueueFullNacked as exc:
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
        publishes into: refuse the whole batch (:class:`BatchQueueFullRefused`, nothing
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
                      retry_after: float | None = None) -> BatchQueueFullRefused:
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
        return BatchQueueFullRefused(
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
        job ids; then a :class:`BatchQueueFullNacked` with ``error``'s lists (the
        nacks of full queues named as such), describing the first full queue.

        Counted in ``ojs.backpressure.rejected_total``; one ``backpressure.rejected``
        per full queue.
        """
        by_queue: dict[str, list[BatchJob]] = {}
        for job in jobs:
            if job.job_id in nacked and job.delay_ms <= 0:
                by_queue.setdefault(job.queue, []).append(job)
        full: list[QueueFullNacked] = []
        rejected = dict(error.rejected)
        for queue, refused in by_queue.items():
            first = self.nack_error(queue, refused[0].job_id, read_depth)
            if not isinstance(first, QueueFullNacked):
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
        return BatchQueueFullNacked(
            f"queue(s) {names} full (depth {head.depth}, bound {head.bound}); retry after "
            f"{head.retry_after:g}s: {error}", queue=head.queue or "", depth=head.depth,
            bound=head.bound, strategy=head.strategy, retry_after=head.retry_after,
            rejected=rejected, unconfirmed=error.unconfirmed, accepted=error.accepted)


class BatchJob(Protocol):
    """What the monitor reads of a batch's job (``ojs_kombu.spec.codec.OutgoingJob``)."""

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
