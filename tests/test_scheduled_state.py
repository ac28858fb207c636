"""A delayed job is recorded as Celery's ``PENDING`` with its ``scheduled_at`` in the result
backend before it is published, and INFO answers ``scheduled`` for it."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from celery import Celery

import ojs_kombu
from ojs_kombu.celery.control import job_info
from ojs_kombu.spec.errors import JobOptionError
from ojs_kombu.spec.job_ids import new_job_id

from .in_memory_broker import Broker, InMemoryTransport


@pytest.fixture
def broker() -> Broker:
    broker = Broker()
    broker.declare("ojs.queue.default")
    return broker


def make_app(broker: Broker, backend: str | None = "cache+memory://") -> Celery:
    app = Celery("scheduled", broker="ojs://guest:guest@in-memory//", backend=backend,
                 set_as_current=False)
    ojs_kombu.install(app)
    app.conf.broker_transport = type("Transport", (InMemoryTransport,), {"broker": broker})

    @app.task(name="math.add", shared=False)
    def add(x: Any, y: int = 0) -> Any:
        return x

    @app.task(name="fire.forget", shared=False, ignore_result=True)
    def forget(x: Any) -> Any:
        return x

    return app


@pytest.fixture
def app(broker: Broker) -> Celery:
    return make_app(broker)


def envelope(broker: Broker, job_id: str) -> dict[str, Any]:
    return next(job for job in (json.loads(s.body) for s in broker.published)
                if job["id"] == job_id)


def test_a_delayed_job_answers_scheduled_with_its_scheduled_at(app: Celery,
                                                              broker: Broker) -> None:
    job_id = app.tasks["math.add"].apply_async((1,), countdown=30).id
    scheduled_at = envelope(broker, job_id)["scheduled_at"]
    # Celery's own state for a job not yet received (as on amqp://), not ready
    result = app.AsyncResult(job_id)
    assert (result.state, result.ready()) == ("PENDING", False)
    assert job_info(app, job_id, timeout=0.1) == {
        "job_id": job_id, "state": "scheduled", "scheduled_at": scheduled_at}


def test_an_eta_in_the_past_or_no_delay_records_nothing(app: Celery) -> None:
    add = app.tasks["math.add"]
    for job_id in (add.apply_async((1,)).id, add.apply_async((1,), eta="2020-01-01T00:00:00Z").id):
        assert job_info(app, job_id, timeout=0.1)["state"] == "not_found"


def test_a_job_whose_result_is_ignored_records_nothing(app: Celery) -> None:
    ignored = app.tasks["fire.forget"].apply_async((1,), countdown=30).id
    asked = app.tasks["math.add"].apply_async((1,), countdown=30, ignore_result=True).id
    for job_id in (ignored, asked):
        assert job_info(app, job_id, timeout=0.1)["state"] == "not_found"


def test_a_publish_that_fails_leaves_no_scheduled_record(app: Celery, broker: Broker) -> None:
    job_id = new_job_id()
    with pytest.raises(JobOptionError):
        app.tasks["math.add"].apply_async((1,), countdown=30, priority=1000, task_id=job_id)
    assert broker.published == []
    assert job_info(app, job_id, timeout=0.1)["state"] == "not_found"


def test_a_failing_backend_does_not_stop_the_publish(app: Celery, broker: Broker,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    def down(*_: Any, **__: Any) -> None:
        raise ConnectionError("result backend down")

    app.backend.store_result = down  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="ojs_kombu.celery.scheduled"):
        job_id = app.tasks["math.add"].apply_async((1,), countdown=30).id
    assert envelope(broker, job_id)["scheduled_at"]
    assert "did not record it as scheduled (result backend down)" in caplog.text


def test_without_a_result_backend_nothing_is_recorded_and_info_says_unknown(
        broker: Broker) -> None:
    app = make_app(broker, None)
    job_id = app.tasks["math.add"].apply_async((1,), countdown=30).id
    assert envelope(broker, job_id)["scheduled_at"]
    answer = job_info(app, job_id, timeout=0.1)
    assert answer["state"] == "unknown" and "no result backend" in answer["reason"]
