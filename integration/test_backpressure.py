"""Backpressure against the real broker: bounded job queues, QueueFullError on overflow,
blocking producers, drop_oldest into the DLQ (ojs-backpressure.md on AMQP)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import amqp
import pytest
from celery import Celery
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import ojs_kombu
from ojs_kombu.spec.errors import (
    BatchPublishError,
    BatchQueueFullError,
    JobNackedError,
    QueueFullError,
)

from .apps import make_app
from .conftest import body_of, get_message, queue_depth, rabbitmqctl, wait_until
from .workers import in_process_worker


@pytest.fixture(scope="module")
def metric_reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture(scope="module")
def bp_app(broker_url: str, metric_reader: InMemoryMetricReader) -> Celery:
    """A producer only: nothing consumes these queues unless a test does."""
    return make_app("backpressure", broker_url, None,
                    ojs_meter_provider=MeterProvider(metric_readers=[metric_reader]),
                    ojs_backpressure={"sample_interval": 0, "block_poll": 0.02},
                    ojs_queues={
                        "bp-reject": {"max_depth": 3, "warn_at": 0.6},
                        "bp-block": {"max_depth": 1, "strategy": "block",
                                     "block_timeout": 30.0},
                        "bp-block-timeout": {"max_depth": 1, "strategy": "block",
                                             "block_timeout": 0.3},
                        "bp-drop": {"max_depth": 2, "strategy": "drop_oldest"},
                        "bp-quorum": {"type": "quorum", "max_depth": 2,
                                      "dead_letter_strategy": "at-least-once"},
                        "bp-drop-tap": {"max_depth": 2, "strategy": "drop_oldest"},
                        "bp-batch": {"max_depth": 5},
                        "bp-batch-race": {"max_depth": 5},
                    })


@pytest.fixture
def events(bp_app: Celery) -> Iterator[list[dict[str, Any]]]:
    received: list[dict[str, Any]] = []
    subscription = ojs_kombu.subscribe(bp_app, received.append, event_types=["backpressure.*"])
    yield received
    subscription.cancel()


def send(app: Celery, queue: str, n: int) -> str:
    return app.tasks["math.add"].apply_async((n, n), queue=queue).id


def counted(reader: InMemoryMetricReader, name: str, queue: str) -> int:
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    return sum(p.value for p in metric.data.data_points
                               if p.attributes.get("queue") == queue)
    return 0


def rejected_total(reader: InMemoryMetricReader, queue: str) -> int:
    return counted(reader, "ojs.backpressure.rejected_total", queue)


def test_queue_arguments_on_the_broker(bp_app: Celery, vhost: str) -> None:
    from ojs_kombu import declare_topology

    declare_topology(bp_app, ["bp-reject", "bp-drop", "bp-quorum"])
    listing = rabbitmqctl("list_queues", "--no-table-headers", "-p", vhost, "name", "type",
                          "arguments")
    lines = {line.split("\t")[0]: line for line in listing.splitlines()}
    reject = lines["ojs.queue.bp-reject"]
    assert '{"x-max-length",3}' in reject and '{"x-overflow","reject-publish"}' in reject
    assert '{"x-overflow","drop-head"}' in lines["ojs.queue.bp-drop"]
    quorum = lines["ojs.queue.bp-quorum"]
    assert "\tquorum\t" in quorum and '{"x-dead-letter-strategy","at-least-once"}' in quorum


def test_reject_raises_queue_full_and_stores_nothing(
        bp_app: Celery, events: list[dict[str, Any]], amqp_channel: amqp.Channel,
        metric_reader: InMemoryMetricReader) -> None:
    accepted = [send(bp_app, "bp-reject", i) for i in range(3)]
    with pytest.raises(QueueFullError) as info:
        send(bp_app, "bp-reject", 99)
    error = info.value
    assert isinstance(error, JobNackedError)
    assert (error.queue, error.depth, error.bound, error.strategy) == ("bp-reject", 3, 3,
                                                                        "reject")
    assert error.retry_after > 0 and error.job_id not in accepted
    # nothing half-published: the queue holds exactly the accepted jobs, the DLQ nothing
    assert queue_depth(amqp_channel, "ojs.queue.bp-reject") == 3
    assert queue_depth(amqp_channel, "ojs.queue.dlx.bp-reject") == 0
    types = [e["type"] for e in events]
    assert types == ["backpressure.warning", "backpressure.rejected"]
    assert events[0]["data"]["depth"] == 2 and events[0]["data"]["bound"] == 3
    assert events[1]["data"] == {"queue": "bp-reject", "depth": 3, "bound": 3,
                                 "job_type": "math.add", "job_id": error.job_id,
                                 "strategy": "reject", "retry_after": error.retry_after}
    assert rejected_total(metric_reader, "bp-reject") == 1
    # a consumer makes room: publishing works again and the pressure clears
    ids = [body_of(get_message(amqp_channel, "ojs.queue.bp-reject"))["id"] for _ in range(3)]
    assert ids == accepted
    send(bp_app, "bp-reject", 100)
    assert events[-1]["type"] == "backpressure.cleared"


def test_block_waits_for_room_then_enqueues(
        bp_app: Celery, amqp_channel: amqp.Channel,
        metric_reader: InMemoryMetricReader) -> None:
    first = send(bp_app, "bp-block", 1)
    outcome: dict[str, Any] = {}

    def producer() -> None:
        try:
            outcome["id"] = send(bp_app, "bp-block", 2)
        except Exception as exc:
            outcome["error"] = exc
    thread = threading.Thread(target=producer)
    thread.start()
    # the broker refused the second job at least once: the producer is waiting
    wait_until(lambda: rejected_total(metric_reader, "bp-block") >= 1, what="a rejection")
    assert thread.is_alive() and "error" not in outcome
    assert body_of(get_message(amqp_channel, "ojs.queue.bp-block"))["id"] == first
    thread.join(30)
    assert "error" not in outcome, outcome.get("error")
    assert body_of(get_message(amqp_channel, "ojs.queue.bp-block"))["id"] == outcome["id"]


def test_block_raises_queue_full_after_its_timeout(bp_app: Celery,
                                                   amqp_channel: amqp.Channel) -> None:
    send(bp_app, "bp-block-timeout", 1)
    with pytest.raises(QueueFullError) as info:
        send(bp_app, "bp-block-timeout", 2)
    assert info.value.strategy == "block" and info.value.depth == 1
    assert queue_depth(amqp_channel, "ojs.queue.bp-block-timeout") == 1


def test_drop_oldest_dead_letters_the_oldest_job(bp_app: Celery,
                                                 amqp_channel: amqp.Channel) -> None:
    ids = [send(bp_app, "bp-drop", i) for i in range(3)]  # never raises
    assert queue_depth(amqp_channel, "ojs.queue.bp-drop") == 2
    dropped = get_message(amqp_channel, "ojs.queue.dlx.bp-drop")
    assert body_of(dropped)["id"] == ids[0]
    assert dropped.properties["application_headers"]["x-first-death-reason"] == "maxlen"
    kept = [body_of(get_message(amqp_channel, "ojs.queue.bp-drop"))["id"] for _ in range(2)]
    assert kept == ids[1:]


def test_a_worker_reports_each_job_a_drop_oldest_queue_dropped(
        bp_app: Celery, events: list[dict[str, Any]], amqp_channel: amqp.Channel,
        metric_reader: InMemoryMetricReader, vhost: str) -> None:
    """The tap ``ojs.queue.dropped.{q}`` is part of the queue's topology, so drops made
    while no worker runs are reported once one starts."""
    from ojs_kombu import declare_topology

    declare_topology(bp_app, ["bp-drop-tap"])
    listing = rabbitmqctl("list_queues", "--no-table-headers", "-p", vhost, "name", "arguments")
    tap = next(line for line in listing.splitlines()
               if line.startswith("ojs.queue.dropped.bp-drop-tap\t"))
    assert '{"x-max-length",10000}' in tap and '"x-message-ttl"' in tap
    assert not any(line.startswith("ojs.queue.dropped.bp-reject\t")
                   for line in listing.splitlines())  # reject queues have none
    # a scheduled job reaches the queue through the ladder (its first death: "expired")
    scheduled = bp_app.tasks["math.add"].apply_async((0, 0), queue="bp-drop-tap",
                                                     countdown=0.05).id
    wait_until(lambda: queue_depth(amqp_channel, "ojs.queue.bp-drop-tap") == 1,
               what="the scheduled job in its queue")
    later = [send(bp_app, "bp-drop-tap", i) for i in range(1, 5)]
    dropped_ids = [scheduled, *later[:2]]  # bound 2: the three oldest are dropped
    # the broker dead-letters a dropped job after it confirmed the publish that dropped it
    wait_until(lambda: queue_depth(amqp_channel, "ojs.queue.dropped.bp-drop-tap") == 3,
               what="the three dropped jobs in the tap")
    assert not [e for e in events if e["type"] == "backpressure.dropped"]
    with in_process_worker(bp_app, ["bp-drop-tap"], pool="solo", concurrency=1,
                           shutdown_timeout=30):
        wait_until(lambda: queue_depth(amqp_channel, "ojs.queue.dropped.bp-drop-tap") == 0
                   and len([e for e in events if e["type"] == "backpressure.dropped"]) == 3,
                   30, "three backpressure.dropped events")
        for job_id in later[2:]:  # the kept jobs run as usual
            bp_app.calls.wait_for(job_id, timeout=30)
    dropped = [e for e in events if e["type"] == "backpressure.dropped"]
    assert [e["data"]["job_id"] for e in dropped] == dropped_ids
    assert all(e["subject"] == "bp-drop-tap" and e["data"]["queue"] == "bp-drop-tap"
               and e["data"]["job_type"] == "math.add" and e["data"]["dropped_at"]
               for e in dropped)
    assert counted(metric_reader, "ojs.backpressure.dropped_total", "bp-drop-tap") == 3
    # the DLQ still holds every dropped job
    dead = [get_message(amqp_channel, "ojs.queue.dlx.bp-drop-tap") for _ in range(3)]
    assert [body_of(m)["id"] for m in dead] == dropped_ids
    assert dead[0].properties["application_headers"]["x-first-death-reason"] == "expired"
    assert all(m.properties["application_headers"]["x-death"][0]["reason"] == "maxlen"
               for m in dead)


def test_quorum_queue_with_at_least_once_rejects_when_full(
        bp_app: Celery, amqp_channel: amqp.Channel) -> None:
    """Quorum queues apply ``reject-publish`` once the queue is *over* its bound (the
    check trails the Raft log), so a publish or two past it may still be accepted."""
    accepted: list[str] = []
    with pytest.raises(QueueFullError) as info:
        for i in range(10):
            accepted.append(send(bp_app, "bp-quorum", i))
    assert 2 <= len(accepted) <= 4 and info.value.bound == 2
    assert info.value.depth == len(accepted)
    kept = [body_of(get_message(amqp_channel, "ojs.queue.bp-quorum"))
            for _ in range(len(accepted))]
    assert [k["id"] for k in kept] == accepted
    assert queue_depth(amqp_channel, "ojs.queue.bp-quorum") == 0  # the refused one is not there


def ids_in(channel: amqp.Channel, queue: str) -> list[str]:
    """Take every job off ``queue``; their ids in queue order."""
    return [body_of(get_message(channel, queue))["id"] for _ in range(queue_depth(channel, queue))]


def test_a_batch_that_does_not_fit_is_refused_whole_and_nothing_is_sent(
        bp_app: Celery, events: list[dict[str, Any]], amqp_channel: amqp.Channel) -> None:
    add = bp_app.tasks["math.add"]
    eight = [ojs_kombu.new_job_id() for _ in range(8)]
    with pytest.raises(QueueFullError) as info:  # empty queue, bound 5: 8 cannot fit
        ojs_kombu.enqueue_many(bp_app, [add.s(i, i).set(queue="bp-batch", task_id=job_id)
                                        for i, job_id in enumerate(eight)])
    error = info.value
    assert isinstance(error, BatchQueueFullError) and isinstance(error, BatchPublishError)
    assert list(error.rejected) == eight and error.accepted == ()
    assert (error.queue, error.depth, error.bound) == ("bp-batch", 0, 5)
    assert queue_depth(amqp_channel, "ojs.queue.bp-batch") == 0
    kept = [send(bp_app, "bp-batch", i) for i in range(3)]
    with pytest.raises(BatchQueueFullError) as info:  # 3 + 3 > 5: refused, depth unchanged
        ojs_kombu.enqueue_many(bp_app, [add.s(i, i).set(queue="bp-batch") for i in range(3)])
    assert info.value.depth == 3 and not info.value.accepted
    assert queue_depth(amqp_channel, "ojs.queue.bp-batch") == 3
    assert [(e["type"], e["data"]["count"], e["data"]["depth"]) for e in events
            if e["type"] == "backpressure.rejected"] == [("backpressure.rejected", 8, 0),
                                                         ("backpressure.rejected", 3, 3)]
    fits = ojs_kombu.enqueue_many(bp_app, [add.s(i, i).set(queue="bp-batch")
                                           for i in range(2)])
    assert ids_in(amqp_channel, "ojs.queue.bp-batch") == kept + [r.id for r in fits]


def test_broker_nacks_in_a_batch_name_exactly_the_refused_jobs(
        bp_app: Celery, amqp_channel: amqp.Channel, monkeypatch: pytest.MonkeyPatch) -> None:
    """The headroom check is made blind (it reads depth 0), so the broker itself
    refuses the jobs past the bound: the race with another producer, made certain."""
    monitor = bp_app.amqp.binding.backpressure
    admit = monitor.admit_batch
    monkeypatch.setattr(monitor, "admit_batch", lambda jobs, _read: admit(jobs, lambda _q: 0))
    earlier = [send(bp_app, "bp-batch-race", i) for i in range(3)]
    add = bp_app.tasks["math.add"]
    ids = [ojs_kombu.new_job_id() for _ in range(5)]
    with pytest.raises(BatchPublishError) as info:
        ojs_kombu.enqueue_many(bp_app, [add.s(i, i).set(queue="bp-batch-race", task_id=job_id)
                                        for i, job_id in enumerate(ids)])
    error = info.value
    assert isinstance(error, BatchQueueFullError) and isinstance(error, QueueFullError)
    assert error.accepted == tuple(ids[:2]) and list(error.rejected) == ids[2:]
    assert not error.unconfirmed
    assert all("Basic.Nack" in reason for reason in error.rejected.values())
    assert (error.queue, error.depth, error.bound) == ("bp-batch-race", 5, 5)
    assert ids_in(amqp_channel, "ojs.queue.bp-batch-race") == earlier + ids[:2]
    assert queue_depth(amqp_channel, "ojs.queue.dlx.bp-batch-race") == 0
