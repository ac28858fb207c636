"""Fault tests with counts (issue #6 item 3): nothing confirmed is ever lost.

Each test prints ``published / confirmed / refused / refused_but_ran /
completed / duplicated / lost`` and asserts ``lost == 0``, that every job was
confirmed or raised a typed exception to the producer, and duplicates within
the in-flight window.
Run with ``.venv/bin/python -m pytest faults -s``; see faults/README.rst.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from celery import Celery
from kombu.exceptions import OperationalError

import ojs_kombu
from ojs_kombu.spec.errors import JobPublishError

from .app import make_app
from .conftest import (
    PORT,
    Counts,
    Workers,
    await_broker,
    publish,
    rabbitmqctl,
    wait_until,
)

#: Celery publishes with retries; give them room to span a broker restart
#: (1 + 2 + 4 + 8 + 16 s on the reconnection schedule).
PUBLISH_RETRY = {"max_retries": 5}


def producer(url: str) -> Celery:
    return make_app(url, task_publish_retry_policy=PUBLISH_RETRY)


def producer_without_retries(url: str) -> Celery:
    """Celery's own switch (the app-wide ``apply_async(retry=False)``): a publish the
    broker does not confirm raises at once instead of being retried."""
    return make_app(url, task_publish_retry=False)


def refusal_is_typed(exc: BaseException, job_id: str) -> bool:
    """What a producer may see for a job that was not confirmed: kombu's
    ``OperationalError`` naming the broker (the connection failed), or an
    ``ojs_kombu`` publish error naming the job (the broker answered, or did not in time)."""
    if isinstance(exc, OperationalError):
        return f"(broker ojs://guest:**@127.0.0.1:{PORT}//)" in str(exc)
    return isinstance(exc, JobPublishError) and job_id in str(exc)


def queue_depth(queue: str) -> int:
    for line in rabbitmqctl("list_queues", "name", "messages").splitlines():
        name, _, count = line.partition("\t")
        if name == f"ojs.queue.{queue}":
            return int(count)
    return -1


KILLS, CONCURRENCY = 3, 2


def _kill_9_three_times(fault_broker_url: str, workers: Workers, queue: str,
                        task_name: str, name: str) -> dict[str, int]:
    """60 jobs of ``task_name``; a busy prefork worker (and its pool) killed -9 mid-job
    three times, then one that finishes; the counts."""
    app = producer(fault_broker_url)
    counts = Counts()
    publish(app, counts, 60, seconds=0.1, queue=queue, task_name=task_name)
    args = ("--pool", "prefork", "-c", str(CONCURRENCY), "--prefetch-multiplier", "1")
    for _ in range(KILLS):
        worker = workers.start(queue, *args)
        before = len(counts.completions(workers.done_file))
        # busy: it has completed jobs since it started and still has some to do
        wait_until(lambda b=before: len(counts.completions(workers.done_file)) >= b + 3, 60,
                   "the worker to get busy")
        workers.kill9(worker)
    workers.start(queue, *args)
    counts.wait_completed(workers.done_file, timeout=90)
    return counts.report(name, workers.done_file)


def test_kill_9_of_a_busy_worker_loses_nothing(fault_broker_url: str, workers: Workers) -> None:
    """(a) kill -9 a prefork worker (and its pool) mid-job, three times."""
    numbers = _kill_9_three_times(fault_broker_url, workers, "kill9", "faults.record",
                                  "kill -9 x3")
    assert numbers["lost"] == 0
    assert numbers["refused"] == 0
    # each kill can only redeliver what that worker held: concurrency x prefetch multiplier
    assert numbers["duplicated"] <= KILLS * CONCURRENCY


def test_kill_9_of_a_busy_worker_with_keyed_jobs_runs_each_once(
        fault_broker_url: str, workers: Workers) -> None:
    """(a) again with an idempotency key on every job (the job id, on the Redis store):
    what a killed worker held is redelivered, and what already ran is acked unrun."""
    numbers = _kill_9_three_times(fault_broker_url, workers, "kill9keyed",
                                  "faults.record_keyed", "kill -9 x3, keyed jobs")
    assert numbers["lost"] == 0
    assert numbers["refused"] == 0
    assert numbers["duplicated"] == 0


def _stream(app: Celery, workers: Workers, queue: str, total: int,
            disrupt: Callable[[Counts], Any], name: str
            ) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """``app`` publishes ``total`` confirmed jobs while a worker consumes;
    ``disrupt(counts)`` runs once a fifth of them are confirmed, and the producer goes on
    publishing (past ``total`` if need be) until it returned: a ``rabbitmqctl`` slowed
    down by a loaded machine must not find the stream already over."""
    events: list[dict[str, Any]] = []
    subscription = ojs_kombu.subscribe(app, events.append,
                                       event_types=["connection.reconnected"])
    prefetch_multiplier, concurrency = 4, 4
    workers.start(queue, "--pool", "threads", "-c", str(concurrency),
                  "--prefetch-multiplier", str(prefetch_multiplier))
    workers.wait_ready()
    counts = Counts()
    disrupted = threading.Event()
    thread = threading.Thread(target=publish, args=(app, counts, total),
                              kwargs={"queue": queue, "until": disrupted}, daemon=True)
    try:
        thread.start()
        wait_until(lambda: len(counts.confirmed) >= total // 5, 120, "a fifth confirmed")
        disrupt(counts)
        disrupted.set()
        thread.join(240)
        assert not thread.is_alive(), "the producer never finished"
        counts.wait_completed(workers.done_file, timeout=120)
        wait_until(lambda: queue_depth(queue) == 0, 60, "the queue to drain")
    finally:
        disrupted.set()
        subscription.cancel()
        thread.join(1)
    numbers = counts.report(name, workers.done_file)
    log = workers.log.read_text()
    assert numbers["lost"] == 0, log[-5000:]
    # every job was either confirmed or surfaced as an exception to the producer,
    # a typed one that says what failed
    assert numbers["confirmed"] + numbers["refused"] == numbers["published"] >= total, numbers
    for job, exc in counts.refused.items():
        assert refusal_is_typed(exc, job), f"{job}: {type(exc)}: {exc}"
    # redelivered: what the worker held unacked (one prefetch window per lost
    # connection); republished: a publish whose confirm the lost connection took
    # (at most one per producer reconnection)
    reconnections = sum(e["type"] == "connection.reconnected" for e in events)
    window = concurrency * prefetch_multiplier
    assert numbers["duplicated"] <= 2 * window + reconnections, numbers
    assert "reconnected to" in log and "(worker)" in log, log[-5000:]
    return numbers, events


def test_broker_restart_mid_stream(fault_broker_url: str, workers: Workers,
                                   broker_app_running: None) -> None:
    """(b) ``stop_app``/``start_app`` while 5,000 confirmed jobs are published and consumed."""

    def restart(counts: Counts) -> None:
        rabbitmqctl("stop_app")
        time.sleep(2)
        rabbitmqctl("start_app")
        await_broker()

    _, events = _stream(producer(fault_broker_url), workers, "restart", 5000, restart,
                        "broker restart")
    assert any(e["data"]["role"] == "client" for e in events
               if e["type"] == "connection.reconnected"), events


def test_broker_restart_with_a_producer_that_does_not_retry(
        fault_broker_url: str, workers: Workers, broker_app_running: None) -> None:
    """(b), the other branch: with ``task_publish_retry=False`` every publish the
    restart breaks raises to the producer, typed; the producer goes on publishing and
    every job it saw confirmed runs."""

    def restart(counts: Counts) -> None:
        rabbitmqctl("stop_app")
        # down until two publishes failed: the one in flight when the broker went
        # (or the first to find its connection closed) and one that found no broker
        wait_until(lambda: len(counts.refused) >= 2, 120, "two publishes to be refused")
        rabbitmqctl("start_app")
        await_broker()

    numbers, events = _stream(producer_without_retries(fault_broker_url), workers,
                              "restart-noretry", 2000, restart,
                              "broker restart, no publish retries")
    assert numbers["refused"] >= 2, numbers  # the branch ran
    assert any(e["data"]["role"] == "client" for e in events
               if e["type"] == "connection.reconnected"), events


def test_close_all_connections_mid_stream(fault_broker_url: str, workers: Workers) -> None:
    """(c) ``close_all_connections`` while confirmed jobs are published and consumed."""
    numbers, events = _stream(
        producer(fault_broker_url), workers, "closeall", 2000,
        lambda counts: rabbitmqctl("close_all_connections", "ojs_kombu fault test"),
        "close_all_connections")
    assert numbers["refused"] == 0  # the broker stayed up: every publish got through
    assert any(e["type"] == "connection.reconnected" for e in events), events
