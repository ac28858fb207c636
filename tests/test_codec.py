"""Celery protocol v2 <-> OJS envelope, both ways, without a broker."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from celery import Celery
from kombu.serialization import dumps

from ojs_kombu.spec.decode import UNKNOWN_JOB_TYPE, celery_payload, decode_job_message
from ojs_kombu.spec.encode import encode_task_message
from ojs_kombu.spec.envelope import CONTENT_TYPE
from ojs_kombu.spec.errors import (
    InvalidJobIdError,
    JobRejected,
    UnsupportedSerializerError,
)
from ojs_kombu.spec.job_ids import new_job_id
from ojs_kombu.spec.job_options import amqp_priority
from ojs_kombu.spec.naming import is_job_id
from ojs_kombu.spec.strict_input import (
    INVALID_ENVELOPE,
    INVALID_PAYLOAD,
    UNSUPPORTED_CONTENT_TYPE,
)

app = Celery("codec-tests", set_as_current=False)
NOW = datetime(2026, 11, 21, 10, 0, 0, tzinfo=UTC)


def celery_message(name: str = "email.send", args: Any = ("a@b.c", "welcome"),
                   kwargs: dict[str, Any] | None = None, serializer: str = "json",
                   task_id: str | None = None, **options: Any
                   ) -> tuple[bytes, str, dict[str, Any], dict[str, Any]]:
    """What Celery hands kombu for ``apply_async``: body, content type, headers, properties."""
    message = app.amqp.as_task_v2(task_id or new_job_id(), name, args, kwargs, **options)
    content_type, _, body = dumps(message.body, serializer=serializer)
    return body, content_type, dict(message.headers), dict(message.properties)


def encode(name: str = "email.send", queue: str = "email", properties: Any = None,
           **kw: Any) -> Any:
    body, content_type, headers, props = celery_message(name, **kw)
    return encode_task_message(body=body, content_type=content_type,
                               properties={**props, **(properties or {})},
                               headers=headers, job_type=name, queue=queue, now=NOW)


def test_envelope_is_schema_valid_and_properties_follow_the_binding(job_check: Any) -> None:
    job = encode()
    body = json.loads(job.body)
    job_check.validate(body)
    assert body["specversion"] == "1.0" and body["type"] == "email.send"
    assert body["queue"] == "email" and body["args"] == ["a@b.c", "welcome"]
    assert is_job_id(body["id"]) and body["created_at"] == "2026-11-21T10:00:00.000Z"
    props = job.properties
    assert props["message_id"] == body["id"] == props["correlation_id"]
    assert props["type"] == "email.send"
    assert props["content_type"] == CONTENT_TYPE == "application/openjobspec+json"
    assert props["content_encoding"] == "utf-8"
    assert props["delivery_mode"] == 2 and props["app_id"] == "ojs"
    assert props["timestamp"] == int(NOW.timestamp())
    assert "priority" not in props
    headers = props["application_headers"]
    assert headers["x-ojs-queue"] == "email"
    assert headers["x-ojs-attempt"] == 1
    assert headers["x-ojs-max-attempts"] == 3
    assert headers["x-ojs-created-at"] == headers["x-ojs-enqueued-at"] == body["created_at"]
    assert "x-ojs-scheduled-at" not in headers


def test_celery_options_map_onto_ojs_attributes(job_check: Any) -> None:
    eta = NOW + timedelta(seconds=90, microseconds=123456)
    expires = NOW + timedelta(hours=1)
    job = encode(eta=eta, expires=expires, time_limit=29.5, soft_time_limit=20,
                 properties={"priority": 7})
    body = json.loads(job.body)
    job_check.validate(body)
    assert body["scheduled_at"] == "2026-11-21T10:01:30.123456Z"
    assert body["expires_at"] == "2026-11-21T11:00:00.000Z"
    assert body["timeout"] == 30  # whole seconds, rounded up
    assert body["priority"] == 7 and job.properties["priority"] == 7
    assert job.properties["application_headers"]["x-ojs-scheduled-at"] == body["scheduled_at"]
    assert body["x_celery"]["timelimit"] == [29.5, 20]


def test_meta_option_becomes_meta_and_headers() -> None:
    meta = {"tenant_id": "acme", "tags": ["a", "b"], "idempotency_key": "k-1",
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    job = encode(properties={"ojs_meta": meta})
    assert json.loads(job.body)["meta"] == meta
    headers = job.properties["application_headers"]
    assert headers["x-ojs-tags"] == "a,b"
    assert headers["x-ojs-idempotency-key"] == "k-1"
    assert headers["x-ojs-trace-id"] == meta["traceparent"]


def test_round_trip_keeps_kwargs_canvas_and_celery_headers() -> None:
    callback = {"task": "report.render", "args": [], "kwargs": {}, "options": {},
                "subtask_type": None, "immutable": False}
    chord = {"task": "report.merge", "args": [], "kwargs": {}, "options": {"task_id": "x"}}
    root, parent, group = new_job_id(), new_job_id(), new_job_id()
    body, ct, headers, props = celery_message(
        "report.fetch", args=(1, "q3"), kwargs={"fmt": "pdf", "n": [1, 2]},
        callbacks=[callback], errbacks=[callback], chain=[callback], chord=chord,
        root_id=root, parent_id=parent, group_id=group, group_index=2, retries=1,
        shadow="fetch-q3", argsrepr="(1, '***')", ignore_result=True)
    headers["custom"] = {"kept": True}
    job = encode_task_message(body=body, content_type=ct, properties=props, headers=headers,
                              job_type="report.fetch", queue="reports", now=NOW)
    incoming = decode_job_message(job.body, job.properties, resolve_task=lambda t: t)
    args, kwargs, embed = incoming.payload
    assert (args, kwargs) == ([1, "q3"], {"fmt": "pdf", "n": [1, 2]})
    assert embed == {"callbacks": [callback], "errbacks": [callback], "chain": [callback],
                     "chord": chord}
    out = incoming.headers
    for key in ("id", "root_id", "parent_id", "group", "group_index", "shadow", "argsrepr",
                "kwargsrepr", "origin", "ignore_result", "custom"):
        assert out[key] == headers[key], key
    assert out["task"] == "report.fetch" and out["retries"] == 1
    assert out["x-ojs-attempt"] == 2  # retries + 1
    assert celery_payload(job.body) == incoming.payload


def test_each_consumed_job_has_stamps_of_its_own() -> None:
    """Celery's stamping writes into a request's ``stamps``: one job's must never show
    up on the next job decoded."""
    body, ct, headers, props = celery_message("report.fetch", args=(1,))
    job = encode_task_message(body=body, content_type=ct, properties=props, headers=headers,
                              job_type="report.fetch", queue="reports", now=NOW)
    first = decode_job_message(job.body, job.properties, resolve_task=lambda t: t)
    first.headers["stamps"]["on_first"] = ["x"]
    second = decode_job_message(job.body, job.properties, resolve_task=lambda t: t)
    assert second.headers["stamps"] == {}


def test_round_trip_of_eta_and_expires_is_exact() -> None:
    eta = (datetime.now(UTC) + timedelta(days=1)).replace(microsecond=5)
    job = encode(eta=eta, expires=eta + timedelta(minutes=5))
    incoming = decode_job_message(job.body, job.properties, resolve_task=lambda t: t)
    assert datetime.fromisoformat(incoming.headers["eta"]) == eta
    assert datetime.fromisoformat(incoming.headers["expires"]) == eta + timedelta(minutes=5)


def test_a_past_scheduled_at_is_still_the_requests_eta() -> None:
    """A countdown job reaches the worker when due; its task sees the due time as
    ``request.eta``, as on plain Celery (the worker does not hold it again)."""
    due = datetime.now(UTC) - timedelta(minutes=1)
    job = encode(eta=due)
    incoming = decode_job_message(job.body, job.properties, resolve_task=lambda t: t)
    assert datetime.fromisoformat(incoming.headers["eta"]) == due


def test_foreign_job_runs_with_positional_args() -> None:
    """A job from a non-Celery producer (no x_celery) decodes into a plain task call."""
    job_id = new_job_id()
    body = json.dumps({"specversion": "1.0", "id": job_id, "type": "email.send",
                       "queue": "email", "args": ["user@example.com", "welcome"],
                       "timeout": 10}).encode()
    props = {"content_type": CONTENT_TYPE, "content_encoding": "utf-8",
             "application_headers": {"x-ojs-attempt": 1, "x-ojs-queue": "email"}}
    incoming = decode_job_message(body, props, resolve_task={"email.send": "proj.send"}.get)
    assert incoming.task_name == "proj.send"
    assert incoming.payload == (["user@example.com", "welcome"], {},
                                {"callbacks": None, "errbacks": None, "chain": None,
                                 "chord": None})
    headers = incoming.headers
    assert headers["task"] == "proj.send" and headers["id"] == job_id
    assert headers["retries"] == 0 and headers["timelimit"] == [10, None]
    assert headers["argsrepr"] == "['user@example.com', 'welcome']"
    assert headers["eta"] is None and headers["root_id"] == job_id  # its own root


def test_binding_example_without_specversion_is_read_as_1_0() -> None:
    """Section 15.1's producer omits specversion; the binding has one version."""
    body = json.dumps({"id": new_job_id(), "type": "email.send", "queue": "email",
                       "args": ["user@example.com", "welcome"],
                       "created_at": "2026-02-15T10:30:00+00:00"}).encode()
    incoming = decode_job_message(body, {"content_type": CONTENT_TYPE},
                                  resolve_task=lambda t: t)
    assert incoming.envelope.specversion == "1.0"


