"""What a worker answers to INFO for a job no worker knows (kombu's in-memory broker,
no RabbitMQ): with a result backend, ``not_found``; without one, ``unknown`` and why."""

from __future__ import annotations

import pytest
from celery import Celery

from ojs_kombu.celery.control import job_info
from ojs_kombu.spec.job_ids import new_job_id

JOB_ID = "0190b5a8-1234-7abc-8def-0123456789ab"


def test_without_a_result_backend_the_state_is_unknown_and_says_why() -> None:
    app = Celery("nobackend", broker="memory://", set_as_current=False)
    answer = job_info(app, JOB_ID, timeout=0.1)
    assert answer["job_id"] == JOB_ID and answer["state"] == "unknown"
    assert "no result backend" in answer["reason"]


def test_with_a_result_backend_an_unknown_job_is_not_found() -> None:
    app = Celery("backend", broker="memory://", backend="cache+memory://",
                 set_as_current=False)
    assert job_info(app, JOB_ID, timeout=0.1) == {"job_id": JOB_ID, "state": "not_found"}


def test_a_backend_that_fails_gives_unknown_with_a_reason_not_an_error_text() -> None:
    app = Celery("broken", broker="memory://", backend="cache+memory://",
                 set_as_current=False)

    class Down:
        def __init__(self, job_id: str) -> None:
            raise AttributeError("'NoneType' object has no attribute 'get'")

    app.AsyncResult = Down  # type: ignore[method-assign]
    answer = job_info(app, JOB_ID, timeout=0.1)
    assert answer["state"] == "unknown" and "did not answer" in answer["reason"]
    assert "NoneType" not in str(answer)


def test_a_misconfigured_backend_gives_unknown_with_a_reason() -> None:
    app = Celery("misconfigured", broker="memory://", backend="nosuchbackend://",
                 set_as_current=False)
    answer = job_info(app, JOB_ID, timeout=0.1)
    assert answer["state"] == "unknown" and "log" in answer["reason"]


@pytest.mark.parametrize("celery_state, ojs_state", [
    ("SUCCESS", "completed"), ("FAILURE", "discarded"), ("RETRY", "retryable"),
    ("REVOKED", "cancelled"), ("STARTED", "active"), ("PENDING", "not_found")])
def test_result_backend_states_map_onto_ojs_states(celery_state: str, ojs_state: str) -> None:
    app = Celery("backend", broker="memory://", backend="cache+memory://",
                 set_as_current=False)
    job_id = new_job_id()  # the memory cache is shared by the whole process
    if celery_state != "PENDING":
        app.backend.store_result(job_id, None, celery_state)
    assert job_info(app, job_id, timeout=0.1) == {"job_id": job_id, "state": ojs_state}
