"""The OJS event catalog (``ojs-events.md`` section 3) and its data models (section 4).

Pure code: no I/O.  Each event type has a data model (:data:`DATA_MODELS`)
holding exactly the fields section 4 lists, so an event whose ``data`` would
not conform is refused (a consumer dashboard must be able to rely on
``duration_ms`` being there).

Choices where the spec leaves room:

* ``data`` is open: fields beyond the section 4 tables are kept.  The
  official schema allows them (``additionalProperties: true``) and the spec
  itself adds one (``trace_id``, section 8.3); a misspelt *optional* field is
  therefore not caught.
* ``null`` for an optional field means "absent" and is not written, except
  for ``job.completed``'s ``result``, which section 4 types "object or null".
* Timestamps are accepted as aware datetimes or RFC 3339 strings with an
  offset, and written in UTC with ``Z`` (:mod:`ojs_kombu.spec.times`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    StringConstraints,
)

from ..spec.times import format_time, parse_time

#: The section 3 catalog (and the ``type`` enum of ``event.schema.json``).
EventType = Literal[
    "job.enqueued",
    "job.started",
    "job.completed",
    "job.failed",
    "job.discarded",
    "job.retrying",
    "job.cancelled",
    "job.heartbeat",
    "job.scheduled",
    "job.expired",
    "job.progress",
    "queue.paused",
    "queue.resumed",
    "worker.started",
    "worker.stopped",
    "worker.quiet",
    "worker.heartbeat",
    "workflow.started",
    "workflow.step_completed",
    "workflow.completed",
    "workflow.failed",
    "cron.triggered",
    "cron.skipped",
]
EVENT_TYPES: tuple[str, ...] = get_args(EventType)


def _to_datetime(value: Any) -> Any:
    """An aware datetime of an RFC 3339 string or a datetime; anything else fails
    later, with pydantic's own message."""
    if isinstance(value, str | datetime):
        return parse_time(value, offset_required=True)
    return value


def _json_time(value: datetime) -> str:
    # A one-argument function: pydantic would take a second parameter for its ``info``.
    return format_time(value)


