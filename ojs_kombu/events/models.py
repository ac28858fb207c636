"""OJS lifecycle events (``ojs-events.md``; ``event.schema.json``): the envelope.

Pure code: no I/O.  :class:`Event` is the CloudEvents-style envelope of
section 2; its ``data`` is checked against the data model of its type
(:mod:`ojs_kombu.events.catalog`), so :func:`make_event` refuses an event
whose ``data`` would not conform.  :func:`trusted_event` and
:class:`EventDraft` are the hot path for the events ojs_kombu emits itself.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from time import time as _time
from typing import Annotated, Any, Final, Literal
from urllib.parse import quote

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticSerializationError

from ..spec.errors import InvalidEventData
from ..spec.job_ids import new_job_id
from ..spec.times import format_milliseconds, format_time
from .catalog import DATA_MODELS, EVENT_TYPES, EventType, NonEmptyStr, Timestamp
from .wire import compact_json

SPEC_VERSION: Final = "1.0"
DATA_CONTENT_TYPE = "application/json"
EVENT_ID_PREFIX = "evt_"
# RFC 3986 absolute URI: a scheme, then only URI characters and well-formed %XX escapes.
_URI_RE = re.compile(
    r"^[A-Za-z][A-Za-z0-9+.\-]*:(?:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})*$"
)


def _check_uri(value: str) -> str:
    if _URI_RE.match(value) is None:
        raise ValueError(
            f"{value!r} is not a valid absolute URI (e.g. 'ojs://my-service/workers/worker-1'; "
            "build one with event_source())"
        )
    return value


def _now() -> datetime:
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


def new_event_id() -> str:
    """``evt_`` + UUIDv7 (section 2.3): unique without coordination, and time-sortable."""
    return EVENT_ID_PREFIX + new_job_id()


def event_source(service: str, component: str, instance: str | None = None) -> str:
    """``ojs://{service}/{component}/{instance}`` (section 2.4), each segment percent-quoted.

    ``instance`` may be left out for singletons (``ojs://billing-api/scheduler``).
    Quoting with no safe characters keeps a ``/`` or ``:`` inside a name from
    changing the URI's structure.
    """
    segments = [service, component] if instance is None else [service, component, instance]
    for name, segment in zip(("service", "component", "instance"), segments, strict=False):
        if not isinstance(segment, str) or not segment:
            raise ValueError(f"event source {name} must be a non-empty string, got {segment!r}")
    return "ojs://" + "/".join(quote(segment, safe="") for segment in segments)


#: The data field that section 2.2 says the ``subject`` SHOULD be, per category.
#: Job events SHOULD use the job id, which their data does not hold.
_SUBJECT_FIELDS = {"queue": "queue", "worker": "worker_id", "workflow": "workflow_id",
                   "cron": "cron_name"}


def _describe(error: Mapping[str, Any]) -> dict[str, Any]:
    described = {"loc": error["loc"], "type": error["type"], "msg": error["msg"]}
    if error["type"] != "missing":
        described["msg"] += f" (got {error['input']!r:.80})"
    return described


def validate_data(event_type: str, data: Mapping[str, Any] | BaseModel) -> dict[str, Any]:
    """Check ``data`` against ``event_type``'s data model; return its JSON-safe form.

    Raises :class:`InvalidEventData` (a :class:`ValueError`) naming the type and
    the offending fields, or :class:`ValueError` for a type outside the catalog.
    """
    model = DATA_MODELS.get(event_type)
    if model is None:
        raise ValueError(
            f"{event_type!r} is not an OJS event type; the catalog (section 3) has: "
            + ", ".join(EVENT_TYPES)
        )
    if isinstance(data, BaseModel) and not isinstance(data, model):
        data = data.model_dump(exclude_unset=True)
    try:
        parsed = model.model_validate(data)
    except ValidationError as exc:
        raise InvalidEventData(event_type, [_describe(e) for e in exc.errors()]) from None
    try:
        return parsed.to_data()
    except PydanticSerializationError as exc:
        raise InvalidEventData(event_type, [], f"not JSON-serialisable ({exc})") from None


class Event(BaseModel):
    """An OJS event envelope (section 2).

    ``data`` is checked against the data model of ``type`` (also when parsing a
    foreign event) and held in its JSON form.  Top-level attributes the spec
    does not define (CloudEvents extensions) are kept.  Use :func:`make_event`
    to build one.
    """

    model_config = ConfigDict(defer_build=True, strict=True, extra="allow", frozen=True)

    specversion: Literal["1.0"] = SPEC_VERSION
    id: NonEmptyStr = Field(default_factory=new_event_id)
    type: EventType
    source: Annotated[str, AfterValidator(_check_uri)]
    time: Timestamp = Field(default_factory=_now)
    subject: str | None = None
    datacontenttype: Literal["application/json"] | None = None
    data: dict[str, Any]

    @field_validator("data")
    @classmethod
    def _data_conforms(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        event_type = info.data.get("type")
        if event_type is None:  # ``type`` itself is invalid and already reported
            return value
        return validate_data(event_type, value)

    @classmethod
    def from_json(cls, data: bytes | str) -> Event:
        return cls.model_validate_json(data)

    def to_dict(self) -> dict[str, Any]:
        """The event as JSON-ready dict; unset optional attributes are left out.

        ``data`` is held in its JSON form already, so without extension
        attributes the dict is built directly: the AMQP sink serialises every
        event, and ``model_dump`` costs a few times more.
        """
        if self.__pydantic_extra__ or not isinstance(self.time, datetime):
            return self.model_dump(mode="json", exclude_none=True)
        return _envelope_dict(self.id, self.type, self.source, format_time(self.time),
                              self.subject, self.data, self.datacontenttype)

    def to_json(self) -> bytes:
        """Compact UTF-8 JSON."""
        return compact_json(self.to_dict())


def make_event(
    type: str,
    data: Mapping[str, Any] | BaseModel,
    *,
    source: str,
    subject: str | None = None,
    time: datetime | str | None = None,
) -> Event:
    """Build an event of ``type`` whose ``data`` conforms to section 4.

    ``time`` defaults to now (millisecond precision).  ``subject`` defaults to
    what section 2.2 says it SHOULD be where the data holds it: the queue,
    worker id, workflow id or cron name; job events need the job id passed.
    """
    payload = validate_data(type, data)
    fields: dict[str, Any] = {"type": type, "source": source, "data": payload}
    if subject is None:
        subject_field = _SUBJECT_FIELDS.get(type.split(".", 1)[0])
        subject = payload.get(subject_field) if subject_field else None
    if subject is not None:
        fields["subject"] = subject
    if time is not None:
        fields["time"] = time
    return Event(**fields)


def trusted_event(type: str, data: dict[str, Any], *, source: str,
                  subject: str | None = None) -> Event:
    """An event ojs_kombu builds itself, without validation (the hot path).

    ``data`` must already be JSON-ready (timestamps as RFC 3339 strings) and is
    taken over, not copied: the caller builds it for this event alone.  The
    test suites validate every kind of event ojs_kombu emits against the schema
    and the data models, which is what makes skipping it here safe.
    """
    return _construct(new_event_id(), type, source, _now(), subject, data)


def _construct(id: str, type: str, source: str, time: datetime, subject: str | None,
               data: dict[str, Any]) -> Event:
    # What ``Event.model_construct`` does, without its per-field loop over defaults
    # and aliases (half the cost of an event in a worker's hot path); the test
    # suite checks both give the same event.
    event = _new_object(Event)
    _set_attribute(event, "__dict__", {
        "specversion": SPEC_VERSION, "id": id, "type": type, "source": source,
        "time": time, "subject": subject, "datacontenttype": None, "data": data})
    _set_attribute(event, "__pydantic_fields_set__",
                   set(_TRUSTED_FIELDS) if subject is None else set(_TRUSTED_FIELDS_SUBJECT))
    _set_attribute(event, "__pydantic_extra__", {})
    _set_attribute(event, "__pydantic_private__", None)
    return event


def _envelope_dict(id: str, type: str, source: str, time: str, subject: str | None,
                   data: dict[str, Any], datacontenttype: str | None = None) -> dict[str, Any]:
    """An event's JSON-ready dict, in attribute order, without the unset optional ones."""
    out: dict[str, Any] = {"specversion": SPEC_VERSION, "id": id, "type": type,
                           "source": source, "time": time}
    if subject is not None:
        out["subject"] = subject
    if datacontenttype is not None:
        out["datacontenttype"] = datacontenttype
    out["data"] = data
    return out


class EventDraft:
    """An event ojs_kombu emits on every job, as the emitting thread leaves it.

    A worker emits two events per job from its pool threads.  The draft holds
    what makes the event (its id and time are fixed here, so every sink
    writes the same event) and the :class:`Event` is built only for who needs
    one: in-process subscribers get it synchronously, as always
    (:meth:`EventBus.publish_draft`), while the background sinks, which only
    serialise, take the draft itself and turn it into JSON on their own thread.
    """

    __slots__ = ("_event", "data", "id", "milliseconds", "source", "subject", "type")

    def __init__(self, type: str, data: dict[str, Any], *, source: str,
                 subject: str | None = None) -> None:
        self.type = type
        self.data = data  # JSON-ready, and taken over: built for this event alone
        self.source = source
        self.subject = subject
        self.id = new_event_id()
        self.milliseconds = int(_time() * 1000)  # since the epoch: _now()'s precision
        self._event: Event | None = None

    @property
    def time(self) -> datetime:
        return datetime.fromtimestamp(self.milliseconds / 1000, UTC)

    def event(self) -> Event:
        """The :class:`Event` (built once)."""
        if self._event is None:
            self._event = _construct(self.id, self.type, self.source, self.time, self.subject,
                                     self.data)
        return self._event

    def to_dict(self) -> dict[str, Any]:
        """What :meth:`Event.to_dict` gives for the built event."""
        return _envelope_dict(self.id, self.type, self.source,
                              format_milliseconds(self.milliseconds), self.subject, self.data)

    def to_json(self) -> bytes:
        return compact_json(self.to_dict())


_new_object = object.__new__
_set_attribute = object.__setattr__
_TRUSTED_FIELDS = frozenset({"id", "type", "source", "time", "data"})
_TRUSTED_FIELDS_SUBJECT = _TRUSTED_FIELDS | {"subject"}
# The shortcut above is only what model_construct does while Event has none of these.
assert not Event.__pydantic_post_init__ and not Event.__pydantic_root_model__
assert Event.model_config.get("extra") == "allow" and not Event.__private_attributes__