@pytest.mark.parametrize("value", [
    datetime(2026, 1, 1, tzinfo=UTC), Decimal("1.5"), b"raw", float("nan"),
])
def test_values_celerys_json_tags_arrive_as_they_were_sent(value: Any, job_check: Any) -> None:
    """Celery's own JSON body (kombu's tagged objects) becomes natural JSON plus the
    type map, and the worker reads back the values Celery sent."""
    job = encode(args=("ok", value), kwargs={"when": value})
    body = json.loads(job.body)
    job_check.validate(body)
    assert "__type__" not in job.body.decode()
    args, kwargs, _ = celery_payload(job.body)
    assert [type(args[1]), type(kwargs["when"])] == [type(value)] * 2
    assert repr(args[1]) == repr(value) == repr(kwargs["when"])


def test_pickle_is_refused_at_publish() -> None:
    with pytest.raises(UnsupportedSerializerError, match="x-python-serialize"):
        encode(serializer="pickle")


@pytest.mark.parametrize("task_id", ["3f2b8c1e-4c4a-4b6e-9a51-2f7b7c1d2e3f", "my-task-1",
                                     "019461A8-1A2B-7C3D-8E4F-5A6B7C8D9E0F"])
def test_any_task_id_travels_beside_a_uuid7_job_id(task_id: str, job_check: Any) -> None:
    job = encode(task_id=task_id)
    body = json.loads(job.body)
    job_check.validate(body)
    assert is_job_id(body["id"]) and body["id"] != task_id
    assert job.properties["message_id"] == body["id"]
    assert body["x_celery"]["id"] == task_id
    incoming = decode_job_message(job.body, job.properties, resolve_task=lambda t: t)
    assert incoming.headers["id"] == incoming.headers["root_id"] == task_id
    assert incoming.headers["ojs_job_id"] == body["id"]