#: RFC 3339 timestamp: an aware datetime in Python, UTC with ``Z`` in JSON.
Timestamp = Annotated[
    datetime,
    BeforeValidator(_to_datetime),
    PlainSerializer(_json_time, return_type=str, when_used="json"),
]
NonEmptyStr = Annotated[str, StringConstraints(min_length=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
#: Attempt numbers are 1-indexed (section 4).
Attempt = Annotated[int, Field(ge=1)]
#: W3C trace-id: 32 lowercase hex digits (sections 8.2, 8.3), not the whole ``traceparent``.
TraceId = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]


class EventData(BaseModel):
    """Base of the section 4 data models: strict types, unknown fields kept."""

    model_config = ConfigDict(defer_build=True, strict=True, extra="allow", allow_inf_nan=False)

    #: Optional fields for which an explicit ``null`` is meaningful and written.
    _nullable: ClassVar[frozenset[str]] = frozenset()

    def to_data(self) -> dict[str, Any]:
        """The JSON ``data`` object: given fields only, ``null`` optional fields left out."""
        out = self.model_dump(mode="json", exclude_unset=True, exclude_none=True)
        for name in self._nullable & self.model_fields_set:
            if getattr(self, name) is None:
                out[name] = None
        return out


class ErrorInfo(BaseModel):
    """``error`` of ``job.retrying``, ``workflow.failed``; ``last_error`` of ``job.discarded``."""

    model_config = ConfigDict(defer_build=True, strict=True, extra="allow")

    code: NonEmptyStr
    message: str  # may be empty: str() of a bare exception is


class JobFailedError(ErrorInfo):
    """``error`` of ``job.failed``: section 4 adds ``retryable`` and ``stack_trace`` here only."""

    retryable: bool
    stack_trace: str | None = None


class _JobData(EventData):
    job_type: NonEmptyStr
    queue: NonEmptyStr
    #: Required when the job carries trace context (section 8.3); the spec mentions it on
    #: job events only, other types may still carry it as an extra field.
    trace_id: TraceId | None = None


class JobEnqueuedData(_JobData):
    priority: int | None = None
    scheduled_at: Timestamp | None = None
    unique_key: str | None = None


class JobStartedData(_JobData):
    worker_id: NonEmptyStr
    attempt: Attempt


class JobCompletedData(_JobData):
    _nullable: ClassVar[frozenset[str]] = frozenset({"result"})

    duration_ms: NonNegativeInt
    attempt: Attempt
    result: dict[str, Any] | None = None


class JobFailedData(_JobData):
    attempt: Attempt
    error: JobFailedError
    duration_ms: NonNegativeInt | None = None


class JobDiscardedData(_JobData):
    total_attempts: Attempt
    last_error: ErrorInfo


class JobRetryingData(_JobData):
    attempt: Attempt
    max_attempts: Attempt
    next_retry_at: Timestamp
    error: ErrorInfo


class JobCancelledData(_JobData):
    cancelled_by: str | None = None
    reason: str | None = None


class JobHeartbeatData(_JobData):
    worker_id: NonEmptyStr
    attempt: Attempt
    visible_until: Timestamp


class JobScheduledData(_JobData):
    scheduled_at: Timestamp


class JobExpiredData(_JobData):
    created_at: Timestamp
    expired_at: Timestamp
    ttl_ms: NonNegativeInt


class JobProgressData(_JobData):
    worker_id: NonEmptyStr
    attempt: Attempt
    progress_percent: Annotated[float, Field(ge=0, le=100)]
    progress_message: str | None = None


class QueuePausedData(EventData):
    queue: NonEmptyStr
    paused_by: str | None = None


class QueueResumedData(EventData):
    queue: NonEmptyStr
    resumed_by: str | None = None


class WorkerStartedData(EventData):
    worker_id: NonEmptyStr
    queues: list[NonEmptyStr]
    concurrency: Annotated[int, Field(ge=1)]


class WorkerStoppedData(EventData):
    worker_id: NonEmptyStr
    reason: Literal["shutdown", "signal", "error"]
    jobs_completed: NonNegativeInt | None = None
    uptime_ms: NonNegativeInt | None = None


class WorkerQuietData(EventData):
    worker_id: NonEmptyStr
    active_jobs: NonNegativeInt


class WorkerHeartbeatData(EventData):
    worker_id: NonEmptyStr
    active_jobs: NonNegativeInt
    queues: list[NonEmptyStr]
    memory_mb: Annotated[float, Field(ge=0)] | None = None
    cpu_percent: Annotated[float, Field(ge=0)] | None = None  # > 100 on several cores


class _WorkflowData(EventData):
    workflow_id: NonEmptyStr
    workflow_name: str


class WorkflowStartedData(_WorkflowData):
    total_steps: NonNegativeInt


class WorkflowStepCompletedData(_WorkflowData):
    step_id: NonEmptyStr
    step_type: NonEmptyStr
    duration_ms: NonNegativeInt
    steps_remaining: NonNegativeInt


class WorkflowCompletedData(_WorkflowData):
    total_steps: NonNegativeInt
    duration_ms: NonNegativeInt


class WorkflowFailedData(_WorkflowData):
    failed_step_id: NonEmptyStr
    failed_step_type: NonEmptyStr
    error: ErrorInfo


class _CronData(EventData):
    cron_name: NonEmptyStr
    cron_expr: NonEmptyStr
    job_type: NonEmptyStr


class CronTriggeredData(_CronData):
    job_id: NonEmptyStr
    scheduled_at: Timestamp


class CronSkippedData(_CronData):
    reason: NonEmptyStr
    existing_job_id: str | None = None


DATA_MODELS: dict[str, type[EventData]] = {
    "job.enqueued": JobEnqueuedData,
    "job.started": JobStartedData,
    "job.completed": JobCompletedData,
    "job.failed": JobFailedData,
    "job.discarded": JobDiscardedData,
    "job.retrying": JobRetryingData,
    "job.cancelled": JobCancelledData,
    "job.heartbeat": JobHeartbeatData,
    "job.scheduled": JobScheduledData,
    "job.expired": JobExpiredData,
    "job.progress": JobProgressData,
    "queue.paused": QueuePausedData,
    "queue.resumed": QueueResumedData,
    "worker.started": WorkerStartedData,
    "worker.stopped": WorkerStoppedData,
    "worker.quiet": WorkerQuietData,
    "worker.heartbeat": WorkerHeartbeatData,
    "workflow.started": WorkflowStartedData,
    "workflow.step_completed": WorkflowStepCompletedData,
    "workflow.completed": WorkflowCompletedData,
    "workflow.failed": WorkflowFailedData,
    "cron.triggered": CronTriggeredData,
    "cron.skipped": CronSkippedData,
}
