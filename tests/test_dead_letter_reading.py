"""Reading a dead letter (pure): any body is read without raising, named by a stable
key, and says why it died from its headers, its ``x-death`` or its ``expires_at``."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

import pytest

from ojs_kombu.spec.dead_letter import (
    MAX_ENVELOPE_DEPTH,
    NOT_RECORDED,
    key_of,
    read_body,
    task_id_of,
    why,
)

OJS = "application/openjobspec+json"
JOB_ID = "0190b5a8-1234-7abc-8def-000000000001"


def nested(depth: int) -> bytes:
    return b'{"id": "x", "a": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


@pytest.mark.parametrize("body, content_type, problem", [
    (b"[" * 100_000 + b"]" * 100_000, OJS, "nested deeper than JSON readers go"),
    (nested(MAX_ENVELOPE_DEPTH + 10), OJS, f"nested deeper than {MAX_ENVELOPE_DEPTH} levels"),
    (b"\xff\xfe", OJS, "the body is not UTF-8"),
    (b"{nope", OJS, "the body is not JSON"),
    (b"", OJS, "the body is empty"),
    (b'"text"', OJS, "the body is a JSON string, not an object"),
    (b"[1]", OJS, "the body is a JSON array, not an object"),
    (b"{}", OJS, "the body has no job id"),
    (b'{"id": "x"}', "application/json",
     "content type 'application/json' is not 'application/openjobspec+json'"),
    (b'{"id": "x"}', None, "no content type"),
])
def test_a_body_that_is_no_readable_job_says_why(body: bytes, content_type: str | None,
                                                 problem: str) -> None:
    reading = read_body(body, content_type)
    assert any(problem in found for found in reading.problems), reading.problems


def test_an_envelope_within_the_depth_is_read() -> None:
    reading = read_body(nested(MAX_ENVELOPE_DEPTH - 2), OJS)
    assert reading.envelope is not None and reading.problems == ()
    json.dumps(reading.envelope, indent=2)  # what dlq show prints


def test_the_key_is_the_id_else_a_digest_of_the_body() -> None:
    assert key_of(JOB_ID, b"{}") == JOB_ID
    digest = "sha256:" + hashlib.sha256(b"body").hexdigest()[:32]
    for unusable in (None, "", "a\x00b", "x" * 256):
        assert key_of(unusable, b"body") == digest


def test_the_task_id_is_x_celery_id_else_the_job_id() -> None:
    assert task_id_of({"x_celery": {"id": "order-999-validate"}}, JOB_ID) == "order-999-validate"
    for envelope in (None, {}, {"x_celery": "odd"}, {"x_celery": {"id": 7}}):
        assert task_id_of(envelope, JOB_ID) == JOB_ID


def death(reason: str, when: datetime | None = None) -> dict[str, object]:
    entry: dict[str, object] = {"reason": reason, "queue": "ojs.queue.email"}
    if when is not None:
        entry["time"] = when
    return {"x-death": [entry], "x-ojs-error-code": "HANDLER_ERROR",
            "x-ojs-error-message": "attempt 1's"}


def test_the_headers_of_a_job_published_with_its_error_say_why() -> None:
    envelope = {"state": "discarded", "error": {"type": "KeyError", "message": "'sku'"}}
    headers = {"x-ojs-error-code": b"HANDLER_ERROR", "x-ojs-error-message": "'sku'"}
    said = why(headers, envelope)
    assert (said.code, said.type, said.message, said.source) == (
        "HANDLER_ERROR", "KeyError", "'sku'", "headers")
    assert why({}, None).code is None and why({}, None).source == "none"


def test_a_nacked_job_gives_its_earlier_error_apart() -> None:
    said = why(death("rejected"), {"state": "retryable"})
    assert said.code is None and said.message is None and said.source == NOT_RECORDED
    assert said.earlier == {"code": "HANDLER_ERROR", "message": "attempt 1's"}


def test_a_nacked_job_past_its_expires_at_is_expired() -> None:
    envelope = {"expires_at": "2026-01-01T12:00:00.400Z"}
    same_second = why(death("rejected", datetime(2026, 1, 1, 12, 0, 0)), envelope)
    assert same_second.code == "EXPIRED" and same_second.source == "expires_at"
    before = why(death("rejected", datetime(2026, 1, 1, 11, 59, 58, tzinfo=UTC)), envelope)
    assert before.code is None
    assert why(death("rejected", datetime(2026, 1, 2)), {"expires_at": "garbage"}).code is None


@pytest.mark.parametrize("reason, code", [("expired", "EXPIRED"), ("maxlen", None),
                                          ("delivery_limit", None)])
def test_what_the_broker_did_is_why(reason: str, code: str | None) -> None:
    said = why(death(reason), None)
    assert said.code == code and reason in (said.message or "") and said.source == "x-death"


@pytest.mark.parametrize("x_death", ["text", [], ["text"], [{}], [{"reason": 5}]])
def test_a_malformed_x_death_is_no_death(x_death: object) -> None:
    said = why({"x-death": x_death, "x-ojs-error-code": "C"}, None)
    assert said.code == "C"
