"""A worker on a py-amqp whose private hooks changed falls back to py-amqp's and kombu's
own paths, warns once for each, and runs every job exactly once (real broker, real
``celery worker``; the hooks are changed in integration/fallbackapp.py)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

import ojs_kombu

from .conftest import rabbitmqctl, wait_until
from .workers import WorkerProcess, launch_worker

QUEUE = "seam-fallback"
JOBS = 500


@pytest.fixture(scope="module")
def fallback_worker(broker_url: str, vhost: str, tmp_path_factory: pytest.TempPathFactory
                    ) -> Iterator[tuple[WorkerProcess, Path]]:
    log_path = tmp_path_factory.mktemp("fallback") / "worker.log"
    with launch_worker(broker_url, "integration.fallbackapp", QUEUE,
                       hostname=f"fallback-{os.getpid()}@%h", concurrency=4,
                       log=log_path) as worker:
        yield worker, log_path


def test_changed_hooks_fall_back_warn_once_and_lose_nothing(
        fallback_worker: tuple[WorkerProcess, Path], broker_url: str,
        vhost: str) -> None:
    worker, log_path = fallback_worker
    producer = Celery("producer", broker=broker_url, set_as_current=False)
    ojs_kombu.install(producer)
    key = f"ojs-test-fallback-{uuid.uuid4()}"
    runs = redis.Redis(host="127.0.0.1", port=6379)
    try:
        for n in range(JOBS):
            producer.send_task("fallback.count", (key, n), queue=QUEUE)
        wait_until(lambda: runs.llen(key) >= JOBS, 120, f"{JOBS} jobs run")

        def settled() -> bool:
            listed = rabbitmqctl("list_queues", "--no-table-headers", "-p", vhost, "name",
                                 "messages_ready", "messages_unacknowledged")
            return f"ojs.queue.{QUEUE}\t0\t0" in listed
        wait_until(settled, 60, "every job acked")
        ran = [int(n) for n in runs.lrange(key, 0, -1)]
        lost, duplicates = JOBS - len(set(ran)), len(ran) - len(set(ran))
        print(f"\nseam fallback: published {JOBS}, confirmed {JOBS}, ran {len(ran)}, "
              f"lost {lost}, duplicates {duplicates}")
        assert sorted(ran) == list(range(JOBS))
        assert worker.alive(), "the worker exited"
    finally:
        runs.delete(key)
        producer.close()
    log = log_path.read_text()
    read_warnings = [line for line in log.splitlines() if "TCPTransport._read " in line]
    ack_warnings = [line for line in log.splitlines() if "_on_basic_deliver" in line]
    assert len(read_warnings) == 1 and "py-amqp's own reader" in read_warnings[0], log[-3000:]
    assert len(ack_warnings) == 1 and "acking each delivery at once" in ack_warnings[0], \
        log[-3000:]
    assert "Traceback" not in log, log[-3000:]
