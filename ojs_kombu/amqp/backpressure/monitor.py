"""Producer-side backpressure (``ojs-backpressure.md`` sections 8-10) around a publish.

:class:`BackpressureMonitor` adds what the broker cannot do to a bounded queue
(whose arguments :mod:`ojs_kombu.spec.backpressure` maps): the ``block``
strategy (publish again until a timeout), producer retries with backoff, a
:class:`~ojs_kombu.amqp.backpressure.circuit_breaker.CircuitBreaker` per queue (section 8.2),
pressure sampling for the warning threshold, the ``backpressure.*`` events and
the ``ojs.backpressure.*`` metrics.  Batches go through
:mod:`ojs_kombu.amqp.backpressure.admission` (section 9.3).  Sending, reading a
queue's depth, the clock and sleeping are passed in, so every rule is unit-tested
without a broker.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from ...events.hook import Hook
from ...spec.backoff import backoff
from ...spec.backpressure import Bounds, ProducerBackpressure
from ...spec.errors import (
    BatchPublishError,
    JobNackedError,
    QueueFullError,
    QueueFullNacked,
    QueueFullRefused,
)
from .admission import BatchAdmission, BatchJob, admit, nacked_error
from .circuit_breaker import CircuitBreaker
from .state import DepthReader, QueueState

logger = logging.getLogger("ojs_kombu.amqp.backpressure.monitor")


class BackpressureMonitor:
    """A process's producer side of backpressure, per queue; thread-safe.

    ``bounds_for(queue)`` gives a queue's :class:`Bounds`; ``hook`` hears the
    ``backpressure_*`` moments (events and counters); ``metrics``, an
    :class:`~ojs_kombu.events.metrics.OJSMetrics` (or ``None``), gets the pressure gauge.
    """

    def __init__(self, settings: ProducerBackpressure, bounds_for: Callable[[str], Bounds],
                 *, hook: Hook | None = None, metrics: Any = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.settings = settings
        self.bounds_for = bounds_for
        self.hook = hook if hook is not None else Hook()
        self.clock = clock
        self.sleep = sleep
        self._lock = threading.Lock()
        self._queues: dict[str, QueueState] = {}
        if metrics is not None:
            metrics.observe_backpressure(self.pressures)

    # -- events -------------------------------------------------------------

    def emit(self, event_type: str, queue: str, **data: Any) -> None:
        """Log one ``backpressure.*`` moment and hand it to the hook."""
        details = {k: v for k, v in data.items() if v is not None}
        level = logging.INFO if event_type == "backpressure.cleared" else logging.WARNING
        logger.log(level, "%s: queue %r %s", event_type, queue, details)
        moment = getattr(self.hook, event_type.replace(".", "_"))
        moment(queue, details)

    def refused(self, queue: str, count: int) -> None:
        """The broker refused ``count`` jobs at ``queue``'s bound
        (``ojs.backpressure.rejected_total``)."""
        self.hook.backpressure_refused(queue, count)

    def dropped(self, queue: str, job_id: str | None, job_type: str | None,
                dropped_at: str | None = None) -> None:
        """A ``drop_oldest`` queue dropped a job (section 5.3): ``backpressure.dropped``
        and ``ojs.backpressure.dropped_total``.  Called by the worker that consumes
        the queue's dropped-job tap, once per dropped job."""
        self.emit("backpressure.dropped", queue, job_id=job_id, job_type=job_type,
                  dropped_at=dropped_at)

    def pressures(self) -> list[tuple[str, float]]:
        """``(queue, depth / bound)`` last sampled, for the ``ojs.backpressure.pressure`` gauge."""
        with self._lock:
            return [(q, s.pressure) for q, s in self._queues.items() if s.pressure is not None]

    # -- publishing -----------------------------------------------------------

    def queue_state(self, queue: str) -> QueueState:
        """``queue``'s state, made on first use (with a breaker when it is enabled)."""
        state = self._queues.get(queue)
        if state is None:
            with self._lock:
                breaker = (CircuitBreaker(self.settings.breaker_threshold,
                                          self.settings.breaker_cooldown, self.clock)
                           if self.settings.circuit_breaker else None)
                state = self._queues.setdefault(queue, QueueState(breaker))
        return state

    def retry_after(self, queue: str) -> float:
        """The wait recommended after the latest rejection by ``queue`` (``Retry-After``)."""
        s = self.settings
        return backoff(s.retry_delay, s.max_retry_delay, self.queue_state(queue).consecutive)

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
        state = self.queue_state(queue)
        state.consecutive += 1
        depth = self.depth(read_depth, queue)
        if depth is not None:
            state.pressure = bounds.pressure(depth)
        self.refused(queue, 1)
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
        state = self.queue_state(queue)
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
                    self.sample(queue, bounds, state, read_depth)
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

    def sample(self, queue: str, bounds: Bounds, state: QueueState,
               read_depth: DepthReader | None) -> None:
        """Read the depth after an accepted publish, at most once per ``sample_interval``."""
        if read_depth is None or bounds.max_depth is None:
            return
        now = self.clock()
        if now - state.last_sample < self.settings.sample_interval:
            return
        state.last_sample = now
        depth = self.depth(read_depth, queue)
        self.observe(queue, depth)

    def observe(self, queue: str, depth: int | None) -> None:
        """Record a depth reading: the gauge, and ``warning``/``cleared`` on crossing
        ``warn_at`` (section 10.1)."""
        bounds = self.bounds_for(queue)
        pressure = bounds.pressure(depth)
        if pressure is None:
            return
        state = self.queue_state(queue)
        state.pressure = pressure
        if pressure >= bounds.warn_at and not state.warned:
            state.warned = True
            self.emit("backpressure.warning", queue, depth=depth, bound=bounds.max_depth,
                      pressure=round(pressure, 4))
        elif pressure < bounds.warn_at and state.warned:
            state.warned = False
            self.emit("backpressure.cleared", queue, depth=depth, bound=bounds.max_depth,
                      pressure=round(pressure, 4))

    @staticmethod
    def depth(read_depth: DepthReader | None, queue: str) -> int | None:
        """``queue``'s depth from ``read_depth``, or ``None`` when it cannot be read."""
        if read_depth is None:
            return None
        try:
            return read_depth(queue)
        except Exception:  # a depth reading is a hint; never let it replace the real error
            logger.debug("could not read the depth of queue %r", queue, exc_info=True)
            return None

    # -- batches ----------------------------------------------------------------

    def admit_batch(self, jobs: Sequence[BatchJob], read_depth: DepthReader | None = None
                    ) -> BatchAdmission:
        """Section 9.3 before a batch is sent: :func:`~ojs_kombu.amqp.backpressure.admission.admit`;
        report the broker's answer to the returned admission."""
        return admit(self, jobs, read_depth)

    def batch_error(self, jobs: Sequence[BatchJob], error: BatchPublishError,
                    nacked: Collection[str], read_depth: DepthReader | None = None
                    ) -> BatchPublishError:
        """The exception for a sent batch the broker did not wholly accept:
        :func:`~ojs_kombu.amqp.backpressure.admission.nacked_error`."""
        return nacked_error(self, jobs, error, nacked, read_depth)
