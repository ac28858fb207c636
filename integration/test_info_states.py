"""INFO answers every state a worker can know, with no result backend at all: active,
completed, retryable (waiting in a retry queue), discarded, cancelled, and ``unknown``
with a reason for a job nobody knows (a real worker, a real broker)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import amqp
import pytest
from celery import Celery

from ojs_kombu.amqp.control import ControlClient
from ojs_kombu.spec.job_ids import new_job_id

from .apps import make_app
from .conftest import queue_depth, wait_until

ROOT = Path(__file__).resolve().parents[1]
QUEUE = "info-states"


@pytest.fixture(scope="module")
def no_backend_worker(broker_url: str, tmp_path_factory: pytest.TempPathFactory
                      ) -> Iterator[subprocess.Popen[bytes]]:
    log = tmp_path_factory.mktemp("info") / "worker.log"
    env = {**os.environ, "OJS_TEST_BROKER_URL": broker_url, "OJS_TEST_RESULT_BACKEND": "none"}
    with log.open("ab") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "integration.cliapp", "worker", "-Q", QUEUE,
             "-n", f"{QUEUE}@%h", "--pool", "threads", "-c", "4", "--loglevel", "INFO",
             "--without-mingle", "--without-gossip"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield worker
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(10)


@pytest.fixture(scope="module")
def producer(broker_url: str) -> Celery:
    return make_app("info-producer", broker_url, None)


def test_info_answers_each_state_without_a_result_backend(
        producer: Celery, no_backend_worker: Any, amqp_channel: amqp.Channel) -> None:
    producer.connection_for_write().ensure_connection().connection.ensure_topology(QUEUE)
    wait_until(lambda: amqp_channel.queue_declare(f"ojs.queue.control.{QUEUE}",
                                                  passive=True).consumer_count,
               90, "the worker of info-states")
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
