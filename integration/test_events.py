"""OJS lifecycle events from a real worker, in lifecycle order, through every sink."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import amqp
import pytest
from celery import Celery

import ojs_kombu
from ojs_kombu.events import Event
from ojs_kombu.events.wire import BATCH_CONTENT_TYPE, COUNT_HEADER, decode_events

from .apps import make_app
from .conftest import get_message, wait_until
from .test_helpers import check_event
from .workers import launch_worker

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Collector:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)

    def of(self, job_id: str) -> list[Event]:
        with self._lock:
            return [e for e in self.events if e.subject == job_id]

    def types_of(self, job_id: str) -> list[str]:
        return [e.type for e in self.of(job_id)]


@pytest.fixture
def collector(app: Celery) -> Iterator[Collector]:
    collected = Collector()
    subscription = ojs_kombu.subscribe(app, collected)
    yield collected
    subscription.cancel()


def check(events: list[Event]) -> None:
    """Schema and data model: ojs_kombu builds events without validating them."""
    for event in events:
        check_event(event.to_dict())
        Event.model_validate(event.to_dict())


def test_retried_job_events_come_in_lifecycle_order(app: Celery, worker: Any,
                                                    collector: Collector) -> None:
    result = app.tasks["flaky.twice"].apply_async(queue="events",
                                                  ojs_meta={"traceparent": TRACEPARENT})
    assert result.get(timeout=30) == "done on attempt 3"
    expected = ["job.enqueued"] + ["job.started", "job.failed", "job.retrying"] * 2 + [
        "job.started", "job.completed"]
    wait_until(lambda: collector.types_of(result.id) == expected, timeout=10,
               what=f"events {expected}, got {collector.types_of(result.id)}")
    events = collector.of(result.id)
    check(events)
    assert all(e.data["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736" for e in events)
    started = [e.data for e in events if e.type == "job.started"]
    assert [d["attempt"] for d in started] == [1, 2, 3]
    assert {d["worker_id"] for d in started} == {worker.hostname}
    failed = [e.data for e in events if e.type == "job.failed"]
    assert [d["error"]["retryable"] for d in failed] == [True, True]
    assert failed[0]["error"]["code"] == "HANDLER_ERROR"
    retrying = [e.data for e in events if e.type == "job.retrying"]
    assert [(d["attempt"], d["max_attempts"]) for d in retrying] == [(1, 3), (2, 3)]
    completed = events[-1].data
    assert completed["attempt"] == 3 and completed["duration_ms"] >= 0
    assert completed["result"] == {"value": "done on attempt 3"}
    assert all(e.source.startswith("ojs://integration/") for e in events)


def test_exhausted_job_ends_with_discarded(app: Celery, worker: Any,
                                          collector: Collector) -> None:
    result = app.tasks["reject.value"].apply_async(queue="events")
    wait_until(lambda: collector.types_of(result.id)[-1:] == ["job.discarded"], timeout=30,
               what="job.discarded")
    assert collector.types_of(result.id) == ["job.enqueued", "job.started", "job.failed",
                                            "job.discarded"]
    events = collector.of(result.id)
    check(events)
    assert events[2].data["error"]["retryable"] is False
    assert events[3].data["total_attempts"] == 1
    assert events[3].data["last_error"]["code"] == "NON_RETRYABLE_ERROR"


def test_scheduled_and_expired_jobs(app: Celery, worker: Any, collector: Collector) -> None:
    from datetime import UTC, datetime, timedelta

    later = app.tasks["math.add"].apply_async((1, 2), queue="canvas", countdown=0.5)
    assert later.get(timeout=20) == 3
    assert collector.types_of(later.id)[:1] == ["job.scheduled"]
    expired = app.tasks["math.add"].apply_async(
        (1, 2), queue="canvas", countdown=1, expires=datetime.now(UTC) + timedelta(seconds=0.3))
    wait_until(lambda: "job.expired" in collector.types_of(expired.id), timeout=20,
               what="job.expired")
    events = collector.of(expired.id)
    check(events)
    assert [e.type for e in events] == ["job.scheduled", "job.expired"]
    assert events[1].data["ttl_ms"] >= 0


def test_amqp_sink_publishes_to_a_topic_exchange(app: Celery, worker: Any,
                                                 amqp_channel: amqp.Channel) -> None:
    amqp_channel.queue_declare("events-tap", exclusive=True)
    amqp_channel.queue_bind("events-tap", "ojs.exchange.events", "job.*")
    result = app.tasks["math.add"].apply_async((2, 2), queue="canvas")
    assert result.get(timeout=20) == 4
    seen: list[dict[str, Any]] = []
    while not any(e["type"] == "job.completed" and e["subject"] == result.id for e in seen):
        message = get_message(amqp_channel, "events-tap", timeout=20)
        assert message.properties["content_type"] == BATCH_CONTENT_TYPE  # the default
        batch = decode_events(message.body, message.properties["content_type"])
        assert batch and message.properties["application_headers"][COUNT_HEADER] == len(batch)
        assert {e["type"] for e in batch} == {message.delivery_info["routing_key"]}
        seen += batch
    mine = [e for e in seen if e["subject"] == result.id]
    assert [e["type"] for e in mine] == ["job.enqueued", "job.started", "job.completed"]
    for event in mine:
        check_event(event)
        Event.model_validate(event)


def tap_events(channel: amqp.Channel, queue: str, until: Any) -> list[dict[str, Any]]:
    """Every event of the tap's messages, in order, until ``until(events)`` holds."""
    seen: list[dict[str, Any]] = []
    while not until(seen):
        message = get_message(channel, queue, timeout=20)
        seen += decode_events(message.body, message.properties.get("content_type"))
    return seen


