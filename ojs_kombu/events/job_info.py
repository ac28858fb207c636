"""What every job event says about its job: :class:`JobInfo`, read once per delivery."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ..spec.times import parse_time
from ..spec.trace_context import trace_id_of
from .metrics import labels


class JobInfo:
    """What every job event says about its job."""

    __slots__ = ("_enqueued_at", "_labels", "_trace_id", "attempt", "cancel", "job_id",
                 "job_type", "queue")

    def __init__(self, job_id: str, job_type: str, queue: str, attempt: int = 0,
                 trace_id: str | None = None, enqueued_at: datetime | None = None) -> None:
        self.job_id = job_id
        self.job_type = job_type
        self.queue = queue
        self.attempt = attempt
        #: the trace id, or the ``traceparent`` header as it came (parsed when first read)
        self._trace_id: str | tuple[str] | None = trace_id
        #: a datetime, or ``x-ojs-enqueued-at`` as it came (parsed when first read)
        self._enqueued_at: datetime | str | None = enqueued_at
        #: Why a CANCEL of this running job was not carried out (its pool cannot end it):
        #: every later event of the job says so in ``data.cancel``, as INFO does.
        self.cancel: str | None = None
        self._labels: dict[str, str] | None = None

    @classmethod
    def from_headers(cls, job_id: str, job_type: str, queue: str,
                     headers: Mapping[str, Any]) -> JobInfo:
        attempt = headers.get("x-ojs-attempt")
        info = cls(job_id, job_type, queue, attempt if isinstance(attempt, int) and attempt > 0
                   else 1)
        traceparent = headers.get("x-ojs-trace-id") or headers.get("x-ojs-traceparent")
        if traceparent is not None:  # read by the first event that says it
            info._trace_id = (traceparent,)
        enqueued_at = headers.get("x-ojs-enqueued-at")
        if isinstance(enqueued_at, str):
            info._enqueued_at = enqueued_at
        return info

    @property
    def trace_id(self) -> str | None:
        """The trace id of the job's ``traceparent`` (``x-ojs-trace-id``), parsed on the
        first read: a job's events read it only when something hears them."""
        value = self._trace_id
        if isinstance(value, tuple):
            value = self._trace_id = trace_id_of(value[0])
        return value

    @property
    def enqueued_at(self) -> datetime | None:
        """When the job was enqueued (``x-ojs-enqueued-at``), parsed on the first read:
        only the wait metric reads it, and only when an OpenTelemetry SDK records it."""
        value = self._enqueued_at
        if isinstance(value, str):
            value = self._enqueued_at = _timestamp(value)
        return value

    def data(self) -> dict[str, Any]:
        """A new dict of the job's fields every job event carries (no ``None`` values)."""
        data = {"job_type": self.job_type, "queue": self.queue}
        if self.trace_id is not None:
            data["trace_id"] = self.trace_id
        if self.cancel is not None:
            data["cancel"] = self.cancel
        return data

    def labels(self) -> dict[str, str]:
        if self._labels is None:  # several metrics per job take the same labels
            self._labels = labels(self.job_type, self.queue)
        return self._labels


def _timestamp(value: Any) -> datetime | None:
    """``x-ojs-enqueued-at`` as a datetime; ``None`` when another producer wrote none
    that reads as one (the wait is then not measured)."""
    if not isinstance(value, str):
        return None
    try:
        return parse_time(value)
    except ValueError:
        return None
