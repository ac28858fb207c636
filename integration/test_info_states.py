"""INFO answers every state a worker can know, with no result backend at all: active,
completed, retryable (waiting in a retry queue), discarded, cancelled, and ``unknown``
with a reason for a job nobody knows; with a Redis result backend, ``scheduled`` (with
its ``scheduled_at``) for a delayed job waiting in the broker (a real worker, a real
broker)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import amqp
import pytest
from celery import Celery

import ojs_kombu
from ojs_kombu.amqp.broker.control import ControlClient
from ojs_kombu.spec.job_ids import new_job_id
from ojs_kombu.spec.times import parse_time

from .apps import make_app
from .conftest import queue_depth, wait_until
from .workers import WorkerProcess, launch_worker

QUEUE = "info-states"
SCHEDULED_QUEUE = "info-scheduled"
#: The result backend of the ``scheduled`` test (its own Redis database).
BACKEND = "redis://127.0.0.1:6379/13"


@contextmanager
def cli_worker(broker_url: str, queue: str, backend: str, log: Path
               ) -> Iterator[WorkerProcess]:
    """``integration.cliapp``'s worker on ``queue`` with ``backend`` as its result backend,
    consuming its job and control queues."""
    with launch_worker(broker_url, "integration.cliapp", queue, hostname=f"{queue}@%h",
                       concurrency=4, log=log, control=True,
                       env={"OJS_TEST_RESULT_BACKEND": backend}) as worker:
        yield worker


@pytest.fixture(scope="module")
def no_backend_worker(broker_url: str, tmp_path_factory: pytest.TempPathFactory
                      ) -> Iterator[WorkerProcess]:
    log = tmp_path_factory.mktemp("info") / "worker.log"
    with cli_worker(broker_url, QUEUE, "none", log) as worker:
        yield worker


@pytest.fixture(scope="module")
def producer(broker_url: str) -> Celery:
    return make_app("info-producer", broker_url, None)


def test_info_answers_each_state_without_a_result_backend(
        producer: Celery, no_backend_worker: Any, amqp_channel: amqp.Channel) -> None:
    producer.connection_for_write().ensure_connection().connection.ensure_topology(QUEUE)
    assert producer.conf.result_backend is None

    def send(task: str, *args: Any, **options: Any) -> str:
        return producer.tasks[task].apply_async(args, queue=QUEUE, **options).id

    with ControlClient(producer) as client:
        def state(job_id: str) -> dict[str, Any]:
            return client.info(job_id, QUEUE, timeout=10)

        running = send("loop.until_cancelled", 60)
        active = wait_until(lambda: state(running)["state"] == "active" and state(running),
                            30, "active")
        assert active["worker_id"].startswith(f"{QUEUE}@") and active["attempt"] == 1

        done = send("math.add", 1, 2)
        assert wait_until(lambda: state(done)["state"] == "completed", 30, "completed")

        waiting = send("always.fail", ojs_retry={"max_attempts": 2,
                                                 "initial_interval": "PT60S",
                                                 "jitter": False})
        answer = wait_until(lambda: state(waiting)["state"] == "retryable" and state(waiting),
                            30, "retryable")
        assert answer["attempt"] == 1
        assert queue_depth(amqp_channel, f"ojs.queue.{QUEUE}") == 0  # it waits in the broker

        failed = send("toggle.fail")
        assert wait_until(lambda: state(failed)["state"] == "discarded", 30, "discarded")

        client.cancel(running, QUEUE)
        assert wait_until(lambda: state(running)["state"] == "cancelled", 30, "cancelled")

        nobody = state(new_job_id())
        assert nobody["state"] == "unknown" and "no result backend" in nobody["reason"]
        for answer in (state(j) for j in (running, done, waiting, failed)):
            assert "error" not in answer and "Error" not in str(answer)


def test_with_a_result_backend_a_delayed_job_answers_scheduled_then_completed(
        broker_url: str, amqp_channel: amqp.Channel, tmp_path: Path) -> None:
    producer = make_app("info-scheduled-producer", broker_url, BACKEND)
    producer.connection_for_write().ensure_connection().connection.ensure_topology(
        SCHEDULED_QUEUE)
    add = producer.tasks["math.add"]
    with cli_worker(broker_url, SCHEDULED_QUEUE, BACKEND, tmp_path / "worker.log"), \
            ControlClient(producer) as client:

        def state(job_id: str) -> dict[str, Any]:
            return client.info(job_id, SCHEDULED_QUEUE, timeout=10)

        sent = datetime.now(UTC)
        later = add.apply_async((1, 2), queue=SCHEDULED_QUEUE, countdown=120).id
        answer = state(later)
        assert answer["state"] == "scheduled", answer
        due = parse_time(answer["scheduled_at"])
        assert sent + timedelta(seconds=119) <= due <= sent + timedelta(seconds=122)

        batched, = ojs_kombu.enqueue_many(producer, [add.s(3, 4).set(queue=SCHEDULED_QUEUE,
                                                                      countdown=120)])
        assert state(batched.id)["state"] == "scheduled"

        soon = add.apply_async((5, 6), queue=SCHEDULED_QUEUE, countdown=3).id
        assert state(soon)["state"] in ("scheduled", "available", "active", "completed")
        assert wait_until(lambda: state(soon)["state"] == "completed", 40, "completed")
        assert producer.AsyncResult(soon).get(timeout=10) == 11
        assert state(later)["state"] == "scheduled"  # still waiting its 120 s
        for job_id in (later, batched.id):
            client.cancel(job_id, SCHEDULED_QUEUE)
