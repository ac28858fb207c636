"""Fault tests with counts (issue #6 item 3): nothing confirmed is ever lost.

Each test prints ``published / confirmed / refused / completed / duplicated /
lost`` and asserts ``lost == 0`` and duplicates within the in-flight window.
Run with ``.venv/bin/python -m pytest faults -s``; see faults/README.rst.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from ojs_kombu import reconnect

from .app import make_app
from .conftest import Counts, Workers, await_broker, rabbitmqctl, wait_until

#: Celery publishes with retries; give them room to span a broker restart
#: (1 + 2 + 4 + 8 + 16 s on the reconnection schedule).
PUBLISH_RETRY = {"max_retries": 5}


def producer(url: str) -> Celery:
    return make_app(url, task_publish_retry_policy=PUBLISH_RETRY)


def queue_depth(queue: str) -> int:
    for line in rabbitmqctl("list_queues", "name", "messages").splitlines():
        name, _, count = line.partition("\t")
        if name == f"ojs.queue.{queue}":
            return int(count)
    return -1


def publish(app: Celery, counts: Counts, n: int, *, seconds: float = 0.0,
            queue: str) -> None:
    task = app.tasks["faults.record"]
    for i in range(n):
        try:
            result = task.apply_async((seconds,), queue=queue)
        except Exception as exc:  # surfaced to the producer: counted, never silent
            counts.refused[f"attempt-{i}"] = repr(exc)
            continue
        counts.published.append(result.id)
        counts.confirmed.append(result.id)  # apply_async returns after the confirm


def test_kill_9_of_a_busy_worker_loses_nothing(fault_broker_url: str, workers: Workers) -> None:
    """(a) kill -9 a prefork worker (and its pool) mid-job, three times."""
    queue, kills, concurrency = "kill9", 3, 2
    app = producer(fault_broker_url)
    counts = Counts()
    publish(app, counts, 60, seconds=0.1, queue=queue)
    args = ("--pool", "prefork", "-c", str(concurrency), "--prefetch-multiplier", "1")
    for _ in range(kills):
        worker = workers.start(queue, *args)
        before = len(counts.completions(workers.done_file))
        # busy: it has completed jobs since it started and still has some to do
        wait_until(lambda b=before: len(counts.completions(workers.done_file)) >= b + 3, 60,
                   "the worker to get busy")
        workers.kill9(worker)
    workers.start(queue, *args)
    counts.wait_completed(workers.done_file, timeout=90)
    numbers = counts.report("kill -9 x3", workers.done_file)
    assert numbers["lost"] == 0
    assert numbers["refused"] == 0
    # each kill can only redeliver what that worker held: concurrency x prefetch multiplier
    assert numbers["duplicated"] <= kills * concurrency


def _stream(fault_broker_url: str, workers: Workers, queue: str, total: int,
            disrupt: Any, name: str) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """A producer publishes ``total`` confirmed jobs while a worker consumes;
    ``disrupt()`` runs once a fifth of them are confirmed."""
    events: list[dict[str, Any]] = []
    unsubscribe = reconnect.subscribe(events.append)
    app = producer(fault_broker_url)
    prefetch_multiplier, concurrency = 4, 4
    workers.start(queue, "--pool", "threads", "-c", str(concurrency),
                  "--prefetch-multiplier", str(prefetch_multiplier))
    counts = Counts()
    thread = threading.Thread(target=publish, args=(app, counts, total), kwargs={"queue": queue})
    try:
        thread.start()
        wait_until(lambda: len(counts.confirmed) >= total // 5, 120, "a fifth confirmed")
        disrupt()
        thread.join(240)
        assert not thread.is_alive(), "the producer never finished"
        counts.wait_completed(workers.done_file, timeout=120)
        wait_until(lambda: queue_depth(queue) == 0, 60, "the queue to drain")
    finally:
        unsubscribe()
        thread.join(1)
    numbers = counts.report(name, workers.done_file)
    log = workers.log.read_text()
    assert numbers["lost"] == 0, log[-5000:]
    # every job was either confirmed or surfaced as an exception to the producer
    assert numbers["confirmed"] + numbers["refused"] == total
    # redelivered: what the worker held unacked (one prefetch window per lost
    # connection); republished: a publish whose confirm the lost connection took
    # (at most one per producer reconnection)
    reconnections = sum(e["type"] == reconnect.RECONNECTED for e in events)
    window = concurrency * prefetch_multiplier
    assert numbers["duplicated"] <= 2 * window + reconnections, numbers
    assert "reconnected to" in log and "(worker)" in log, log[-5000:]
    return numbers, events


def test_broker_restart_mid_stream(fault_broker_url: str, workers: Workers,
                                   broker_app_running: None) -> None:
    """(b) ``stop_app``/``start_app`` while 5,000 confirmed jobs are published and consumed."""

    def restart() -> None:
        rabbitmqctl("stop_app")
        time.sleep(2)
        rabbitmqctl("start_app")
        await_broker()

    _, events = _stream(fault_broker_url, workers, "restart", 5000, restart,
                              "broker restart")
    assert any(e["data"]["role"] == "client" for e in events
               if e["type"] == reconnect.RECONNECTED), events


def test_close_all_connections_mid_stream(fault_broker_url: str, workers: Workers) -> None:
    """(c) ``close_all_connections`` while confirmed jobs are published and consumed."""
    numbers, events = _stream(
        fault_broker_url, workers, "closeall", 2000,
        lambda: rabbitmqctl("close_all_connections", "ojs_kombu fault test"),
        "close_all_connections")
    assert numbers["refused"] == 0  # the broker stayed up: every publish got through
    assert any(e["type"] == reconnect.RECONNECTED for e in events), events


@pytest.fixture(autouse=True)
def _clean_done(tmp_path: Path) -> None:
    (tmp_path / "done.txt").unlink(missing_ok=True)