def test_batched_amqp_events_keep_a_retried_job_in_lifecycle_order(
        app: Celery, worker: Any, amqp_channel: amqp.Channel) -> None:
    """Batches group events by type; a job's events must still read in lifecycle order
    (events spec section 9.2) for a consumer of every job event type."""
    amqp_channel.queue_declare("events-order-tap", exclusive=True)
    amqp_channel.queue_bind("events-order-tap", "ojs.exchange.events", "job.*")
    result = app.tasks["flaky.twice"].apply_async(queue="events")
    assert result.get(timeout=30) == "done on attempt 3"
    seen = tap_events(amqp_channel, "events-order-tap", lambda seen: any(
        e["type"] == "job.completed" and e["subject"] == result.id for e in seen))
    assert [e["type"] for e in seen if e["subject"] == result.id] == ["job.enqueued"] + [
        "job.started", "job.failed", "job.retrying"] * 2 + ["job.started", "job.completed"]


def test_amqp_sink_with_batch_size_1_sends_one_event_per_message(
        broker_url: str, amqp_channel: amqp.Channel) -> None:
    producer = make_app("single-events", broker_url,
                        ojs_event_sinks=[{"amqp": True, "batch_size": 1}])
    amqp_channel.queue_declare("events-single-tap", exclusive=True)
    amqp_channel.queue_bind("events-single-tap", "ojs.exchange.events", "job.enqueued")
    try:
        job = producer.send_task("math.add", (1, 1), queue="unconsumed-single-events")
        message = get_message(amqp_channel, "events-single-tap", timeout=20)
    finally:
        producer.close()
    assert message.properties["content_type"] == "application/json"
    event = json.loads(message.body)
    assert (event["type"], event["subject"]) == ("job.enqueued", job.id)
    assert message.properties["message_id"] == event["id"]
    assert decode_events(message.body, "application/json") == [event]


def test_file_sink_writes_json_lines(app: Celery, worker: Any, events_file: Path) -> None:
    result = app.tasks["math.add"].apply_async((3, 3), queue="canvas")
    assert result.get(timeout=20) == 6

    def lines() -> list[dict[str, Any]]:
        if not events_file.exists():
            return []
        return [json.loads(line) for line in events_file.read_text().splitlines()]

    wait_until(lambda: any(e["type"] == "job.completed" and e["subject"] == result.id
                           for e in lines()), timeout=20, what="the file sink")
    assert any(e["type"] == "worker.started" for e in lines())


