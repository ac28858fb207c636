"""The named moments of ojs_kombu, and :class:`Observer`, which has a no-op method for each.

In the spirit of Dramatiq's middleware: the transport and the Celery wiring
say "this happened" through one :class:`~ojs_kombu.events.hook.Hook`, which
calls every registered observer that overrides the moment.  The OJS event
emitter (:class:`~ojs_kombu.events.emitter.JobEvents`) and the metrics
(:class:`~ojs_kombu.events.metric_observer.MetricsObserver`) are observers;
so is any user middleware (``ojs_kombu.add_observer(app, observer)``).

Override only the moments you need: a moment no observer overrides is never
dispatched.  A method runs on the thread where the moment happens (a pool
thread, the worker's event loop, a producer's thread), so it must be quick
and thread-safe; one that raises is logged and counted, never raised into
the job or the other observers.  Pure code: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from .job_info import JobInfo

#: ``data`` of the moments that carry a free-form payload: the fields of the
#: event they become (``None`` values left out).
Data = Mapping[str, Any]


class Observer:
    """Base of every observer: one no-op method per moment (see :data:`MOMENTS`)."""

    def awake(self) -> bool:
        """Whether the observer does anything now (not a moment).

        An observer that is idle for a while (the OJS event emitter with no
        subscriber, the metrics with no OpenTelemetry SDK) returns ``False``: the
        hook then skips it, and a moment whose observers all sleep is not worth
        building its arguments for (:meth:`~ojs_kombu.events.hook.Hook.listens`).
        Asked at every moment, so it must be cheap; the default is always awake.
        """
        return True

    # -- a job's lifecycle (OJS events section 4.1) --------------------------

    def job_enqueued(self, job: JobInfo, priority: int | None, delay_s: float) -> None:
        """A job is about to be published (``delay_s`` > 0: it is scheduled)."""

    def job_started(self, job: JobInfo, worker_id: str) -> None:
        """A worker started an attempt."""

    def job_completed(self, job: JobInfo, duration_s: float, result: Any) -> None:
        """An attempt succeeded; ``result`` is the task's return value (or ``None``)."""

    def job_failed(self, job: JobInfo, code: str, message: str, retryable: bool,
                   stack_trace: str | None) -> None:
        """An attempt failed; ``job_retrying`` or ``job_discarded`` follows."""

    def job_retrying(self, job: JobInfo, code: str, message: str, max_attempts: int,
                     delay_s: float) -> None:
        """A failed job will run again in ``delay_s`` seconds."""

    def job_discarded(self, job: JobInfo, code: str, message: str) -> None:
        """A failed job will not run again (dead-lettered or dropped): terminal failure."""

    def job_expired(self, job: JobInfo, created_at: datetime | None,
                    expired_at: datetime) -> None:
        """A job was consumed after its ``expires_at``; it is dead-lettered, never run."""

    def job_cancelled(self, job: JobInfo, cancelled_by: str | None, reason: str | None) -> None:
        """A job was cancelled (before or while it ran)."""

    def job_progress(self, job: JobInfo, worker_id: str, percent: float,
                     message: str | None) -> None:
        """A running task reported progress (``self.ojs.progress``)."""

    def job_heartbeat(self, job: JobInfo, worker_id: str, visible_until: datetime) -> None:
        """A worker extended a long-running job's visibility."""

    # -- AMQP messages (binding section 12.1) --------------------------------

    def message_published(self, queue: str, count: int) -> None:
        """``count`` job messages for ``queue`` were confirmed by the broker."""

    def message_confirmed(self, seconds: float) -> None:
        """One confirmed publish took ``seconds`` from send to the broker's confirm."""

    def message_consumed(self, queue: str) -> None:
        """A job delivery from ``queue`` arrived (before it is decoded)."""

    def message_returned(self, queue: str) -> None:
        """The broker returned a message (``Basic.Return``: nothing bound for it)."""

    def message_acked(self, queue: str) -> None:
        """A job delivery from ``queue`` was acknowledged."""

    def message_nacked(self, queue: str) -> None:
        """A job delivery from ``queue`` was negatively acknowledged."""

    # -- connections (binding sections 10.4 and 11.3) ------------------------

    def connection_failed(self, role: str) -> None:
        """An attempt to (re)connect failed (``role``: ``worker`` or ``client``)."""

    def connection_reconnected(self, role: str, data: Data) -> None:
        """A lost connection is back (``broker``, ``attempts``, ``duration_ms`` ...)."""

    def consumer_cancelled(self, queue: str, data: Data) -> None:
        """The broker cancelled a consumer (``Basic.Cancel``); it will consume again."""

    # -- backpressure (backpressure extension section 10) --------------------

    def backpressure_refused(self, queue: str, count: int) -> None:
        """The broker refused ``count`` jobs at ``queue``'s bound (each attempt counts)."""

    def backpressure_rejected(self, queue: str, data: Data) -> None:
        """A refusal reached the caller (after the retries, or by the circuit breaker)."""

    def backpressure_warning(self, queue: str, data: Data) -> None:
        """``queue``'s depth crossed ``warn_at``."""

    def backpressure_cleared(self, queue: str, data: Data) -> None:
        """``queue``'s depth went back below ``warn_at``."""

    def backpressure_dropped(self, queue: str, data: Data) -> None:
        """A ``drop_oldest`` queue dropped a job (reported by a worker of the queue)."""

    # -- workers and beat (OJS events sections 4.3 and 4.5) ------------------

    def worker_started(self, worker_id: str, data: Data) -> None:
        """A worker started consuming (``queues``, ``concurrency``)."""

    def worker_heartbeat(self, worker_id: str, data: Data) -> None:
        """A worker's periodic liveness report."""

    def worker_quiet(self, worker_id: str, data: Data) -> None:
        """A worker stopped fetching jobs (it is shutting down)."""

    def worker_stopped(self, worker_id: str, data: Data) -> None:
        """A worker stopped."""

    def cron_triggered(self, cron_name: str, data: Data) -> None:
        """``celery beat`` enqueued a periodic job."""

    def cron_skipped(self, cron_name: str, data: Data) -> None:
        """``celery beat`` skipped a periodic job (its previous one is unfinished)."""


#: Every moment, in the order above.
MOMENTS: tuple[str, ...] = tuple(
    name for name, value in vars(Observer).items()
    if callable(value) and not name.startswith("_") and name != "awake")


def overrides(observer: Observer, moment: str) -> bool:
    """Whether ``observer``'s class does something at ``moment``."""
    return getattr(type(observer), moment) is not getattr(Observer, moment)


def sleeps_at_times(observer: Observer) -> bool:
    """Whether ``observer``'s class says when it is idle (overrides :meth:`Observer.awake`)."""
    return type(observer).awake is not Observer.awake
