"""The OJS event emitter: the observer of the hook that builds OJS events for the bus.

Nothing is built while nobody subscribes, so events cost nothing when unused.
An event that does not validate is a bug in ojs_kombu: it is logged and
counted, never raised into a job's path.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from ..spec.errors import InvalidEventData
from ..spec.times import format_time
from .bus import EventBus
from .job_info import JobInfo
from .models import Event, EventDraft, make_event, trusted_event
from .observer import Data, Observer
from .side import side_event

logger = logging.getLogger("ojs_kombu.events")

def json_result(value: Any) -> dict[str, Any] | None:
    """A task's return value as ``job.completed.result`` (an object or null).

    A non-object is wrapped as ``{"value": ...}``; one JSON cannot carry as
    ``{"repr": "..."}``.
    """
    if value is None:
        return None
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return {"repr": repr(value)[:1024]}
    return value if isinstance(value, dict) else {"value": value}


class JobEvents(Observer):
    """The OJS event emitter: the observer that turns moments into OJS events on its bus.

    Metrics are another observer's (:class:`~ojs_kombu.events.metric_observer.MetricsObserver`).
    Out-of-catalog moments (``backpressure.*``, ``connection.reconnected``,
    ``consumer.cancelled``) become OJS-envelope dicts for the subscribers
    whose filter names them (:meth:`EventBus.publish_side`).
    """

    def __init__(self, bus: EventBus, source: str) -> None:
        self.bus = bus
        self.source = source
        self.invalid = 0

    @property
    def active(self) -> bool:
        return self.awake()

    def awake(self) -> bool:
        """Awake while the bus has a subscriber: with none, no moment becomes an event."""
        return len(self.bus) > 0

    #: Validate every event against its data model before publishing it (slower;
    #: the test suites switch it on).
    validate = False

    def emit(self, event_type: str, subject: str | None = None, /, **data: Any) -> Event | None:
        """Publish one event; ``None`` values in ``data`` are left out."""
        if not self.active:
            return None
        return self._emit(event_type, subject,
                          {k: _json_ready(v) for k, v in data.items() if v is not None})

    def _emit(self, event_type: str, subject: str | None, payload: dict[str, Any]
              ) -> Event | None:
        """Publish an event whose ``payload`` is JSON-ready already (and its own)."""
        try:
            if self.validate:
                event = make_event(event_type, payload, source=self.source, subject=subject)
            else:
                event = trusted_event(event_type, payload, source=self.source, subject=subject)
        except InvalidEventData:
            self.invalid += 1
            logger.exception("ojs_kombu built an invalid %s event; it was not emitted",
                             event_type)
            return None
        self.bus.publish(event)
        return event

    def _publish_draft(self, event_type: str, subject: str, payload: dict[str, Any]) -> None:
        """Publish one of the events every job emits as a draft: background sinks build
        it on their own thread (see :class:`EventDraft`)."""
        if self.validate:
            self._emit(event_type, subject, payload)
        else:
            self.bus.publish_draft(EventDraft(event_type, payload, source=self.source,
                                              subject=subject))

    def _side(self, event_type: str, subject: str | None, data: Data) -> None:
        """An out-of-catalog event, for the subscribers that asked for its type."""
        if self.bus.wants_side(event_type):
            self.bus.publish_side(side_event(event_type, self.source, subject, data))

    # -- job lifecycle (section 4.1) ------------------------------------------

    def job_enqueued(self, job: JobInfo, priority: int | None, delay_s: float) -> None:
        if not self.active:
            return
        if delay_s > 0:
            at = datetime.now(UTC) + timedelta(seconds=delay_s)
            self.emit("job.scheduled", job.job_id, job_type=job.job_type, queue=job.queue,
                      scheduled_at=at, trace_id=job.trace_id)
        else:
            self.emit("job.enqueued", job.job_id, job_type=job.job_type, queue=job.queue,
                      priority=priority, trace_id=job.trace_id)

    def job_started(self, job: JobInfo, worker_id: str) -> None:
        if not self.active:
            return
        # The two events of every job build their data directly: emit()'s generic
        # keyword handling is a measurable share of a worker's per-job cost.
        data = job.data()
        data["worker_id"] = worker_id
        data["attempt"] = job.attempt
        self._publish_draft("job.started", job.job_id, data)

    def job_completed(self, job: JobInfo, duration_s: float, result: Any) -> None:
        if not self.active:
            return
        data = job.data()
        data["duration_ms"] = _ms(duration_s)
        data["attempt"] = job.attempt
        if result is not None:
            value = json_result(result)  # JSON-checked, so already JSON-ready
            if value is not None:
                data["result"] = value
        self._publish_draft("job.completed", job.job_id, data)

    def job_failed(self, job: JobInfo, code: str, message: str, retryable: bool,
                   stack_trace: str | None) -> None:
        error = {"code": code, "message": message, "retryable": retryable,
                 "stack_trace": stack_trace or None}
        self.emit("job.failed", job.job_id, **job.data(), attempt=job.attempt,
                  error={k: v for k, v in error.items() if v is not None})

    def job_retrying(self, job: JobInfo, code: str, message: str, max_attempts: int,
                     delay_s: float) -> None:
        self.emit("job.retrying", job.job_id, **job.data(), attempt=job.attempt,
                  max_attempts=max_attempts,
                  next_retry_at=datetime.now(UTC) + timedelta(seconds=delay_s),
                  error={"code": code, "message": message})

    def job_discarded(self, job: JobInfo, code: str, message: str) -> None:
        self.emit("job.discarded", job.job_id, **job.data(), total_attempts=job.attempt,
                  last_error={"code": code, "message": message})

    def job_expired(self, job: JobInfo, created_at: datetime | None,
                    expired_at: datetime) -> None:
        created = created_at or expired_at
        self.emit("job.expired", job.job_id, **job.data(), created_at=created,
                  expired_at=expired_at, ttl_ms=max(_ms((expired_at - created).total_seconds()), 0))

    def job_progress(self, job: JobInfo, worker_id: str, percent: float,
                     message: str | None) -> None:
        self.emit("job.progress", job.job_id, **job.data(), worker_id=worker_id,
                  attempt=job.attempt, progress_percent=percent, progress_message=message)

    def job_cancelled(self, job: JobInfo, cancelled_by: str | None, reason: str | None) -> None:
        self.emit("job.cancelled", job.job_id, **job.data(), cancelled_by=cancelled_by,
                  reason=reason)

    def job_heartbeat(self, job: JobInfo, worker_id: str, visible_until: datetime) -> None:
        self.emit("job.heartbeat", job.job_id, **job.data(), worker_id=worker_id,
                  attempt=job.attempt, visible_until=visible_until)

    # -- connections and backpressure: out of the catalog ---------------------

    def connection_reconnected(self, role: str, data: Data) -> None:
        subject = data.get("worker_id") or data.get("broker")
        self._side("connection.reconnected", subject, {"role": role, **data})

    def consumer_cancelled(self, queue: str, data: Data) -> None:
        self._side("consumer.cancelled", queue, {"queue": queue, **data})

    def backpressure_rejected(self, queue: str, data: Data) -> None:
        self._side("backpressure.rejected", queue, {"queue": queue, **data})

    def backpressure_warning(self, queue: str, data: Data) -> None:
        self._side("backpressure.warning", queue, {"queue": queue, **data})

    def backpressure_cleared(self, queue: str, data: Data) -> None:
        self._side("backpressure.cleared", queue, {"queue": queue, **data})

    def backpressure_dropped(self, queue: str, data: Data) -> None:
        self._side("backpressure.dropped", queue, {"queue": queue, **data})

    # -- workers and beat (sections 4.3 and 4.5) --------------------------------

    def worker_started(self, worker_id: str, data: Data) -> None:
        self.emit("worker.started", worker_id, worker_id=worker_id, **data)

    def worker_heartbeat(self, worker_id: str, data: Data) -> None:
        self.emit("worker.heartbeat", worker_id, worker_id=worker_id, **data)

    def worker_quiet(self, worker_id: str, data: Data) -> None:
        self.emit("worker.quiet", worker_id, worker_id=worker_id, **data)

    def worker_stopped(self, worker_id: str, data: Data) -> None:
        self.emit("worker.stopped", worker_id, worker_id=worker_id, **data)

    def cron_triggered(self, cron_name: str, data: Data) -> None:
        self.emit("cron.triggered", cron_name, **data)

    def cron_skipped(self, cron_name: str, data: Data) -> None:
        self.emit("cron.skipped", cron_name, **data)


def _json_ready(value: Any) -> Any:
    if isinstance(value, datetime):
        return format_time(value)
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    return value


def _ms(seconds: float) -> int:
    return max(round(seconds * 1000), 0)
