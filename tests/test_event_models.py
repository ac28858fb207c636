"""The event envelope and per-type data models against ``event.schema.json`` and ojs-events.md.

Both live in the OJS spec folder (``OJS_SHARED_DIR``): without them the tests
about the schema's catalog and the spec's section 4 are skipped with the reason,
and the envelope checks use the ``Event`` model instead of the schema.
"""

from __future__ import annotations

import json
import pickle
import re
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from ojs_kombu.events import (
    DATA_MODELS,
    EVENT_TYPES,
    Event,
    JobProgressData,
    event_source,
    make_event,
    validate_data,
)
from ojs_kombu.spec.errors import InvalidEventData

from .ojs_schemas import (
    EVENTS_SPEC,
    EVENTS_SPEC_MISSING,
    EVENTS_SPEC_PRESENT,
    SCHEMAS,
    SCHEMAS_PRESENT,
    event_check,
    require_events_spec,
    require_schemas,
)

SPEC = EVENTS_SPEC
SOURCE = "ojs://billing-api/workers/worker-1"
JOB_ID = "019539a4-b68c-7def-8000-1a2b3c4d5e6f"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
RFC3339_Z_MS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]*$")
T1 = "2025-06-01T10:30:00.000Z"
T2 = "2025-06-01T10:35:00.123Z"
ERROR = {"code": "handler_error", "message": "SMTP connection refused"}
JOB = {"job_type": "email.send", "queue": "email"}

#: Per type: data with the required fields only, and the optional fields section 4 adds.
REQUIRED: dict[str, dict[str, Any]] = {
    "job.enqueued": {**JOB},
    "job.started": {**JOB, "worker_id": "worker-1", "attempt": 1},
    "job.completed": {**JOB, "duration_ms": 1333, "attempt": 1},
    "job.failed": {**JOB, "attempt": 1, "error": {**ERROR, "retryable": True}},
    "job.discarded": {**JOB, "total_attempts": 5, "last_error": ERROR},
    "job.retrying": {**JOB, "attempt": 2, "max_attempts": 5, "next_retry_at": T1,
                     "error": ERROR},
    "job.cancelled": {**JOB},
    "job.heartbeat": {**JOB, "worker_id": "worker-3", "attempt": 1, "visible_until": T1},
    "job.scheduled": {**JOB, "scheduled_at": T1},
    "job.expired": {**JOB, "created_at": T1, "expired_at": T2, "ttl_ms": 300000},
    "job.progress": {**JOB, "worker_id": "worker-2", "attempt": 1, "progress_percent": 65.5},
    "queue.paused": {"queue": "email"},
    "queue.resumed": {"queue": "email"},
    "worker.started": {"worker_id": "worker-1", "queues": ["default", "email"],
                       "concurrency": 10},
    "worker.stopped": {"worker_id": "worker-1", "reason": "signal"},
    "worker.quiet": {"worker_id": "worker-1", "active_jobs": 3},
    "worker.heartbeat": {"worker_id": "worker-1", "active_jobs": 7, "queues": ["email"]},
    "workflow.started": {"workflow_id": "wf_1", "workflow_name": "etl", "total_steps": 4},
    "workflow.step_completed": {"workflow_id": "wf_1", "workflow_name": "etl",
                                "step_id": "extract", "step_type": "data.fetch",
                                "duration_ms": 2450, "steps_remaining": 3},
    "workflow.completed": {"workflow_id": "wf_1", "workflow_name": "etl", "total_steps": 4,
                           "duration_ms": 15230},
    "workflow.failed": {"workflow_id": "wf_1", "workflow_name": "etl",
                        "failed_step_id": "transform", "failed_step_type": "data.transform",
                        "error": ERROR},
    "cron.triggered": {"cron_name": "daily-report", "cron_expr": "0 9 * * *",
                       "job_type": "report.generate", "job_id": JOB_ID, "scheduled_at": T1},
    "cron.skipped": {"cron_name": "daily-report", "cron_expr": "0 9 * * *",
                     "job_type": "report.generate", "reason": "overlap_prevention"},
}
_TRACE = {"trace_id": TRACE_ID}
OPTIONAL: dict[str, dict[str, Any]] = {
    "job.enqueued": {**_TRACE, "priority": 10, "scheduled_at": T1, "unique_key": "k1"},
    "job.started": {**_TRACE},
    "job.completed": {**_TRACE, "result": {"message_id": "msg_abc123"}},
    "job.failed": {**_TRACE, "duration_ms": 245,
                   "error": {**ERROR, "retryable": False, "stack_trace": "Error\n  at x"}},
    "job.discarded": {**_TRACE},
    "job.retrying": {**_TRACE},
    "job.cancelled": {**_TRACE, "cancelled_by": "user:admin@example.com", "reason": "stale"},
    "job.heartbeat": {**_TRACE},
    "job.scheduled": {**_TRACE},
    "job.expired": {**_TRACE},
    "job.progress": {**_TRACE, "progress_message": "6,550 of 10,000 rows"},
    "queue.paused": {"paused_by": "user:ops@example.com"},
    "queue.resumed": {"resumed_by": "user:ops@example.com"},
    "worker.started": {},
    "worker.stopped": {"jobs_completed": 12847, "uptime_ms": 86400000},
    "worker.quiet": {},
    "worker.heartbeat": {"memory_mb": 256.4, "cpu_percent": 112.3},
    "workflow.started": {},
    "workflow.step_completed": {},
    "workflow.completed": {},
    "workflow.failed": {},
    "cron.triggered": {},
    "cron.skipped": {"existing_job_id": JOB_ID},
}
#: Nested optional fields (``error.stack_trace``) are set by the OPTIONAL dict above.
NESTED_OPTIONAL = {"job.failed": {"error": {"stack_trace"}}}


