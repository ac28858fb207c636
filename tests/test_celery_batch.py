"""Batch enqueue, the part that needs no broker: what each job becomes, what is refused."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from celery import Celery, group

import ojs_kombu
from ojs_kombu.celery.batch import JobEncoder, _flatten, enqueue_many
from ojs_kombu.spec.encode import OutgoingJob
from ojs_kombu.spec.errors import InvalidJobIdError, JobEncodeError, QueueNameError


@pytest.fixture
def app() -> Celery:
    app = Celery("batch", broker="ojs://guest:guest@127.0.0.1:1//", set_as_current=False)
    ojs_kombu.install(app)

    @app.task(name="email.send", shared=False, queue="email", time_limit=30)
    def send(to: str, template: str = "welcome") -> None: ...

    @app.task(name="math.add", shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    return app


def envelope(job: OutgoingJob) -> dict:
    return json.loads(job.body)


def test_a_signature_becomes_the_same_ojs_job_apply_async_would_send(app: Celery) -> None:
    sig = app.tasks["email.send"].s("a@example.com", template="reset").set(priority=7)
    job = JobEncoder(app).encode(0, sig)
    body = envelope(job)
    assert job.queue == "email"  # the task's own queue
    assert body["type"] == "email.send" and body["args"] == ["a@example.com"]
    assert body["x_celery"]["kwargs"] == {"template": "reset"}
    assert body["priority"] == 7 and job.properties["priority"] == 7
    assert body["timeout"] == 30  # the task's time_limit
    assert job.properties["message_id"] == body["id"] == job.job_id
    assert job.properties["application_headers"]["x-ojs-queue"] == "email"
    assert ojs_kombu.JobEnvelope.model_validate_json(job.body).id == job.job_id


def test_tuples_names_and_schedules(app: Celery) -> None:
    now = datetime.now(UTC)  # before the encoder reads its clock: delays only shrink
    encoder = JobEncoder(app)
    later = encoder.encode(0, ("math.add", (1, 2), {}, {"countdown": 60, "queue": "math"}))
    assert later.queue == "math" and 59_000 <= later.delay_ms <= 60_000
    assert envelope(later)["scheduled_at"] > now.isoformat()
    at = now + timedelta(hours=1)
    eta = encoder.encode(1, (app.tasks["math.add"], [3, 4], None, {"eta": at, "expires": 7200}))
    assert eta.queue == "default"  # Celery's default queue is OJS's default
    assert 3_590_000 < eta.delay_ms <= 3_600_001
    assert "expires_at" in envelope(eta)
    assert envelope(encoder.encode(2, ("math.add",)))["args"] == []


def test_ojs_options_and_caller_task_id(app: Celery) -> None:
    job_id = ojs_kombu.new_job_id()
    job = JobEncoder(app).encode(0, app.tasks["math.add"].s(1, 2).set(
        task_id=job_id, ojs_meta={"tags": ["a", "b"]}, ojs_retry={"max_attempts": 7}))
    body = envelope(job)
    assert job.job_id == job_id and body["meta"] == {"tags": ["a", "b"]}
    assert body["retry"]["max_attempts"] == 7
    assert job.properties["application_headers"]["x-ojs-max-attempts"] == 7
    assert job.properties["application_headers"]["x-ojs-tags"] == "a,b"


@pytest.mark.parametrize("jobs, error, words", [
    ([("math.add", (1, 2), {}, {"link": "x"})], JobEncodeError, "link"),
    ([("math.add", (1,), {}, {"routing_key": "elsewhere"})], JobEncodeError, "routing_key"),
    (["math.add"], JobEncodeError, "batch job #1 is str"),
    ([("math.add", (object(),))], JobEncodeError, "JSON"),
    ([("math.add", (1, 2), {}, {"task_id": 42})], InvalidJobIdError, "not a string"),
    ([("math.add", (1, 2), {}, {"queue": "dlx.email"})], QueueNameError, "dlx.email"),
], ids=["link", "routing-key", "not-a-job", "non-json-arg", "bad-task-id", "bad-queue"])
def test_bad_jobs_are_refused_before_anything_is_sent(app: Celery, jobs: list, error: type,
                                                       words: str) -> None:
    # The broker URL points at port 1: reaching it would raise a connection error instead.
    with pytest.raises(error, match=words):
        enqueue_many(app, [("math.add", (1, 2)), *jobs])


def test_chains_and_repeated_ids_are_refused(app: Celery) -> None:
    add = app.tasks["math.add"]
    with pytest.raises(JobEncodeError, match="chain"):
        enqueue_many(app, [add.s(1, 2) | add.s(3)])
    job_id = ojs_kombu.new_job_id()
    with pytest.raises(InvalidJobIdError, match="twice"):
        enqueue_many(app, [add.s(1, 2).set(task_id=job_id), add.s(2, 3).set(task_id=job_id)])


def test_groups_are_flattened_in_order(app: Celery) -> None:
    add = app.tasks["math.add"]
    flat = list(_flatten(group(add.s(1, 1), group(add.s(2, 2), add.s(3, 3)))))
    assert [sig.args for sig in flat] == [(1, 1), (2, 2), (3, 3)]


def test_eager_mode_runs_the_jobs_locally(app: Celery) -> None:
    app.conf.task_always_eager = True
    results = enqueue_many(app, [app.tasks["math.add"].s(1, 2), ("math.add", (3, 4))])
    assert [r.get() for r in results] == [3, 7]
