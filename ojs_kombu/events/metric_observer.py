"""The metrics as an observer of the hook (events spec section 7, binding section 12.1).

Section 7.4: every metric increment corresponds to an event; here both come
from the same moment, so the job's labels are built once for the two
(:meth:`JobInfo.labels`).  The instruments are :class:`OJSMetrics`'s.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from .job_info import JobInfo
from .metrics import OJSMetrics
from .observer import Data, Observer


class MetricsObserver(Observer):
    """Counts and measures what happens, on :class:`OJSMetrics`' instruments."""

    def __init__(self, metrics: OJSMetrics) -> None:
        self.metrics = metrics
        #: ``{"queue": q}`` per queue: the counters' attributes, made once per queue.
        self._queue_labels: dict[str, dict[str, str]] = {}

    def awake(self) -> bool:
        """Awake once an OpenTelemetry SDK is behind the instruments
        (:meth:`OJSMetrics.live`): until then the API would drop every value, so
        nothing is counted, as with OpenTelemetry's own counters."""
        return self.metrics.live()

    def _queue(self, queue: str) -> dict[str, str]:
        labels = self._queue_labels.get(queue)
        if labels is None:
            labels = self._queue_labels[queue] = {"queue": queue}
        return labels

    # -- jobs -----------------------------------------------------------------

    def job_enqueued(self, job: JobInfo, priority: int | None, delay_s: float) -> None:
        self.metrics.jobs_enqueued.add(1, job.labels())

    def job_started(self, job: JobInfo, worker_id: str) -> None:
        # Called only while awake (an SDK records): the hook asked already.
        enqueued_at = job.enqueued_at
        if enqueued_at is not None:
            waited = (datetime.now(UTC) - enqueued_at).total_seconds()
            self.metrics.wait.record(max(waited * 1000, 0), job.labels())

    def job_completed(self, job: JobInfo, duration_s: float, result: Any) -> None:
        labels = job.labels()
        self.metrics.jobs_completed.add(1, labels)
        self.metrics.duration.record(duration_s * 1000, labels)

    def job_discarded(self, job: JobInfo, code: str, message: str) -> None:
        self.metrics.jobs_failed.add(1, job.labels())

    # -- AMQP messages --------------------------------------------------------

    def message_published(self, queue: str, count: int) -> None:
        self.metrics.published.add(count, self._queue(queue))

    def message_confirmed(self, seconds: float) -> None:
        self.metrics.confirm_latency.record(seconds)

    def message_consumed(self, queue: str) -> None:
        self.metrics.consumed.add(1, self._queue(queue))

    def message_returned(self, queue: str) -> None:
        self.metrics.returned.add(1, self._queue(queue))

    def message_acked(self, queue: str) -> None:
        self.metrics.acked.add(1, self._queue(queue))

    def message_nacked(self, queue: str) -> None:
        self.metrics.nacked.add(1, self._queue(queue))

    # -- connections and backpressure -----------------------------------------

    def connection_failed(self, role: str) -> None:
        self.metrics.reconnections.add(1, {"outcome": "failed", "role": role})

    def connection_reconnected(self, role: str, data: Data) -> None:
        self.metrics.reconnections.add(1, {"outcome": "succeeded", "role": role})

    def backpressure_refused(self, queue: str, count: int) -> None:
        self.metrics.backpressure_rejected.add(count, self._queue(queue))

    def backpressure_dropped(self, queue: str, data: Data) -> None:
        self.metrics.backpressure_dropped.add(1, self._queue(queue))