def test_worker_lifecycle_events(broker_url: str, tmp_path: Path) -> None:
    events_file = tmp_path / "worker-events.jsonl"
    worker = launch_worker(broker_url, "integration.cliapp", "lifecycle",
                           hostname="lifecycle@%h", concurrency=3,
                           env={"OJS_TEST_EVENTS_FILE": str(events_file)}, loglevel="WARNING")

    def types() -> list[str]:
        if not events_file.exists():
            return []
        return [json.loads(line)["type"] for line in events_file.read_text().splitlines()]

    try:
        wait_until(lambda: "worker.heartbeat" in types(), timeout=60, what="a heartbeat")
    finally:
        worker.stop()
    wait_until(lambda: "worker.stopped" in types(), timeout=10, what="worker.stopped")
    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    assert events[0]["type"] == "worker.started"
    started = events[0]["data"]
    assert started["queues"] == ["lifecycle"] and started["concurrency"] == 3
    assert started["worker_id"].startswith("lifecycle@")
    assert events[-1]["type"] == "worker.stopped" and events[-1]["data"]["reason"] == "shutdown"
    # stopped fetching, then stopped (a heartbeat may fall between them)
    assert [e["type"] for e in events if e["type"] != "worker.heartbeat"][-2:] == [
        "worker.quiet", "worker.stopped"]
    for event in events:
        check_event(event)
        Event.model_validate(event)


def test_progress_from_inside_a_task(app: Celery, worker: Any, collector: Collector) -> None:
    result = app.tasks["progress.report"].apply_async(queue="events")
    assert result.get(timeout=20) == "reported"
    wait_until(lambda: "job.completed" in collector.types_of(result.id), timeout=10,
               what="job.completed")
    events = collector.of(result.id)
    check(events)
    progress = [e.data for e in events if e.type == "job.progress"]
    assert [(p["progress_percent"], p.get("progress_message")) for p in progress] == [
        (50, "half way"), (100, None)]
    assert collector.types_of(result.id) == ["job.enqueued", "job.started", "job.progress",
                                             "job.progress", "job.completed"]


def test_beat_reports_triggered_and_skipped_entries(broker_url: str, tmp_path: Path,
                                                   amqp_channel: amqp.Channel) -> None:
    from celery.schedules import crontab

    from ojs_kombu.celery.beat import OJSScheduler

    from .apps import make_app

    beat_app = make_app("beat", broker_url, "cache+memory://", ojs_beat_skip_overlapping=True)
    assert beat_app.conf.beat_scheduler == "ojs_kombu.celery.beat:OJSScheduler"
    collected = Collector()
    ojs_kombu.subscribe(beat_app, collected, event_types=["cron.*"])
    scheduler = OJSScheduler(beat_app, schedule_filename=str(tmp_path / "beat"), lazy=True)
    scheduler.setup_schedule()
    scheduler.merge_inplace({"nightly-sum": {"task": "math.add", "args": (1, 2),
                                             "schedule": crontab(minute="*/5"),
                                             "options": {"queue": "beat-only"}}})
    entry = scheduler.schedule["nightly-sum"]
    scheduler.apply_entry(entry)  # nobody consumes beat-only: the job stays pending
    scheduler.apply_entry(entry)
    cron = collected.events
    check(cron)
    assert [e.type for e in cron] == ["cron.triggered", "cron.skipped"]
    assert {e.subject for e in cron} == {"nightly-sum"}
    triggered, skipped = cron[0].data, cron[1].data
    assert triggered["cron_expr"] == "*/5 * * * *" and triggered["job_type"] == "math.add"
    assert skipped["existing_job_id"] == triggered["job_id"]
    message = get_message(amqp_channel, "ojs.queue.beat-only")
    assert message.properties["message_id"] == triggered["job_id"]
    assert amqp_channel.basic_get("ojs.queue.beat-only") is None  # the second was not sent
