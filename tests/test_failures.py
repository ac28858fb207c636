from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from ojs_kombu.spec.failures import (
    HANDLER_ERROR,
    JobFailure,
    record_failure,
    reset_for_replay,
)

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
JOB = {"specversion": "1.0", "id": "019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f", "type": "a.b",
       "queue": "q", "args": [], "x_custom": {"kept": True}}
HEADERS = {"x-ojs-attempt": 2, "x-ojs-trace-id": "00-abc-def-01", "custom": 1,
           "x-death": [{"count": 1}], "x-first-death-queue": "q", "x-last-death-reason": "x"}


def test_failed_attempt_keeps_the_job_and_adds_the_error(job_check: Any) -> None:
    failure = JobFailure.from_exception(ValueError("bad input"))
    body, headers = record_failure(json.dumps(JOB).encode(), HEADERS, failure, attempt=2,
                                   state="retryable", now=NOW)
    job = json.loads(body)
    job_check.validate(job)
    assert job["x_custom"] == {"kept": True} and job["state"] == "retryable"
    assert job["attempt"] == 2
    assert job["error"] == {"type": "ValueError", "message": "bad input"}
    assert job["errors"] == [{"code": HANDLER_ERROR, "message": "bad input", "type": "ValueError",
                              "attempt": 2, "occurred_at": "2026-11-21T12:00:00.000Z"}]
    assert headers["x-ojs-error-code"] == HANDLER_ERROR
    assert headers["x-ojs-error-message"] == "bad input"
    assert headers["x-ojs-trace-id"] == "00-abc-def-01" and headers["custom"] == 1
    assert not [k for k in headers if k.startswith(("x-death", "x-first-death", "x-last-death"))]


def test_a_retry_carries_the_time_its_next_attempt_may_start(job_check: Any) -> None:
    """The retry queue's rung may be shorter than the delay: ``scheduled_at`` holds the
    job back until the exact time (section 9's early-arrival path)."""
    due = datetime(2026, 11, 21, 12, 0, 13, 250_000, tzinfo=UTC)
    body, headers = record_failure(json.dumps(JOB).encode(), HEADERS, JobFailure.from_exception(
        TimeoutError("429")), attempt=1, state="retryable", now=NOW, due=due)
    job = json.loads(body)
    job_check.validate(job)
    assert job["scheduled_at"] == headers["x-ojs-scheduled-at"] == "2026-11-21T12:00:13.250Z"
    discarded, _ = record_failure(body, headers, JobFailure.from_exception(ValueError()),
                                  attempt=2, state="discarded", now=NOW)
    assert json.loads(discarded)["scheduled_at"] == "2026-11-21T12:00:13.250Z"


def test_history_accumulates_and_stays_bounded() -> None:
    body = json.dumps(JOB).encode()
    for attempt in range(1, 26):
        body, _ = record_failure(body, {}, JobFailure("HANDLER_ERROR", "E", f"#{attempt}"),
                                 attempt=attempt, state="retryable", now=NOW)
    errors = json.loads(body)["errors"]
    assert len(errors) == 20 and errors[-1]["message"] == "#25" and errors[0]["message"] == "#6"


def test_backtrace_is_kept_up_to_50_frames() -> None:
    try:
        raise RuntimeError("deep")
    except RuntimeError as exc:
        failure = JobFailure.from_exception(exc, tb=exc.__traceback__)
    assert failure.backtrace and len(failure.backtrace) <= 50
    body, _ = record_failure(json.dumps(JOB).encode(), {}, failure, attempt=1,
                             state="discarded", now=NOW)
    assert json.loads(body)["error"]["backtrace"]


def test_replay_resets_the_attempt_and_keeps_the_history() -> None:
    body, headers = record_failure(json.dumps(JOB).encode(), HEADERS,
                                   JobFailure("HANDLER_ERROR", "E", "boom"), attempt=3,
                                   state="discarded", now=NOW)
    replayed, replay_headers = reset_for_replay(json.loads(body), {**headers, "x-death": [1]})
    job = json.loads(replayed)
    assert job["id"] == JOB["id"] and job["attempt"] == 0 and job["state"] == "available"
    assert "error" not in job and len(job["errors"]) == 1
    assert replay_headers["x-ojs-attempt"] == 1
    assert "x-ojs-error-code" not in replay_headers and "x-death" not in replay_headers
    assert replay_headers["x-ojs-trace-id"] == "00-abc-def-01"
