"""Event sinks without a broker: webhook (against a local HTTP server), file, buffering."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

import ojs_kombu
from ojs_kombu.celery.events import sink_from_spec
from ojs_kombu.events import Event, EventBus, EventFilter, make_event
from ojs_kombu.events.emitter import JobEvents, json_result
from ojs_kombu.events.hook import Hook
from ojs_kombu.events.job_info import JobInfo
from ojs_kombu.events.metric_observer import MetricsObserver
from ojs_kombu.events.sinks import AMQPSink, BackgroundSink, FileSink, WebhookSink
from ojs_kombu.events.wire import decode_events, split_batches
from ojs_kombu.spec.errors import InvalidEventMessage, OJSConfigurationError
from ojs_kombu.spec.naming import TopologyNames
from ojs_kombu.spec.trace_context import trace_id_of


def event(n: int = 1) -> Any:
    return make_event("job.enqueued", {"job_type": "email.send", "queue": "email"},
                      source="ojs://test/producers/1", subject=f"job-{n}")


class Endpoint:
    """A local webhook endpoint answering with the given status codes in turn."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = statuses
        self.requests: list[tuple[dict[str, str], bytes]] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                endpoint.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                status = endpoint.statuses.pop(0) if endpoint.statuses else 200
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    server = Endpoint([])
    yield server
    server.close()


def test_webhook_posts_signed_json(endpoint: Endpoint) -> None:
    sink = WebhookSink(endpoint.url, secret="s3cret")
    sink(event())
    assert sink.flush(10) and sink.delivered == 1
    headers, body = endpoint.requests[0]
    assert headers["content-type"] == "application/json"
    expected = hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert headers["x-ojs-signature"] == f"sha256={expected}"
    assert json.loads(body)["type"] == "job.enqueued"


def test_webhook_retries_5xx_with_backoff_but_not_4xx(endpoint: Endpoint) -> None:
    endpoint.statuses[:] = [503, 502, 200, 400]
    sink = WebhookSink(endpoint.url, backoff=0.01)
    sink(event(1))
    sink(event(2))
    assert sink.flush(10)
    assert len(endpoint.requests) == 4  # 3 tries for the first, 1 (a 400) for the second
    assert (sink.delivered, sink.failed) == (1, 1)


def test_webhook_timeout_and_unreachable_endpoint_are_counted_not_raised() -> None:
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        sink = WebhookSink(f"http://127.0.0.1:{port}/nothing", timeout=0.5, max_retries=1,
                           backoff=0.01)
        sink(event())  # the caller never waits for the network: nothing is counted yet
        assert sink.failed == 0
        assert sink.flush(10) and sink.failed == 1  # timed out, retried once, counted
    unreachable = WebhookSink("http://127.0.0.1:9/nothing", timeout=0.5, max_retries=1,
                              backoff=0.01)
    unreachable(event())
    assert unreachable.flush(10) and unreachable.failed == 1


def test_file_sink_appends_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "events.jsonl"
    sink = FileSink(path)
    for n in range(3):
        sink(event(n))
    assert sink.flush(5)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["subject"] for e in lines] == ["job-0", "job-1", "job-2"]


def test_a_full_buffer_drops_and_counts_instead_of_blocking() -> None:
    release, entered = threading.Event(), threading.Event()

    class Stuck(BackgroundSink):
        def deliver(self, event: Any) -> None:
            entered.set()
            release.wait(5)

    sink = Stuck(capacity=2)
    sink(event(0))
    assert entered.wait(5)  # the thread holds event 0: the buffer has room for 2 more
    for n in range(1, 10):
        sink(event(n))
    assert sink.dropped == 7
    release.set()
    assert sink.flush(5)


def test_no_subscriber_means_no_work() -> None:
    events = JobEvents(EventBus(), "ojs://t/p/1")
    assert not events.active and events.emit("job.enqueued", "x", job_type="a.b",
                                             queue="q") is None


