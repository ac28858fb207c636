"""The observation floor: OJS lifecycle events, metrics and tracing.

Events (``ojs-events.md``: the envelope, per-type data, the in-process bus and
its sinks), OpenTelemetry metrics and trace-context helpers.  Modules here may
import :mod:`ojs_kombu.spec`, the standard library and OpenTelemetry's API;
never kombu, py-amqp or Celery.  A sink that publishes over AMQP is handed a
publish function by the floor above.
"""

from __future__ import annotations

from .bus import EventBus, EventFilter, Subscription
from .catalog import (
    DATA_MODELS,
    EVENT_TYPES,
    CronSkippedData,
    CronTriggeredData,
    ErrorInfo,
    EventData,
    EventType,
    JobCancelledData,
    JobCompletedData,
    JobDiscardedData,
    JobEnqueuedData,
    JobExpiredData,
    JobFailedData,
    JobFailedError,
    JobHeartbeatData,
    JobProgressData,
    JobRetryingData,
    JobScheduledData,
    JobStartedData,
    QueuePausedData,
    QueueResumedData,
    WorkerHeartbeatData,
    WorkerQuietData,
    WorkerStartedData,
    WorkerStoppedData,
    WorkflowCompletedData,
    WorkflowFailedData,
    WorkflowStartedData,
    WorkflowStepCompletedData,
)
from .models import (
    DATA_CONTENT_TYPE,
    EVENT_ID_PREFIX,
    SPEC_VERSION,
    Event,
    event_source,
    make_event,
    new_event_id,
    validate_data,
)

__all__ = [
    "DATA_CONTENT_TYPE",
    "DATA_MODELS",
    "EVENT_ID_PREFIX",
    "EVENT_TYPES",
    "SPEC_VERSION",
    "CronSkippedData",
    "CronTriggeredData",
    "ErrorInfo",
    "Event",
    "EventBus",
    "EventData",
    "EventFilter",
    "EventType",
    "JobCancelledData",
    "JobCompletedData",
    "JobDiscardedData",
    "JobEnqueuedData",
    "JobExpiredData",
    "JobFailedData",
    "JobFailedError",
    "JobHeartbeatData",
    "JobProgressData",
    "JobRetryingData",
    "JobScheduledData",
    "JobStartedData",
    "QueuePausedData",
    "QueueResumedData",
    "Subscription",
    "WorkerHeartbeatData",
    "WorkerQuietData",
    "WorkerStartedData",
    "WorkerStoppedData",
    "WorkflowCompletedData",
    "WorkflowFailedData",
    "WorkflowStartedData",
    "WorkflowStepCompletedData",
    "event_source",
    "make_event",
    "new_event_id",
    "validate_data",
]
