"""What a worker answers to INFO for a job no worker knows (kombu's in-memory broker,
no RabbitMQ): with a result backend, ``not_found``; without one, ``unknown`` and why."""

from __future__ import annotations

from celery import Celery

from ojs_kombu.celery.control import job_info

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