def test_invalid_events_are_counted_not_raised() -> None:
    bus, seen = EventBus(), []
    bus.subscribe(seen.append)
    events = JobEvents(bus, "ojs://t/p/1")
    events.validate = True
    events.emit("job.started", "x", job_type="a.b", queue="q")  # no worker_id, no attempt
    assert events.invalid == 1 and seen == []
    events.job_started(JobInfo("x", "a.b", "q", 1), "w1")
    assert [e.type for e in seen] == ["job.started"]


def test_a_refused_cancel_is_in_every_later_event_of_the_job() -> None:
    """A threads-pool job whose CANCEL could not end it: its later events say so, and
    they still validate against the section 4 models."""
    bus, seen = EventBus(), []
    bus.subscribe(seen.append)
    events = JobEvents(bus, "ojs://t/p/1")
    events.validate = True
    job = JobInfo("x", "a.b", "q", 1)
    events.job_started(job, "w1")
    job.cancel = "requested: the threads pool cannot end a running job"
    events.job_completed(job, 0.5, None)
    events.job_failed(job, "HANDLER_ERROR", "boom", False, None)
    assert events.invalid == 0
    assert [(e.type, e.data.get("cancel")) for e in seen] == [
        ("job.started", None), ("job.completed", job.cancel), ("job.failed", job.cancel)]


def test_helpers() -> None:
    assert trace_id_of("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01") == (
        "4bf92f3577b34da6a3ce929d0e0e4736")
    assert trace_id_of("garbage") is None and trace_id_of(None) is None
    assert json_result({"a": 1}) == {"a": 1} and json_result(3) == {"value": 3}
    assert json_result(None) is None and json_result(object())["repr"].startswith("<object")


@pytest.mark.parametrize("spec, kind", [
    ("amqp", "AMQPSink"), ({"amqp": "my.events"}, "AMQPSink"), ("file:/tmp/x.jsonl", "FileSink"),
    ({"webhook": "https://example.invalid/h", "secret": "s"}, "WebhookSink"),
])
def test_sink_specs(spec: Any, kind: str) -> None:
    app = Celery("sinks", broker="ojs://", set_as_current=False)
    sink, flt = sink_from_spec(spec, app, TopologyNames(prefix="t"))
    assert type(sink).__name__ == kind and flt is None
    if spec == "amqp":
        assert sink.exchange == "t.ojs.exchange.events"


@pytest.mark.parametrize("spec", [42, {"nothing": 1}, "ftp:/x", {"webhook": "ftp://x"}])
def test_bad_sink_specs_are_refused(spec: Any) -> None:
    app = Celery("sinks", broker="ojs://", set_as_current=False)
    with pytest.raises((OJSConfigurationError, ValueError)):
        sink_from_spec(spec, app, TopologyNames())


def test_subscribe_filters_by_type_and_queue() -> None:
    app = Celery("sub", broker="ojs://", set_as_current=False)
    ojs_kombu.install(app)
    seen: list[Any] = []
    ojs_kombu.subscribe(app, seen.append, event_types=["job.*"], queues=["email"])
    hook = app.amqp.binding.hook
    hook.job_enqueued(JobInfo("j1", "email.send", "email"), None, 0.0)
    hook.job_enqueued(JobInfo("j2", "email.send", "other"), None, 0.0)
    hook.worker_quiet("w", {"active_jobs": 0})
    hook.backpressure_warning("email", {"depth": 9, "bound": 10})  # not asked for
    assert [e.subject for e in seen] == ["j1"]


def test_metrics_follow_events_with_bounded_labels() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from ojs_kombu.events.metrics import OJSMetrics

    reader = InMemoryMetricReader()
    metrics = OJSMetrics(MeterProvider(metric_readers=[reader]))
    hook = Hook(JobEvents(EventBus(), "ojs://t/p/1"), MetricsObserver(metrics))
    job = JobInfo("019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f", "email.send", "email", 1)
    hook.job_enqueued(job, None, 0.0)  # recorded even without subscribers
    hook.job_completed(job, 0.042, None)
    hook.job_discarded(job, "HANDLER_ERROR", "boom")
    found = {m.name: m.data.data_points for r in reader.get_metrics_data().resource_metrics
             for s in r.scope_metrics for m in s.metrics}
    labels = {"job_type": "email.send", "queue": "email"}
    for name in ("ojs.jobs.enqueued", "ojs.jobs.completed", "ojs.jobs.failed"):
        assert [(dict(p.attributes), p.value) for p in found[name]] == [(labels, 1)]
    assert found["ojs.jobs.duration_ms"][0].sum == pytest.approx(42)


