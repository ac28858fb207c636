"""Batch enqueue against bounded queues (``ojs-backpressure.md`` section 9.3).

Before a batch is sent, :func:`admit` refuses it whole while a bounded queue it
publishes into cannot take its jobs (nothing is sent); after, :func:`nacked_error`
names the jobs a full queue nacked when another producer won the race.  AMQP has
no transaction that spans confirms, so these two are all a producer can do.
:class:`BackpressureMonitor` offers both as ``admit_batch`` and ``batch_error``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

from ...spec.backoff import backoff
from ...spec.backpressure import Bounds
from ...spec.errors import (
    BatchPublishError,
    BatchQueueFullNacked,
    BatchQueueFullRefused,
    QueueFullNacked,
)
from .state import DepthReader, Monitor


class BatchJob(Protocol):
    """What the monitor reads of a batch's job (``ojs_kombu.spec.encode.OutgoingJob``)."""

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

    def __init__(self, monitor: Monitor, queues: Mapping[str, list[BatchJob]]
                 ) -> None:
        self.monitor = monitor
        self.queues = queues
        self.trials: list[str] = []

    def settle(self, nacked: Collection[str], read_depth: DepthReader | None = None) -> None:
        """A queue whose jobs were all accepted closes its breaker (and samples its
        depth, as after a single publish); one with a nacked job counts a failure."""
        monitor = self.monitor
        for queue, queued in self.queues.items():
            state = monitor.queue_state(queue)
            if any(job.job_id in nacked for job in queued):
                if state.breaker is not None:
                    state.breaker.failure()
                continue
            state.consecutive = 0
            if state.breaker is not None:
                state.breaker.success()
            monitor.sample(queue, monitor.bounds_for(queue), state, read_depth)
        self.trials.clear()

    def release(self) -> None:
        """Free the breakers' trials without a verdict (no-op after :meth:`settle`)."""
        for queue in self.trials:
            breaker = self.monitor.queue_state(queue).breaker
            if breaker is not None:
                breaker.release()
        self.trials.clear()


def admit(monitor: Monitor, jobs: Sequence[BatchJob],
          read_depth: DepthReader | None = None) -> BatchAdmission:
    """Section 9.3 before a batch is sent, for each ``reject``/``block`` queue it
    publishes into: refuse the whole batch (:class:`BatchQueueFullRefused`, nothing
    is sent) while the queue's circuit breaker is open, or when its jobs do not
    fit at the depth read now; a ``block`` queue first waits for room, reading the
    depth again, up to its ``block_timeout``.

    A race with other producers can still get part of the batch nacked; see
    :func:`nacked_error`.  Report the broker's answer to the returned admission.
    """
    by_queue: dict[str, list[BatchJob]] = {}
    for job in jobs:
        if job.delay_ms <= 0:  # scheduled jobs enter their queue later
            by_queue.setdefault(job.queue, []).append(job)
    bounded = {q: queued for q, queued in by_queue.items() if monitor.bounds_for(q).rejects}
    admission = BatchAdmission(monitor, bounded)
    if not bounded:
        return admission
    try:
        for queue, queued in bounded.items():
            breaker = monitor.queue_state(queue).breaker
            wait = breaker.allow() if breaker is not None else 0.0
            if wait:
                raise _refuse(monitor, jobs, queue, queued, None, circuit_open=True,
                              retry_after=wait)
            admission.trials.append(queue)
        for queue, queued in bounded.items():
            _wait_for_room(monitor, jobs, queue, queued, read_depth)
    except BaseException:
        admission.release()
        raise
    return admission


def _wait_for_room(monitor: Monitor, jobs: Sequence[BatchJob], queue: str,
                   queued: list[BatchJob], read_depth: DepthReader | None) -> None:
    bounds = monitor.bounds_for(queue)
    count = len(queued)
    fits_at_all = bounds.max_depth is None or count <= bounds.max_depth
    deadline = (monitor.clock() + bounds.block_timeout
                if bounds.strategy == "block" and fits_at_all else None)
    waits = 0
    while True:
        depth = monitor.depth(read_depth, queue)
        if depth is None or bounds.max_depth is None or depth + count <= bounds.max_depth:
            return  # the broker still enforces the bound: see nacked_error
        pause = 0.0
        if deadline is not None:
            waits += 1
            pause = min(max(monitor.settings.block_poll, backoff(
                monitor.settings.block_poll, monitor.settings.max_retry_delay, waits)),
                deadline - monitor.clock())
        if pause <= 0:
            state = monitor.queue_state(queue)
            state.consecutive += 1
            state.pressure = bounds.pressure(depth)
            if state.breaker is not None:
                state.breaker.failure()
            raise _refuse(monitor, jobs, queue, queued, depth)
        monitor.sleep(pause)


def _refuse(monitor: Monitor, jobs: Sequence[BatchJob], queue: str,
            queued: list[BatchJob], depth: int | None, *, circuit_open: bool = False,
            retry_after: float | None = None) -> BatchQueueFullRefused:
    """The error of a batch refused before sending: every job of it is rejected."""
    bounds = monitor.bounds_for(queue)
    retry_after = monitor.retry_after(queue) if retry_after is None else retry_after
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
    if not circuit_open:
        monitor.refused(queue, len(queued))
    _emit_rejected(monitor, queue, queued, bounds, depth, retry_after, circuit_open)
    return BatchQueueFullRefused(
        f"batch of {len(jobs)} job(s) not enqueued: queue {queue!r} cannot take its "
        f"{len(queued)} job(s): {why}; nothing was sent; retry after {retry_after:g}s",
        queue=queue, depth=depth, bound=bounds.bound, strategy=bounds.strategy,
        retry_after=retry_after, circuit_open=circuit_open, rejected=rejected)


def _emit_rejected(monitor: Monitor, queue: str, queued: Sequence[BatchJob],
                   bounds: Bounds, depth: int | None, retry_after: float,
                   circuit_open: bool) -> None:
    """One ``backpressure.rejected`` per queue and batch (``count`` jobs); ``job_type``
    when they share one."""
    types = {job.job_type for job in queued}
    monitor.emit("backpressure.rejected", queue, depth=depth, bound=bounds.bound,
                 job_type=types.pop() if len(types) == 1 else None, count=len(queued),
                 strategy=bounds.strategy, retry_after=retry_after,
                 circuit_open=circuit_open or None)


def nacked_error(monitor: Monitor, jobs: Sequence[BatchJob],
                 error: BatchPublishError, nacked: Collection[str],
                 read_depth: DepthReader | None = None) -> BatchPublishError:
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
        first = monitor.nack_error(queue, refused[0].job_id, read_depth)
        if not isinstance(first, QueueFullNacked):
            continue
        if len(refused) > 1:
            monitor.refused(queue, len(refused) - 1)
        bounds = monitor.bounds_for(queue)
        _emit_rejected(monitor, queue, refused, bounds, first.depth, first.retry_after, False)
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