@pytest.fixture(scope="module")
def event_schema() -> Any:
    """``event.schema.json``, or the ``Event`` model when the schemas are absent."""
    return event_check()


def _schema_types() -> list[str]:
    """The schema's catalog; the package's own when the schemas are absent."""
    if not SCHEMAS_PRESENT:
        return list(EVENT_TYPES)
    return json.loads((SCHEMAS / "event.schema.json").read_text())["properties"]["type"]["enum"]


SCHEMA_TYPES = _schema_types()


def _is_uuid7(text: str) -> bool:
    try:
        parsed = uuid.UUID(text)
    except ValueError:
        return False
    return parsed.version == 7 and str(parsed) == text


def _check_envelope(event: Event, schema: Any) -> dict[str, Any]:
    document = json.loads(event.to_json())
    assert document == event.to_dict()
    schema.validate(document)
    assert document["id"].startswith("evt_") and _is_uuid7(document["id"][4:])
    assert RFC3339_Z_MS.match(document["time"]), document["time"]
    assert URI.match(document["source"])
    DATA_MODELS[document["type"]].model_validate(document["data"])
    assert Event.from_json(event.to_json()) == event
    return document


# -- the catalog ----------------------------------------------------------------------------


def test_data_models_cover_exactly_the_schema_catalog() -> None:
    require_schemas()
    assert list(DATA_MODELS) == SCHEMA_TYPES
    assert list(EVENT_TYPES) == SCHEMA_TYPES
    assert set(REQUIRED) == set(OPTIONAL) == set(SCHEMA_TYPES)


def test_this_module_covers_every_event_type() -> None:
    assert set(REQUIRED) == set(OPTIONAL) == set(EVENT_TYPES) == set(DATA_MODELS)