def test_counters_are_cumulative_monotonic_sums_across_collections_and_threads() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from ojs_kombu.events.metrics import OJSMetrics

    reader = InMemoryMetricReader()
    metrics = OJSMetrics(MeterProvider(metric_readers=[reader]))

    def completed() -> dict[tuple[tuple[str, Any], ...], float]:
        points = [p for r in reader.get_metrics_data().resource_metrics for s in r.scope_metrics
                  for m in s.metrics if m.name == "ojs.jobs.completed"
                  for p in m.data.data_points]
        for metric in (m for r in reader.get_metrics_data().resource_metrics
                       for s in r.scope_metrics for m in s.metrics):
            if metric.name == "ojs.jobs.completed":
                assert metric.data.is_monotonic
        return {tuple(sorted(p.attributes.items())): p.value for p in points}

    def add_many(queue: str) -> None:
        for _ in range(1000):
            metrics.jobs_completed.add(1, {"job_type": "a.b", "queue": queue})

    threads = [threading.Thread(target=add_many, args=(q,)) for q in ("x", "x", "y")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert completed() == {(("job_type", "a.b"), ("queue", "x")): 2000,
                           (("job_type", "a.b"), ("queue", "y")): 1000}
    add_many("y")
    assert completed()[(("job_type", "a.b"), ("queue", "y"))] == 2000


def test_histograms_report_every_value_from_every_thread_at_each_collection() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from ojs_kombu.events.metrics import OJSMetrics

    reader = InMemoryMetricReader()
    metrics = OJSMetrics(MeterProvider(metric_readers=[reader]))
    labels = {"job_type": "a.b", "queue": "x"}

    def durations() -> tuple[int, float]:
        points = [p for r in reader.get_metrics_data().resource_metrics
                  for s in r.scope_metrics for m in s.metrics
                  if m.name == "ojs.jobs.duration_ms" for p in m.data.data_points]
        return sum(p.count for p in points), sum(p.sum for p in points)

    def record_many() -> None:
        for _ in range(1000):  # several flushes of the buffer, and a remainder
            metrics.duration.record(2.0, labels)

    metrics.duration.record(5.0, labels)
    assert durations() == (1, 5.0)  # one value, far below a flush: collected anyway
    threads = [threading.Thread(target=record_many) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(metrics.duration) < metrics.duration.flush_at  # the buffer stays bounded
    assert durations() == (4001, 8005.0)
    assert len(metrics.duration) == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_does_not_report_what_its_parent_recorded() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from ojs_kombu.events.metrics import OJSMetrics

    reader = InMemoryMetricReader()
    metrics = OJSMetrics(MeterProvider(metric_readers=[reader]))
    metrics.wait.record(10.0, {"queue": "x"})  # buffered in the parent
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: what it buffered is its own values only
        try:
            metrics.wait.record(1.0, {"queue": "x"})
            os.write(write, str(len(metrics.wait)).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as pipe:
        assert pipe.read() == "1"
    assert len(metrics.wait) == 1  # the parent's value is still the parent's to report


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_delivers_its_own_events_on_a_thread_of_its_own() -> None:
    """A prefork child inherits the sink without its thread: its first event starts
    one, and the events its parent had buffered are the parent's alone."""
    delivered: list[str] = []
    gate = threading.Event()

    class Recording(BackgroundSink):
        def deliver(self, event: Any) -> None:
            gate.wait(10)
            delivered.append(event.id)

    sink = Recording()
    data = {"job_type": "t", "queue": "q", "worker_id": "w", "attempt": 1}
    parent_event = make_event("job.started", data, source="ojs://test", subject="parent")
    sink(parent_event)  # taken by the parent's thread, which waits at the gate
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            gate.set()
            child_event = make_event("job.started", data, source="ojs://test",
                                     subject="child")
            sink(child_event)
            ok = sink.flush(5)
            os.write(write, json.dumps([ok, delivered, child_event.id]).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as pipe:
        ok, child_delivered, child_id = json.loads(pipe.read())
    assert ok and child_delivered == [child_id]
    gate.set()
    assert sink.flush(5) and delivered == [parent_event.id]
    sink.close()


def test_queue_gauges_report_per_queue_and_survive_a_failing_reader() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from ojs_kombu.events.metrics import OJSMetrics

    reader = InMemoryMetricReader()
    metrics = OJSMetrics(MeterProvider(metric_readers=[reader]))

    def broken() -> list[tuple[str, float]]:
        raise ConnectionError("broker down")

    metrics.observe_queues(depth=lambda: [("email", 7.0), ("default", 0.0)],
                           active=lambda: [("email", 2.0)], dead_letters=broken)
    found = {m.name: m.data.data_points for r in reader.get_metrics_data().resource_metrics
             for s in r.scope_metrics for m in s.metrics}
    assert {p.attributes["queue"]: p.value for p in found["ojs.queue.depth"]} == {
        "email": 7.0, "default": 0.0}
    assert [p.value for p in found["ojs.queue.active"]] == [2.0]
    assert not found.get("ojs.dead_letter.depth")


def test_cancel_and_heartbeat_hooks_build_valid_events() -> None:
    from datetime import UTC, datetime

    from .ojs_schemas import event_check

    bus, seen = EventBus(), []
    bus.subscribe(seen.append)
    events = JobEvents(bus, "ojs://t/workers/w1")
    job = JobInfo("019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f", "email.send", "email", 2)
    events.job_cancelled(job, "user:ops", "superseded")
    events.job_heartbeat(job, "w1", datetime.now(UTC))
    events.job_progress(job, "w1", 40, "copying")
    assert [e.type for e in seen] == ["job.cancelled", "job.heartbeat", "job.progress"]
    validator = event_check()  # event.schema.json, or the Event model without it
    for event in seen:
        validator.validate(event.to_dict())
        Event.model_validate(event.to_dict())  # the data model, too (built unvalidated)


# -- AMQP sink: batches and their wire format (a recording channel stands in for the broker) --


class RecordingChannel:
    """What the AMQP sink needs of an ojs:// channel; records every confirmed publish."""

    def __init__(self) -> None:
        self.published: list[tuple[Any, str, str]] = []
        self.declared: list[str] = []
        self.lock = threading.Lock()

    def exchange_declare(self, exchange: str, *args: Any, **kwargs: Any) -> None:
        self.declared.append(exchange)

    def publish_many_confirmed(self, messages: list[tuple[Any, str, str]]) -> list[bool]:
        with self.lock:
            self.published += messages
        return [True] * len(messages)

    def events(self) -> list[dict[str, Any]]:
        with self.lock:
            return [e for m, _, _ in self.published
                    for e in decode_events(m.body, m.properties["content_type"])]


class RecordingConnection:
    def __init__(self, channel: RecordingChannel) -> None:
        self.connection = self
        self._channel = channel

    def ensure_connection(self, max_retries: int = 1) -> None:
        pass

    def channel(self) -> RecordingChannel:
        return self._channel

    def release(self) -> None:
        pass


def recording_sink(**options: Any) -> tuple[AMQPSink, RecordingChannel]:
    channel = RecordingChannel()
    return AMQPSink(lambda: RecordingConnection(channel), "t.ojs.exchange.events",
                    **options), channel


def job_event(kind: str, job: str, **data: Any) -> Event:
    return make_event(kind, {"job_type": "a.b", "queue": "q", **data},
                      source="ojs://test/workers/1", subject=job)


def retried_job(job: str) -> list[Event]:
    failed = {"attempt": 1, "error": {"code": "E", "message": "m", "retryable": True}}
    retrying = {"attempt": 1, "max_attempts": 2, "next_retry_at": "2030-01-01T00:00:00Z",
                "error": {"code": "E", "message": "m"}}
    return [job_event("job.started", job, worker_id="w", attempt=1),
            job_event("job.failed", job, **failed),
            job_event("job.retrying", job, **retrying),
            job_event("job.started", job, worker_id="w", attempt=2),
            job_event("job.completed", job, duration_ms=1, attempt=2)]


def test_batches_group_by_type_and_keep_each_jobs_lifecycle_order() -> None:
    busy = []
    for n in range(50):  # a worker running several jobs at once: started/completed interleave
        busy += [job_event("job.started", f"j{n}", worker_id="w", attempt=1),
                 job_event("job.completed", f"j{n - 1}", duration_ms=1, attempt=1)]
    assert [(kind, len(group)) for kind, group in split_batches(busy)] == [
        ("job.started", 50), ("job.completed", 50)]
    events = [*retried_job("r"), job_event("job.started", "other", worker_id="w", attempt=1)]
    batches = split_batches(events)
    assert all({e.type for e in group} == {kind} for kind, group in batches)
    flat = [e for _, group in batches for e in group]
    assert [e.type for e in flat if e.subject == "r"] == [e.type for e in retried_job("r")]
    assert len(flat) == len(events)


def test_amqp_sink_publishes_cloudevents_batches_by_type() -> None:
    sink, channel = recording_sink(batch_size=100, batch_ms=5)
    events = [e for n in range(60) for e in retried_job(f"job-{n}")]
    for e in events:
        sink(e)
    assert sink.flush(10)
    assert channel.declared == ["t.ojs.exchange.events"]
    for message, exchange, routing_key in channel.published:
        batch = decode_events(message.body, message.properties["content_type"])
        assert message.properties["content_type"] == "application/cloudevents-batch+json"
        assert exchange == "t.ojs.exchange.events" and message.properties["delivery_mode"] == 2
        assert {e["type"] for e in batch} == {routing_key} == {message.properties["type"]}
        assert message.properties["application_headers"]["x-ojs-event-count"] == len(batch)
        assert 1 <= len(batch) <= 100
    received = channel.events()
    assert sorted(e["id"] for e in received) == sorted(e.id for e in events)
    assert len(channel.published) < len(events) / 4  # batched, not one message per event
    for n in range(60):  # every job's events read back in lifecycle order
        assert ([e["type"] for e in received if e["subject"] == f"job-{n}"]
                == [e.type for e in retried_job("x")])
    assert (sink.delivered, sink.failed, sink.dropped) == (len(events), 0, 0)
    for e in received:
        Event.model_validate(e)
    sink.close()


def test_amqp_sink_with_batch_size_1_publishes_one_json_event_per_message() -> None:
    sink, channel = recording_sink(batch_size=1)
    events = retried_job("j")
    for e in events:
        sink(e)
    assert sink.flush(10)
    assert [m.body for m, _, _ in channel.published] == [e.to_json() for e in events]
    assert [(m.properties["content_type"], m.properties["message_id"], key)
            for m, _, key in channel.published] == [
        ("application/json", e.id, e.type) for e in events]
    assert sink.delivered == len(events)
    sink.close()


def test_a_full_batch_goes_out_at_once_and_flush_or_close_sends_the_rest() -> None:
    sink, channel = recording_sink(batch_size=10, batch_ms=60_000)
    for n in range(25):
        sink(event(n))
    wait_for(lambda: len(channel.events()) == 20)  # two full batches, no waiting for 60 s
    assert len(channel.events()) == 20 and sink.pending == 5
    assert sink.flush(10)  # flush does not wait out batch_ms either
    assert [e["subject"] for e in channel.events()] == [f"job-{n}" for n in range(25)]
    sink(event(99))
    sink.close(10)
    assert channel.events()[-1]["subject"] == "job-99" and sink.delivered == 26


def test_flush_with_more_than_a_batch_buffered_does_not_wait_out_the_linger() -> None:
    """A flush asked for while full batches are still queued ends the linger of the
    partial batch behind them (it used to wait the whole linger, here 60 s)."""

    class Gated(BackgroundSink):
        batch_size, linger = 10, 60.0

        def __init__(self) -> None:
            super().__init__()
            self.gate, self.got = threading.Event(), []

        def deliver_batch(self, events: list[Any]) -> None:
            self.gate.wait(10)
            self.got += events

    sink = Gated()
    for n in range(25):
        sink(event(n))
    time.sleep(0.05)  # the thread holds the first batch at the gate
    sink.gate.set()
    assert sink.flush(10)
    assert len(sink.got) == 25
    sink.close()


def test_a_partial_batch_goes_out_after_batch_ms() -> None:
    sink, channel = recording_sink(batch_size=100, batch_ms=20)
    sink(event(1))
    wait_for(lambda: len(channel.published) == 1)  # without flush or close
    assert channel.events()[0]["subject"] == "job-1"
    sink.close()


def wait_for(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


@pytest.mark.parametrize("spec, batched", [
    ("amqp", True), ({"amqp": True, "batch_size": 1}, False),
    ({"amqp": True, "batch_size": 500, "batch_ms": 10}, True),
])
def test_amqp_batch_options_in_config(spec: Any, batched: bool) -> None:
    app = Celery("sinks", broker="ojs://", set_as_current=False)
    sink, _ = sink_from_spec(spec, app, TopologyNames())
    assert isinstance(sink, AMQPSink) and sink.batched is batched
    if isinstance(spec, dict) and spec.get("batch_size") == 500:
        assert (sink.batch_size, sink.linger) == (500, 0.01)


@pytest.mark.parametrize("options", [{"batch_size": 0}, {"batch_size": "10"},
                                     {"batch_ms": -1}, {"batch_ms": True}])
def test_bad_amqp_batch_options_are_refused(options: dict[str, Any]) -> None:
    app = Celery("sinks", broker="ojs://", set_as_current=False)
    with pytest.raises(OJSConfigurationError, match="batch_"):
        sink_from_spec({"amqp": True, **options}, app, TopologyNames())


def test_decode_events_reads_both_formats() -> None:
    one = event(1).to_dict()
    assert decode_events(json.dumps(one), "application/json") == [one]
    assert decode_events(json.dumps([one, one]).encode(),
                         "application/cloudevents-batch+json") == [one, one]
    assert decode_events(json.dumps(one)) == [one]  # no content type: by shape
    assert decode_events(json.dumps([one])) == [one]


@pytest.mark.parametrize("body, content_type, error", [
    (b"{not json", None, "not JSON"),
    (b'{"a": 1}', "application/cloudevents-batch+json", "must be a JSON array"),
    (b"[1, 2]", "application/cloudevents-batch+json", "event 0 of the batch is a int"),
    (b"[]", "application/json", "must be a JSON object"),
    (b"{}", "text/plain", "content_type 'text/plain'"),
    (b'"text"', None, "must be a JSON object"),
])
def test_decode_events_refuses_what_is_not_events(body: bytes, content_type: str | None,
                                                  error: str) -> None:
    with pytest.raises(InvalidEventMessage, match=error):
        decode_events(body, content_type)


def test_trusted_events_are_what_model_construct_builds() -> None:
    from ojs_kombu.events.models import trusted_event

    data = {"job_type": "a.b", "queue": "q", "worker_id": "w", "attempt": 1}
    for subject in ("job-1", None):
        fast = trusted_event("job.started", data, source="ojs://t/workers/w", subject=subject)
        fields = {"id": fast.id, "type": "job.started", "source": "ojs://t/workers/w",
                  "time": fast.time, "data": dict(data)}
        if subject is not None:
            fields["subject"] = subject
        slow = Event.model_construct(**fields)
        assert fast == slow and fast.to_dict() == slow.to_dict()
        assert fast.model_dump() == slow.model_dump()
        assert fast.model_fields_set == slow.model_fields_set
        assert fast.model_extra == slow.model_extra and fast.__dict__ == slow.__dict__
        Event.model_validate(fast.to_dict())


def test_event_bodies_are_compact_utf8_json_even_for_values_orjson_refuses() -> None:
    from ojs_kombu.events.wire import compact_json

    value = {"queue": "émail", "result": {"value": 2**70, "ratio": 0.1, "1": [True, None]},
             "count": 3}
    body = compact_json(value)
    assert json.loads(body) == value
    assert b" " not in body and "émail".encode() in body
    plain = {"job_type": "email.send", "data": {"attempt": 1, 2: "int keys become strings"}}
    assert json.loads(compact_json(plain)) == json.loads(json.dumps(plain))


def test_a_job_events_draft_is_the_event_in_process_subscribers_get() -> None:
    from ojs_kombu.events.models import EventDraft

    data = {"job_type": "a.b", "queue": "q", "worker_id": "w", "attempt": 1}
    draft = EventDraft("job.started", dict(data), source="ojs://t/workers/w", subject="job-1")
    event = draft.event()
    assert draft.event() is event  # built once
    assert (event.id, event.type, event.subject, event.data) == (
        draft.id, "job.started", "job-1", data)
    assert event.time.microsecond % 1000 == 0 and event.time.tzinfo is not None
    assert draft.to_dict() == event.to_dict()
    assert json.loads(draft.to_json()) == event.to_dict()
    assert Event.model_validate(draft.to_dict()) == event  # valid per the data models
    for milliseconds in (0, 999, 1_763_752_800_000, 1_763_752_800_001, 1_763_752_859_999,
                         1_763_752_860_042, 1_763_752_800_999):
        other = EventDraft("job.started", dict(data), source="ojs://t/workers/w")
        other.milliseconds = milliseconds
        assert other.to_dict() == other.event().to_dict()


def test_background_sinks_take_drafts_and_other_subscribers_get_events() -> None:
    from ojs_kombu.events.models import EventDraft

    bus = EventBus()
    seen: list[Any] = []
    sink, channel = recording_sink(batch_ms=0)
    bus.subscribe(seen.append)
    bus.subscribe(sink)
    bus.subscribe(seen.append, EventFilter(queues=["other"]))  # filters apply to drafts too
    events = JobEvents(bus, "ojs://t/workers/w")
    job = JobInfo("019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f", "email.send", "email", 2,
                  trace_id="4bf92f3577b34da6a3ce929d0e0e4736")
    events.job_started(job, "worker-1")
    events.job_completed(job, 0.25, {"sent": True})
    assert [type(e) for e in seen] == [Event, Event]  # synchronous, built from the draft
    assert sink.flush(5)
    delivered = channel.events()
    assert [e["id"] for e in delivered] == [e.id for e in seen]
    assert delivered == [e.to_dict() for e in seen]
    assert delivered[1]["data"] == {"job_type": "email.send", "queue": "email",
                                    "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
                                    "duration_ms": 250, "attempt": 2,
                                    "result": {"sent": True}}
    for event in delivered:
        Event.model_validate(event)
    assert not any(isinstance(e, EventDraft) for e in seen)
    sink.close()


def test_a_sink_subclass_of_its_own_gets_events_not_drafts() -> None:
    got: list[Any] = []

    class Collecting(BackgroundSink):
        def deliver(self, event: Any) -> None:
            got.append(event)

    bus = EventBus()
    sink = Collecting()
    bus.subscribe(sink)
    JobEvents(bus, "ojs://t/workers/w").job_started(
        JobInfo("019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f", "email.send", "email", 1), "w1")
    assert sink.flush(5)
    assert [type(e) for e in got] == [Event] and got[0].type == "job.started"
    sink.close()


def test_without_an_sdk_histograms_buffer_nothing() -> None:
    """The API's no-op provider (and its global proxy before an SDK is set) drops every
    value: ojs_kombu keeps none of them around either."""
    from opentelemetry.metrics import NoOpMeterProvider

    from ojs_kombu.events.metrics import OJSMetrics

    metrics = OJSMetrics(NoOpMeterProvider())
    metrics.duration.record(3.0, {"queue": "x"})
    assert len(metrics.duration) == 0
