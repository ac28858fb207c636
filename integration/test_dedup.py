"""Unique jobs and idempotency keys on the real Redis and RabbitMQ, with counts (issue 29).

Workers are ``celery worker`` subprocesses of :mod:`integration.dedupapp`; every run
adds one to a Redis hash, so "ran once" is counted, not inferred.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import amqp
import pytest
import redis
from celery import Celery

from ojs_kombu.celery.dedup_store import store_for
from ojs_kombu.spec.envelope import UniquePolicy
from ojs_kombu.spec.errors import DuplicateJobError
from ojs_kombu.spec.job_ids import new_job_id
from ojs_kombu.spec.unique import fingerprint

from .conftest import publish_raw, queue_depth, rabbitmqctl, wait_until
from .dedupapp import REDIS, make_dedup_app, runs_key
from .workers import WorkerProcess, launch_worker

COUNTER = redis.Redis.from_url(f"{REDIS}/2")
#: Minutes of this module on one xdist worker: it goes out before the other modules
#: (integration/conftest.py), not last and alone at the end of the run.
XDIST_LONG = True


def dedup_worker(broker_url: str, queue: str, log: Path, concurrency: int = 2,
                 **env: str) -> WorkerProcess:
    """A prefork worker of :mod:`integration.dedupapp` on ``queue``, consuming."""
    return launch_worker(broker_url, "integration.dedupapp", queue, pool="prefork",
                         concurrency=concurrency, log=log, env=env,
                         without=("mingle", "gossip", "heartbeat"))


@pytest.fixture(scope="module")
def producer(broker_url: str) -> Celery:
    return make_dedup_app(broker_url)


@pytest.fixture
def tag() -> Iterator[str]:
    name = uuid.uuid4().hex
    yield name
    COUNTER.delete(runs_key(name))


def runs(tag: str) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in COUNTER.hgetall(runs_key(tag)).items()}


def test_1000_jobs_each_published_twice_run_1000_times(
        producer: Celery, broker_url: str, tag: str, tmp_path: Path) -> None:
    count = producer.tasks["dedup.count"]
    pairs = []
    for n in range(1000):
        key = f"{tag}:{n}"
        pairs.append((count.apply_async((tag, n), queue="dedup-pairs", ojs_idempotency_key=key),
                      count.apply_async((tag, n), queue="dedup-pairs",
                                        ojs_idempotency_key=key)))
    worker = dedup_worker(broker_url, "dedup-pairs", tmp_path / "worker.log", concurrency=2)
    try:
        for first, second in pairs:
            assert first.get(timeout=120) == second.get(timeout=120)
    finally:
        worker.stop()
    counted = runs(tag)
    print(f"\n[published twice] published=2000 keys=1000 runs={sum(counted.values())} "
          f"duplicated={sum(v - 1 for v in counted.values())} lost={1000 - len(counted)}")
    assert len(counted) == 1000 and set(counted.values()) == {1}


def test_a_foreign_producers_keyed_job_sent_twice_runs_once(
        broker_url: str, amqp_channel: amqp.Channel, tag: str, tmp_path: Path) -> None:
    """Raw py-amqp, the same job id published twice with ``x-ojs-idempotency-key``."""
    job_id = new_job_id()
    for _ in range(2):
        publish_foreign(amqp_channel, "dedup-foreign-key", job_id, [tag, 3],
                        headers={"x-ojs-idempotency-key": f"{tag}:foreign"})
    worker = dedup_worker(broker_url, "dedup-foreign-key", tmp_path / "worker.log")
    try:
        wait_until(lambda: queue_depth(amqp_channel, "ojs.queue.dedup-foreign-key") == 0
                   and sum(runs(tag).values()) >= 1, 60, "both copies consumed")
        store = store_for(settings_of(broker_url))
        wait_until(lambda: (store.show("key", f"{tag}:foreign") or {}).get("s")
                   == "completed", 20, "the key completed")
        wait_until(lambda: log_of(tmp_path).count(f"[{job_id}] succeeded") == 2, 20,
                   "both deliveries acked")
    finally:
        worker.stop()
    assert runs(tag) == {f"{tag}:foreign": 1}


def log_of(tmp_path: Path) -> str:
    return (tmp_path / "worker.log").read_text()


def settings_of(broker_url: str) -> object:
    return make_dedup_app(broker_url).amqp.binding.settings


def publish_foreign(channel: amqp.Channel, queue: str, job_id: str, args: list[object], *,
                    headers: dict[str, object] | None = None,
                    unique: dict[str, object] | None = None) -> None:
    """What a producer without ojs_kombu sends (binding sections 5.1, 6), declaring the
    queue as section 7.2 asks (priority queues are optional; the app asks for none)."""
    channel.queue_declare(f"ojs.queue.{queue}", durable=True, auto_delete=False,
                          arguments={"x-dead-letter-exchange": "ojs.exchange.dlx",
                                     "x-dead-letter-routing-key": queue})
    channel.exchange_declare("ojs.exchange.direct", "direct", durable=True, auto_delete=False)
    channel.queue_bind(f"ojs.queue.{queue}", "ojs.exchange.direct", queue)
    envelope: dict[str, object] = {"specversion": "1.0", "id": job_id, "type": "dedup.count",
                                   "queue": queue, "args": args}
    if unique is not None:
        envelope["unique"] = unique
    publish_raw(channel,
                amqp.Message(json.dumps(envelope), content_type="application/openjobspec+json",
                             message_id=job_id, delivery_mode=2,
                             application_headers={"x-ojs-attempt": 1, **(headers or {})}),
                queue)


def unique_fingerprint(policy: dict[str, object], queue: str, args: list[object]) -> str:
    return fingerprint(UniquePolicy.model_validate(policy), job_type="dedup.count",
                       queue=queue, args=args, kwargs={})


def test_reject_names_the_existing_job(producer: Celery, tag: str) -> None:
    policy = {"keys": ["type", "args"], "period": "PT1M"}
    count = producer.tasks["dedup.count"]
    first = count.apply_async((tag, 1), queue="dedup-idle", ojs_unique=policy)
    with pytest.raises(DuplicateJobError) as caught:
        count.apply_async((tag, 1), queue="dedup-idle", ojs_unique=policy)
    assert caught.value.existing_job_id == first.id
    assert first.id in str(caught.value)
    # other arguments are another job
    count.apply_async((tag, 2), queue="dedup-idle", ojs_unique=policy)


def test_ignore_returns_the_existing_job_and_publishes_nothing(
        producer: Celery, amqp_channel: amqp.Channel, tag: str) -> None:
    policy = {"keys": ["type", "queue", "args"], "on_conflict": "ignore", "period": "PT1M"}
    count = producer.tasks["dedup.count"]
    first = count.apply_async((tag, 1), queue="dedup-ignore", ojs_unique=policy)
    before = queue_depth(amqp_channel, "ojs.queue.dedup-ignore")
    second = count.apply_async((tag, 1), queue="dedup-ignore", ojs_unique=policy)
    assert second.id == first.id
    assert queue_depth(amqp_channel, "ojs.queue.dedup-ignore") == before


def test_replace_cancels_the_existing_job_and_runs_the_new_one(
        producer: Celery, broker_url: str, tag: str, tmp_path: Path) -> None:
    policy = {"keys": ["type", "args"], "on_conflict": "replace", "period": "PT1M"}
    count = producer.tasks["dedup.count"]
    first = count.apply_async((tag, 1), queue="dedup-replace", ojs_unique=policy)
    second = count.apply_async((tag, 1), queue="dedup-replace", ojs_unique=policy)
    assert second.id != first.id
    worker = dedup_worker(broker_url, "dedup-replace", tmp_path / "worker.log")
    try:
        assert second.get(timeout=60) == 2
        wait_until(lambda: first.state in ("REVOKED", "SUCCESS") or
                   f"[{first.id}] ignored" in (tmp_path / "worker.log").read_text(), 30,
                   "the replaced job settled")
    finally:
        worker.stop()
    assert runs(tag) == {second.id: 1}


def test_a_replaced_job_never_runs_when_its_cancel_comes_late(
        producer: Celery, broker_url: str, tag: str, tmp_path: Path,
        amqp_channel: amqp.Channel) -> None:
    """The CANCEL of the replaced job has not reached a worker (purged here: a worker that
    reads it late) and the job that replaced it completed first, which frees its unique
    record: the replaced job, once due, is still skipped, never run."""
    queue = f"dedup-late-{tag[:6]}"
    policy = {"keys": ["type", "args"], "on_conflict": "replace", "period": "PT1M"}
    count = producer.tasks["dedup.count"]
    first = count.apply_async((tag, 1), queue=queue, ojs_unique=policy, countdown=3)
    second = count.apply_async((tag, 1), queue=queue, ojs_unique=policy)
    amqp_channel.queue_purge(f"ojs.queue.control.{queue}")  # the CANCEL, never read
    log = tmp_path / "worker.log"
    worker = dedup_worker(broker_url, queue, log, concurrency=2)
    try:
        assert second.get(timeout=60) == 2
        wait_until(lambda: f"job {first.id}: replaced by job {second.id}" in log.read_text(),
                   60, "the replaced job, due, skipped")
    finally:
        worker.stop()
    assert runs(tag) == {second.id: 1}


def test_replace_except_schedule_keeps_the_existing_schedule(producer: Celery,
                                                             tag: str) -> None:
    policy = {"keys": ["type", "args"], "on_conflict": "replace_except_schedule",
              "period": "PT5M"}
    count = producer.tasks["dedup.count"]
    first = count.apply_async((tag, 1), queue="dedup-idle", ojs_unique=policy, countdown=120)
    second = count.apply_async((tag, 1), queue="dedup-idle", ojs_unique=policy)
    store = store_for(producer.amqp.binding.settings)
    record = store.show("unique", unique_fingerprint(policy, "dedup-idle", [tag, 1]))
    assert record is not None
    assert record["j"] == second.id != first.id
    assert record["s"] == "scheduled" and record["t"]


def test_a_completed_job_stops_blocking_unless_completed_is_checked(
        producer: Celery, broker_url: str, tag: str, tmp_path: Path) -> None:
    count = producer.tasks["dedup.count"]
    plain = {"keys": ["type", "args"], "period": "PT1M"}
    strict = {**plain, "states": ["available", "active", "completed"]}
    worker = dedup_worker(broker_url, "dedup-done", tmp_path / "worker.log")
    try:
        assert count.apply_async((tag, 1), queue="dedup-done", ojs_unique=plain).get(60) == 2
        fp = unique_fingerprint(plain, "dedup-done", [tag, 1])
        wait_until(lambda: store_for(producer.amqp.binding.settings).show("unique", fp)
                   is None, 20, "the completed job's record to go")
        assert count.apply_async((tag, 1), queue="dedup-done", ojs_unique=plain).get(60) == 2
        done = count.apply_async((tag, 2), queue="dedup-done", ojs_unique=strict)
        assert done.get(60) == 4
        with pytest.raises(DuplicateJobError) as caught:
            wait_until(lambda: count.apply_async((tag, 2), queue="dedup-done",
                                                 ojs_unique=strict) and False, 10,
                       "a refusal")
        assert caught.value.existing_job_id == done.id
    finally:
        worker.stop()


@pytest.mark.parametrize("mode", ["ignore", "reject", "replace"])
def test_a_foreign_producers_unique_job(broker_url: str, amqp_channel: amqp.Channel,
                                        tag: str, tmp_path: Path, mode: str) -> None:
    """Two jobs of another producer with one fingerprint, the first still running when
    the second arrives: ``on_conflict`` settles it on the worker."""
    queue = f"dedup-foreign-{mode}-{tag[:6]}"
    policy = {"keys": ["type", "queue"], "on_conflict": mode, "period": "PT1M"}
    first, second = new_job_id(), new_job_id()
    gate = tmp_path / "gate"  # the first job runs until the second has settled
    log = tmp_path / "worker.log"
    worker = dedup_worker(broker_url, queue, log, concurrency=2)
    try:
        publish_foreign(amqp_channel, queue, first, [tag, 1, 120.0, str(gate)], unique=policy)
        store = store_for(settings_of(broker_url))
        fp = unique_fingerprint(policy, queue, [])
        wait_until(lambda: (store.show("unique", fp) or {}).get("s") == "active", 60,
                   "the first job running")
        publish_foreign(amqp_channel, queue, second, [tag, 1, 0.0], unique=policy)
        # what settles the second job in each mode, seen before the worker stops (a job
        # only received when it stops goes back to its queue and settles nothing)
        settled = {"ignore": lambda: f"[{second}] ignored" in log.read_text(),
                   "reject": lambda: queue_depth(amqp_channel, f"ojs.queue.dlx.{queue}") == 1,
                   "replace": lambda: second in runs(tag)}[mode]
        wait_until(settled, 60, f"the second job settled ({mode})")
        gate.touch()
        wait_until(lambda: first in runs(tag) or mode == "replace", 30, "the first job ran")
    finally:
        gate.touch()
        worker.stop()
    counted = runs(tag)
    if mode == "replace":
        assert counted.get(second) == 1
    else:
        assert counted == {first: 1}
    assert queue_depth(amqp_channel, f"ojs.queue.{queue}") == 0


def test_with_the_store_down_a_keyed_job_runs_and_says_dedup_is_degraded(
        producer: Celery, broker_url: str, tag: str, tmp_path: Path) -> None:
    count = producer.tasks["dedup.count"]
    result = count.apply_async((tag, 5), queue="dedup-down", ojs_idempotency_key=f"{tag}:d")
    log = tmp_path / "worker.log"
    worker = dedup_worker(broker_url, "dedup-down", log,
                          OJS_TEST_DEDUP_URL="redis://127.0.0.1:6399/0")
    try:
        assert result.get(timeout=60) == 10
    finally:
        worker.stop()
    assert runs(tag) == {f"{tag}:d": 1}
    assert "dedup degraded" in log.read_text()


def test_with_the_store_down_retry_leaves_the_job_for_later(
        producer: Celery, broker_url: str, tag: str, tmp_path: Path, vhost: str) -> None:
    count = producer.tasks["dedup.count"]
    count.apply_async((tag, 5), queue="dedup-down-retry", ojs_idempotency_key=f"{tag}:r",
                      ojs_retry={"max_attempts": 50, "initial_interval": "PT1S",
                                 "jitter": False, "backoff_coefficient": 1.0})
    log = tmp_path / "worker.log"
    worker = dedup_worker(broker_url, "dedup-down-retry", log,
                          OJS_TEST_DEDUP_URL="redis://127.0.0.1:6399/0",
                          OJS_TEST_DEDUP_WHEN_DOWN="retry")
    try:
        wait_until(lambda: log.read_text().count("retried later") >= 2, 60,
                   "two deliveries left for later")
    finally:
        worker.stop()
    assert runs(tag) == {}
    # still held by the broker for its retry: nothing acked as a duplicate, nothing lost.
    # The listing is not one snapshot: a job whose retry delay ends while it runs moves
    # from the retry queue to the job queue and can be counted in neither, so list again.
    def waiting() -> int:
        held = rabbitmqctl("list_queues", "-p", vhost, "--no-table-headers", "name", "messages")
        return sum(int(count) for name, _, count in
                   (line.partition("\t") for line in held.splitlines())
                   if "dedup-down-retry" in name and ".dlx." not in name)

    # A worker stopped right after it published the retry copy may not have acked the
    # delivery it replaces: the broker then holds both (at-least-once; the idempotency
    # key runs the job once when the store is back).  Lost is what must never happen.
    counts: list[int] = []
    wait_until(lambda: counts.append(waiting()) or counts[-1] in (1, 2), 20,
               "the job held in its retry or job queue")
    print(f"\nstore down, retry: published 1, ran 0, held {counts[-1]}, lost 0")
    assert counts[-1] in (1, 2), counts