def test_a_uuid7_task_id_is_the_job_id() -> None:
    task_id = new_job_id()
    job = encode(task_id=task_id)
    body = json.loads(job.body)
    assert body["id"] == task_id and "task_id" not in body.get("x_celery", {})


def test_an_empty_task_id_is_refused() -> None:
    with pytest.raises(InvalidJobIdError, match="non-empty string"):
        encode_task_message(body=b'[[],{},{}]', content_type="application/json",
                            properties={}, headers={"task": "email.send", "id": ""},
                            job_type="email.send", queue="email")


def test_priority_mapping() -> None:
    assert [amqp_priority(p) for p in (-100, -10, 0, 1, 5, 9, 10, 100)] == [0, 0, 0, 1, 5, 9, 9, 9]


def _decode(body: Any, content_type: str | None = CONTENT_TYPE, known: bool = True) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return decode_job_message(raw, {"content_type": content_type},
                              resolve_task=(lambda t: t) if known else (lambda t: None))


VALID = {"specversion": "1.0", "id": "019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f",
         "type": "email.send", "queue": "email", "args": []}


@pytest.mark.parametrize("body, content_type, known, code", [
    (b"{not json", CONTENT_TYPE, True, INVALID_PAYLOAD),
    (b"\xff\xfe", CONTENT_TYPE, True, INVALID_PAYLOAD),
    ({**VALID, "type": "Email.Send"}, CONTENT_TYPE, True, INVALID_ENVELOPE),
    ({**VALID, "args": {"to": "x"}}, CONTENT_TYPE, True, INVALID_ENVELOPE),
    ([1, 2, 3], CONTENT_TYPE, True, INVALID_ENVELOPE),
    ({**VALID, "x_celery": [1]}, CONTENT_TYPE, True, INVALID_ENVELOPE),
    ({**VALID, "retry": {"initial_interval": "PT0S"}}, CONTENT_TYPE, True, INVALID_ENVELOPE),
    (VALID, CONTENT_TYPE, False, UNKNOWN_JOB_TYPE),
    (VALID, "application/json", True, UNSUPPORTED_CONTENT_TYPE),
    (VALID, "application/x-python-serialize", True, UNSUPPORTED_CONTENT_TYPE),
    (VALID, None, True, UNSUPPORTED_CONTENT_TYPE),
])
def test_consumed_messages_that_are_not_jobs_are_rejected_with_a_code(
        body: Any, content_type: str | None, known: bool, code: str) -> None:
    with pytest.raises(JobRejected) as info:
        _decode(body, content_type, known)
    assert info.value.code == code
    assert info.value.message


