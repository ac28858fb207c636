"""The OJS job envelope (``job.schema.json``) as pydantic v2 models.

Validation is strict (JSON types are not coerced: ``"30"`` is not a timeout)
so that the model accepts exactly what the official schema accepts.  Unknown
top-level attributes are kept in ``model_extra`` and written back unchanged,
and serialisation only writes attributes that were present on input, so a
parse/serialise round trip preserves the document's meaning.
"""

from __future__ import annotations

from datetime import timedelta
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    field_validator,
    model_validator,
)

from .naming import JOB_ID_RE, JOB_TYPE_MAX, JOB_TYPE_RE, QUEUE_MAX, QUEUE_RE

SPEC_VERSION = "1.0"
CONTENT_TYPE = "application/openjobspec+json"

#: ISO 8601 duration as the schemas spell it (``PT1S``, ``P1D``, ``PT0.5S``).
DURATION_PATTERN = (
    r"^P(?:\d+Y)?(?:\d+M)?(?:\d+W)?(?:\d+D)?(?:T(?:\d+H)?(?:\d+M)?(?:\d+(?:\.\d+)?S)?)?$"
)

JobState = Literal[
    "scheduled", "available", "pending", "active", "completed", "retryable", "cancelled",
    "discarded",
]
Duration = Annotated[str, StringConstraints(pattern=DURATION_PATTERN)]
NonEmptyStr = Annotated[str, StringConstraints(min_length=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]

_timedelta = TypeAdapter(timedelta)


@lru_cache(maxsize=256)
def parse_duration(value: str) -> timedelta:
    """Parse an ISO 8601 duration (pydantic does the parsing; the pattern guards the form).

    Cached: every consumed job with a retry policy validates its two intervals, and
    the intervals in use are few."""
    return _timedelta.validate_python(value)


def _unique(values: list[Any] | None, field: str) -> list[Any] | None:
    if values is not None and len(set(values)) != len(values):
        raise ValueError(f"{field} items must be unique")
    return values


class _Strict(BaseModel):
    model_config = ConfigDict(defer_build=True, strict=True, extra="forbid", populate_by_name=True)


class RetryPolicy(_Strict):
    """``retry-policy.schema.json``.  Defaults are the spec's; only given fields are written."""

    max_attempts: NonNegativeInt = 3
    initial_interval: Duration = "PT1S"
    backoff_coefficient: Annotated[float, Field(ge=1.0, strict=False)] = 2.0
    max_interval: Duration = "PT5M"
    jitter: bool = True
    non_retryable_errors: list[NonEmptyStr] = Field(default_factory=list)
    on_exhaustion: Literal["discard", "dead_letter"] = "discard"

    @field_validator("non_retryable_errors")
    @classmethod
    def _errors_unique(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("non_retryable_errors items must be unique")
        return value

    @model_validator(mode="after")
    def _intervals(self) -> RetryPolicy:
        problem = _interval_problem(self.initial_interval, self.max_interval)
        if problem is not None:
            raise ValueError(problem)
        return self


@lru_cache(maxsize=256)
def _interval_problem(initial_interval: str, max_interval: str) -> str | None:
    """What the schema's descriptions refuse in a policy's intervals (initial_interval
    MUST be > 0, max_interval MUST be >= initial_interval), or ``None``.

    Cached: every consumed job with a retry policy checks its pair, and the pairs in
    use are few."""
    initial = parse_duration(initial_interval)
    if initial.total_seconds() <= 0:
        return "retry.initial_interval must be greater than zero"
    if parse_duration(max_interval) < initial:
        return "retry.max_interval must be >= retry.initial_interval"
    return None


UniqueKey = Literal["type", "queue", "args", "meta"]


def _type_only() -> list[UniqueKey]:
    return ["type"]


class UniquePolicy(_Strict):
    """``unique-policy.schema.json``."""

    keys: list[UniqueKey] = Field(default_factory=_type_only)
    args_keys: list[NonEmptyStr] | None = None
    meta_keys: Annotated[list[NonEmptyStr], Field(min_length=1)] | None = None
    period: Duration | None = None
    states: list[JobState] | None = None
    on_conflict: Literal["reject", "replace", "replace_except_schedule", "ignore"] = "reject"

    @field_validator("keys", "args_keys", "meta_keys", "states")
    @classmethod
    def _items_unique(cls, value: list[Any] | None, info: Any) -> list[Any] | None:
        return _unique(value, info.field_name)

    @model_validator(mode="after")
    def _meta_needs_meta_keys(self) -> UniquePolicy:
        if "meta" in self.keys and not self.meta_keys:
            raise ValueError("unique.meta_keys is required when unique.keys contains 'meta'")
        return self


class JobError(_Strict):
    """``error.schema.json``: the most recent failure."""

    type: NonEmptyStr
    message: NonEmptyStr
    backtrace: Annotated[list[str], Field(max_length=50)] | None = None


class ErrorEntry(BaseModel):
    """One item of the ``errors`` history; unknown keys are kept."""

    model_config = ConfigDict(defer_build=True, strict=True, extra="allow")

    code: NonEmptyStr
    message: NonEmptyStr
    type: str | None = None
    attempt: Annotated[int, Field(ge=1)]
    occurred_at: AwareDatetime


class JobEnvelope(BaseModel):
    """An OJS job (``job.schema.json``)."""

    model_config = ConfigDict(defer_build=True, strict=True, extra="allow", populate_by_name=True)

    specversion: Literal["1.0"]
    id: Annotated[str, StringConstraints(pattern=JOB_ID_RE.pattern)]
    type: Annotated[
        str, StringConstraints(min_length=1, max_length=JOB_TYPE_MAX, pattern=JOB_TYPE_RE.pattern)
    ]
    queue: Annotated[str, StringConstraints(max_length=QUEUE_MAX, pattern=QUEUE_RE.pattern)]
    args: list[Any]
    meta: dict[str, Any] | None = None
    priority: int | None = None
    timeout: NonNegativeInt | None = None
    scheduled_at: AwareDatetime | None = None
    expires_at: AwareDatetime | None = None
    retry: RetryPolicy | None = None
    unique: UniquePolicy | None = None
    schema_uri: str | None = Field(default=None, alias="schema")
    state: JobState | None = None
    attempt: NonNegativeInt | None = None
    created_at: AwareDatetime | None = None
    enqueued_at: AwareDatetime | None = None
    started_at: AwareDatetime | None = None
    completed_at: AwareDatetime | None = None
    error: JobError | None = None
    result: Any = None
    errors: list[ErrorEntry] | None = None

    @classmethod
    def from_json(cls, data: bytes | str) -> JobEnvelope:
        return cls.model_validate_json(data)

    def to_json(self) -> bytes:
        """Serialise only what the job holds: absent attributes stay absent."""
        return self.model_dump_json(by_alias=True, exclude_unset=True).encode()

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)

    @property
    def extensions(self) -> dict[str, Any]:
        """Top-level attributes this version of the spec does not define."""
        return dict(self.model_extra or {})