def _spec_sections() -> dict[str, str]:
    """Section 4's text per event type (``#### `job.enqueued` ...``); none without the spec."""
    if not EVENTS_SPEC_PRESENT:
        return {}
    text = SPEC.read_text()
    body = text[text.index("## 4. Event Data Schemas"):text.index("## 5. Conformance")]
    parts = re.split(r"^#### `([a-z_.]+)`$", body, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def _spec_fields(section: str) -> dict[str, bool]:
    """``{field: required}`` from a section 4 table (nested fields as ``error.code``)."""
    rows = re.findall(r"^\| `([a-z_.]+)` \| [^|]+ \| (Yes|No) \|", section, flags=re.M)
    return {name: required == "Yes" for name, required in rows}


SPEC_SECTIONS = _spec_sections()


def _spec_params(values: list[Any], ids: Any = None) -> list[Any]:
    """Parameters read from the spec: one skipped case when the spec is absent."""
    if EVENTS_SPEC_PRESENT:
        return [pytest.param(v, id=ids(v) if ids else None) for v in values]
    return [pytest.param(None, id="events-spec-absent",
                         marks=pytest.mark.skip(reason=EVENTS_SPEC_MISSING))]


def test_spec_section_4_lists_every_type() -> None:
    require_events_spec()
    assert list(SPEC_SECTIONS) == SCHEMA_TYPES


@pytest.mark.parametrize("event_type", SCHEMA_TYPES)
def test_data_model_has_exactly_the_section_4_fields(event_type: str) -> None:
    require_events_spec()
    assert event_type in DATA_MODELS, f"no data model for {event_type}"
    model = DATA_MODELS[event_type]
    spec = _spec_fields(SPEC_SECTIONS[event_type])
    top = {k: v for k, v in spec.items() if "." not in k}
    fields = {n: f.is_required() for n, f in model.model_fields.items() if n != "trace_id"}
    assert fields == top
    # trace_id (section 8.3) on every job event, optional.
    assert ("trace_id" in model.model_fields) == event_type.startswith("job.")
    for name in {k.split(".")[0] for k in spec if "." in k}:
        nested = model.model_fields[name].annotation
        assert isinstance(nested, type) and issubclass(nested, BaseModel)
        expected = {k.split(".", 1)[1]: v for k, v in spec.items() if k.startswith(name + ".")}
        assert {n: f.is_required() for n, f in nested.model_fields.items()} == expected
    # The fixtures of this module are the required fields exactly, and all the optional ones.
    assert set(REQUIRED[event_type]) == {n for n, r in top.items() if r}
    assert set(REQUIRED[event_type]) | set(OPTIONAL[event_type]) == set(model.model_fields)


@pytest.mark.parametrize("event_type", _spec_params(list(SPEC_SECTIONS), str))
def test_section_4_examples_conform(event_type: str) -> None:
    blocks = re.findall(r"```json\n(.*?)```", SPEC_SECTIONS[event_type], flags=re.S)
    assert len(blocks) == 1
    example = json.loads(blocks[0])
    assert validate_data(event_type, example) == example


def _spec_event_examples() -> list[dict[str, Any]]:
    if not EVENTS_SPEC_PRESENT:
        return []
    blocks = re.findall(r"```json\n(.*?)```", SPEC.read_text(), flags=re.S)
    return [e for e in map(json.loads, blocks) if isinstance(e, dict) and "specversion" in e]


@pytest.mark.parametrize("document", _spec_params(_spec_event_examples(), lambda d: d["id"]))
def test_spec_event_examples_parse(document: dict[str, Any], event_schema: Any) -> None:
    event_schema.validate(document)
    event = Event.model_validate_json(json.dumps(document))
    assert event.to_dict() == document


# -- every type, minimal and full -------------------------------------------------------------


@pytest.mark.parametrize("event_type", SCHEMA_TYPES)
def test_event_with_required_data_only(event_type: str,
                                       event_schema: Any) -> None:
    event = make_event(event_type, REQUIRED[event_type], source=SOURCE, subject=JOB_ID)
    document = _check_envelope(event, event_schema)
    assert document["data"] == REQUIRED[event_type]
    assert document["specversion"] == "1.0"
    assert document["type"] == event_type


@pytest.mark.parametrize("event_type", SCHEMA_TYPES)
def test_event_with_all_optional_data(event_type: str,
                                      event_schema: Any) -> None:
    data = {**REQUIRED[event_type], **OPTIONAL[event_type]}
    event = make_event(event_type, data, source=SOURCE, subject=JOB_ID,
                       time=datetime(2025, 6, 1, 10, 30, 2, 789000, tzinfo=UTC))
    document = _check_envelope(event, event_schema)
    assert document["data"] == data
    assert document["time"] == "2025-06-01T10:30:02.789Z"
    for field, nested in NESTED_OPTIONAL.get(event_type, {}).items():
        assert nested <= set(document["data"][field])


@pytest.mark.parametrize("event_type", SCHEMA_TYPES)
def test_data_model_instance_is_accepted(event_type: str) -> None:
    model = DATA_MODELS[event_type].model_validate(REQUIRED[event_type])
    event = make_event(event_type, model, source=SOURCE)
    assert event.data == REQUIRED[event_type]


# -- bad data ---------------------------------------------------------------------------------


def _required_cases() -> list[tuple[str, str]]:
    return [(t, f) for t in SCHEMA_TYPES for f in REQUIRED[t]]


@pytest.mark.parametrize(("event_type", "field"), _required_cases())
def test_missing_required_field_is_named(event_type: str, field: str) -> None:
    data = {k: v for k, v in REQUIRED[event_type].items() if k != field}
    with pytest.raises(InvalidEventData) as info:
        make_event(event_type, data, source=SOURCE)
    message = str(info.value)
    assert repr(event_type) in message
    assert f"data.{field}: Field required" in message
    assert info.value.event_type == event_type
    assert info.value.errors[0]["loc"] == (field,)


@pytest.mark.parametrize(("event_type", "field"), _required_cases())
def test_wrong_type_is_named(event_type: str, field: str) -> None:
    # true is a boolean: no required field of any type is one (and ints are not bools).
    data = {**REQUIRED[event_type], field: True}
    with pytest.raises(InvalidEventData, match=rf"{re.escape(event_type)}.*data\.{field}\b"):
        make_event(event_type, data, source=SOURCE)


@pytest.mark.parametrize("percent", [150, 100.01, -1])
def test_progress_percent_is_a_percentage(percent: float) -> None:
    data = {**REQUIRED["job.progress"], "progress_percent": percent}
    with pytest.raises(InvalidEventData, match=r"'job\.progress'.*data\.progress_percent"):
        make_event("job.progress", data, source=SOURCE)


@pytest.mark.parametrize("percent", [0, 100, 33.3])
def test_progress_percent_bounds_are_inclusive(percent: float) -> None:
    data = {**REQUIRED["job.progress"], "progress_percent": percent}
    assert make_event("job.progress", data, source=SOURCE).data["progress_percent"] == percent


@pytest.mark.parametrize(
    ("event_type", "patch", "field"),
    [
        ("job.started", {"attempt": "1"}, "attempt"),  # no coercion from strings
        ("job.started", {"attempt": 0}, "attempt"),  # 1-indexed
        ("job.started", {"attempt": 1.0}, "attempt"),
        ("job.completed", {"duration_ms": -1}, "duration_ms"),
        ("job.completed", {"result": [1, 2]}, "result"),  # object or null
        ("job.failed", {"error": {"code": "x", "message": "m"}}, "error.retryable"),
        ("job.failed", {"error": {**ERROR, "retryable": "yes"}}, "error.retryable"),
        ("job.failed", {"error": {**ERROR, "retryable": True, "stack_trace": ["a"]}},
         "error.stack_trace"),
        ("job.discarded", {"last_error": {"message": "m"}}, "last_error.code"),
        ("job.retrying", {"next_retry_at": "tomorrow"}, "next_retry_at"),
        ("job.retrying", {"next_retry_at": "2025-06-01T10:00:00"}, "next_retry_at"),  # no offset
        ("job.retrying", {"next_retry_at": datetime(2025, 6, 1)}, "next_retry_at"),  # naive
        ("job.retrying", {"next_retry_at": 1748772000}, "next_retry_at"),
        ("job.enqueued", {"trace_id": "00-" + TRACE_ID + "-00f067aa0ba902b7-01"}, "trace_id"),
        ("job.enqueued", {"queue": ""}, "queue"),
        ("job.progress", {"progress_percent": float("nan")}, "progress_percent"),
        ("worker.stopped", {"reason": "crashed"}, "reason"),  # shutdown, signal or error
        ("worker.started", {"queues": "email"}, "queues"),
        ("worker.started", {"concurrency": 0}, "concurrency"),
        ("worker.quiet", {"active_jobs": -1}, "active_jobs"),
        ("worker.heartbeat", {"memory_mb": "256"}, "memory_mb"),
    ],
)
def test_bad_values_are_named(event_type: str, patch: dict[str, Any], field: str) -> None:
    data = {**REQUIRED[event_type], **patch}
    with pytest.raises(InvalidEventData, match=rf"data\.{re.escape(field)}\b"):
        make_event(event_type, data, source=SOURCE)


def test_data_must_be_an_object() -> None:
    with pytest.raises(InvalidEventData, match=r"'job\.enqueued' event: data: "):
        make_event("job.enqueued", ["email.send"], source=SOURCE)  # type: ignore[arg-type]


def test_unknown_event_type() -> None:
    with pytest.raises(ValueError, match=r"'job\.done' is not an OJS event type"):
        make_event("job.done", {}, source=SOURCE)
    with pytest.raises(ValidationError, match="type"):
        Event(type="job.done", source=SOURCE, data={})  # type: ignore[arg-type]


def test_invalid_event_data_pickles() -> None:
    with pytest.raises(InvalidEventData) as info:
        make_event("job.progress", {**JOB}, source=SOURCE)
    copy = pickle.loads(pickle.dumps(info.value))
    assert str(copy) == str(info.value) and copy.event_type == "job.progress"


def test_event_model_checks_its_data_too() -> None:
    """A foreign event whose data does not conform is refused on parse, naming the field."""
    document = {"specversion": "1.0", "id": "evt_1", "type": "job.progress", "source": SOURCE,
                "time": T1, "data": {**REQUIRED["job.progress"], "progress_percent": 150}}
    with pytest.raises(ValidationError, match=r"'job\.progress'.*data\.progress_percent"):
        Event.from_json(json.dumps(document))


# -- the envelope -----------------------------------------------------------------------------


def test_ids_are_unique_evt_uuid7() -> None:
    ids = [make_event("job.enqueued", JOB, source=SOURCE).id for _ in range(1000)]
    assert len(set(ids)) == len(ids)
    assert all(i.startswith("evt_") and _is_uuid7(i[4:]) for i in ids)


def test_default_time_is_now_in_milliseconds() -> None:
    before = datetime.now(UTC) - timedelta(milliseconds=1)
    event = make_event("job.enqueued", JOB, source=SOURCE)
    assert before <= event.time <= datetime.now(UTC)
    assert event.time.microsecond % 1000 == 0
    assert RFC3339_Z_MS.match(event.to_dict()["time"])


def test_times_are_written_in_utc_with_z() -> None:
    event = make_event(
        "job.scheduled", {**JOB, "scheduled_at": "2025-06-02T11:00:00+02:00"}, source=SOURCE,
        time=datetime(2025, 6, 1, 12, 0, tzinfo=timezone(timedelta(hours=2))),
    )
    assert event.to_dict()["time"] == "2025-06-01T10:00:00.000Z"
    assert event.data["scheduled_at"] == "2025-06-02T09:00:00.000Z"
    assert make_event("job.enqueued", JOB, source=SOURCE,
                      time="2025-06-01t10:00:00.5z").to_dict()["time"] == "2025-06-01T10:00:00.500Z"


def test_naive_time_is_refused() -> None:
    with pytest.raises(ValidationError, match="time"):
        make_event("job.enqueued", JOB, source=SOURCE, time=datetime(2025, 6, 1))


def test_to_json_is_compact_and_only_set_attributes() -> None:
    event = make_event("job.enqueued", JOB, source=SOURCE)
    body = event.to_json()
    assert isinstance(body, bytes) and b" " not in body
    assert set(json.loads(body)) == {"specversion", "id", "type", "source", "time", "data"}


def test_null_optional_fields_are_absent_but_null_result_is_kept() -> None:
    enqueued = make_event("job.enqueued", {**JOB, "priority": None, "trace_id": None},
                          source=SOURCE)
    assert enqueued.data == JOB
    completed = make_event("job.completed", {**REQUIRED["job.completed"], "result": None},
                           source=SOURCE)
    assert completed.data["result"] is None
    assert json.loads(completed.to_json())["data"]["result"] is None
    nested = {**REQUIRED["job.failed"], "error": {**ERROR, "retryable": True,
                                                  "stack_trace": None}}
    assert make_event("job.failed", nested, source=SOURCE).data["error"] == {
        **ERROR, "retryable": True}


def test_extra_data_fields_are_kept_json_safe() -> None:
    """Section 4 tables are not closed (8.3 adds trace_id; the schema allows more)."""
    data = {**JOB, "tenant": "acme", "labels": {"tier": "gold"},
            "seen_at": datetime(2025, 6, 1, tzinfo=UTC)}
    event = make_event("job.enqueued", data, source=SOURCE)
    assert event.data["tenant"] == "acme" and event.data["labels"] == {"tier": "gold"}
    assert isinstance(event.data["seen_at"], str)
    json.loads(event.to_json())
    with pytest.raises(InvalidEventData, match="JSON"):
        make_event("job.enqueued", {**JOB, "handle": object()}, source=SOURCE)


def test_datacontenttype_is_json_only() -> None:
    fields = {"type": "job.enqueued", "source": SOURCE, "data": JOB}
    event = Event(**fields, datacontenttype="application/json")
    assert event.to_dict()["datacontenttype"] == "application/json"
    with pytest.raises(ValidationError, match="datacontenttype"):
        Event(**fields, datacontenttype="application/xml")


def test_envelope_attributes_are_checked() -> None:
    fields = {"type": "job.enqueued", "source": SOURCE, "data": JOB}
    for bad in ({"specversion": "2.0"}, {"id": ""}, {"source": "not a uri"},
                {"source": "ojs://x/a b"}, {"source": "ojs://x/%zz"}, {"time": "yesterday"}):
        with pytest.raises(ValidationError, match=next(iter(bad))):
            Event(**{**fields, **bad})
    with pytest.raises(ValidationError, match="data"):
        Event(type="job.enqueued", source=SOURCE)  # type: ignore[call-arg]


def test_unknown_envelope_attributes_round_trip() -> None:
    document = json.loads(make_event("job.enqueued", JOB, source=SOURCE).to_json())
    document["traceparent"] = "00-" + TRACE_ID + "-00f067aa0ba902b7-01"
    assert Event.from_json(json.dumps(document)).to_dict() == document


def test_event_is_immutable() -> None:
    event = make_event("job.enqueued", JOB, source=SOURCE)
    with pytest.raises(ValidationError):
        event.type = "job.started"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("event_type", "subject"),
    [("queue.paused", "email"), ("worker.quiet", "worker-1"), ("workflow.started", "wf_1"),
     ("cron.skipped", "daily-report"), ("job.enqueued", None)],
)
def test_subject_defaults_per_section_2_2(event_type: str, subject: str | None) -> None:
    event = make_event(event_type, REQUIRED[event_type], source=SOURCE)
    assert event.subject == subject
    assert make_event(event_type, REQUIRED[event_type], source=SOURCE,
                      subject="given").subject == "given"


def test_event_source() -> None:
    assert event_source("billing-api", "workers", "worker-1") == SOURCE
    assert event_source("billing-api", "scheduler") == "ojs://billing-api/scheduler"
    quoted = event_source("my service", "workers", "host:1/pid 7")
    assert quoted == "ojs://my%20service/workers/host%3A1%2Fpid%207"
    assert URI.match(quoted)
    make_event("job.enqueued", JOB, source=quoted)  # the envelope accepts it
    with pytest.raises(ValueError, match="instance"):
        event_source("svc", "workers", "")


def test_progress_model_is_usable_directly() -> None:
    data = JobProgressData(job_type="data.import", queue="etl", worker_id="w", attempt=1,
                           progress_percent=25)
    event = make_event("job.progress", data, source=SOURCE)
    assert event.data["progress_percent"] == 25.0
    with pytest.raises(InvalidEventData, match=r"data\.active_jobs"):
        make_event("worker.quiet", data, source=SOURCE)  # another type's model is revalidated