def test_content_type_parameters_are_accepted() -> None:
    assert _decode(VALID, CONTENT_TYPE + "; charset=utf-8").task_name == "email.send"


def test_celery_defaults_do_not_travel_but_come_back() -> None:
    job = encode()
    x_celery = json.loads(job.body)["x_celery"]
    for key in ("retries", "replaced_task_nesting", "stamps", "kwargsrepr",
                "root_id", "timelimit"):
        assert key not in x_celery, key
    del x_celery["ignore_result"]  # Celery sends False explicitly: it travels
    job_without = json.dumps({**json.loads(job.body), "x_celery": x_celery}).encode()
    headers = decode_job_message(job_without, job.properties, resolve_task=lambda t: t).headers
    assert headers["retries"] == 0 and headers["ignore_result"] is None  # the task decides
    assert headers["root_id"] == headers["id"] and headers["kwargsrepr"] == "{}"
    assert headers["stamps"] == {} and headers["timelimit"] == [None, None]


def test_an_explicit_ignore_result_travels_and_an_absent_one_stays_absent() -> None:
    """``send_task`` without ``ignore_result`` leaves it to the task (header ``None``);
    ``ignore_result=False`` given by the caller overrides a task's ``True``."""
    for given in (False, True):
        job = encode(ignore_result=given)
        headers = decode_job_message(job.body, job.properties, resolve_task=lambda t: t).headers
        assert headers["ignore_result"] is given


def test_trace_context_from_celery_instrumentation_reaches_the_wire() -> None:
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    body, ct, headers, props = celery_message()
    headers.update(traceparent=traceparent, tracestate="vendor=1")
    job = encode_task_message(body=body, content_type=ct, properties=props, headers=headers,
                              job_type="email.send", queue="email", now=NOW)
    meta = json.loads(job.body)["meta"]
    assert meta == {"traceparent": traceparent, "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"}
    amqp_headers = job.properties["application_headers"]
    assert amqp_headers["x-ojs-trace-id"] == traceparent
    assert amqp_headers["x-ojs-trace-state"] == "vendor=1"
    # a retried or replayed job keeps it: it is in the headers and in the envelope
    incoming = decode_job_message(job.body, job.properties, resolve_task=lambda t: t)
    assert incoming.headers["traceparent"] == traceparent


@pytest.mark.parametrize("header", ["x-ojs-trace-id", "x-ojs-traceparent"])
def test_consumer_continues_a_foreign_trace(header: str) -> None:
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    body = json.dumps(VALID).encode()
    incoming = decode_job_message(body, {"content_type": CONTENT_TYPE,
                                         "application_headers": {header: traceparent}},
                                  resolve_task=lambda t: t)
    assert incoming.headers["traceparent"] == traceparent
