"""Event sinks without a broker: webhook (against a local HTTP server), file, buffering."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

import ojs_kombu
from ojs_kombu.celery_events import sink_from_spec
from ojs_kombu.errors import OJSConfigurationError
from ojs_kombu.events import Event, EventBus, make_event
from ojs_kombu.events.emitter import JobEvents, JobInfo, json_result, trace_id_of
from ojs_kombu.events.sinks import BackgroundSink, FileSink, WebhookSink
from ojs_kombu.naming import TopologyNames


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
    sink = WebhookSink("http://127.0.0.1:9/nothing", timeout=0.5, max_retries=1, backoff=0.01)
    started = time.monotonic()
    sink(event())  # the caller never waits for the network
    assert time.monotonic() - started < 0.1
    assert sink.flush(10) and sink.failed == 1


def test_file_sink_appends_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "events.jsonl"
    sink = FileSink(path)
    for n in range(3):
        sink(event(n))
    assert sink.flush(5)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["subject"] for e in lines] == ["job-0", "job-1", "job-2"]


def test_a_full_buffer_drops_and_counts_instead_of_blocking() -> None:
    release = threading.Event()

    class Stuck(BackgroundSink):
        def deliver(self, event: Any) -> None:
            release.wait(5)

    sink = Stuck(capacity=2)
    started = time.monotonic()
    for n in range(10):
        sink(event(n))
    assert time.monotonic() - started < 0.5
    assert sink.dropped >= 7
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
    events.started(JobInfo("x", "a.b", "q", 1), "w1")
    assert [e.type for e in seen] == ["job.started"]


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
    events = app.amqp.binding.events
    events.enqueued("j1", "email.send", "email")
    events.enqueued("j2", "email.send", "other")
    events.emit("worker.quiet", "w", worker_id="w", active_jobs=0)
    assert [e.subject for e in seen] == ["j1"]


def test_metrics_follow_events_with_bounded_labels() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from ojs_kombu.metrics import OJSMetrics

    reader = InMemoryMetricReader()
    metrics = OJSMetrics(MeterProvider(metric_readers=[reader]))
    events = JobEvents(EventBus(), "ojs://t/p/1", metrics)
    job = JobInfo("019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f", "email.send", "email", 1)
    events.enqueued(job.job_id, "email.send", "email")  # recorded even without subscribers
    events.completed(job, 0.042, None)
    events.discarded(job, "HANDLER_ERROR", "boom")
    found = {m.name: m.data.data_points for r in reader.get_metrics_data().resource_metrics
             for s in r.scope_metrics for m in s.metrics}
    labels = {"job_type": "email.send", "queue": "email"}
    for name in ("ojs.jobs.enqueued", "ojs.jobs.completed", "ojs.jobs.failed"):
        assert [(dict(p.attributes), p.value) for p in found[name]] == [(labels, 1)]
    assert found["ojs.jobs.duration_ms"][0].sum == pytest.approx(42)


def test_queue_gauges_report_per_queue_and_survive_a_failing_reader() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from ojs_kombu.metrics import OJSMetrics

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

    from .conftest import schema_validator

    bus, seen = EventBus(), []
    bus.subscribe(seen.append)
    events = JobEvents(bus, "ojs://t/workers/w1")
    job = JobInfo("019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f", "email.send", "email", 2)
    events.cancelled(job, cancelled_by="user:ops", reason="superseded")
    events.heartbeat(job, "w1", datetime.now(UTC))
    events.progress(job, "w1", 40, "copying")
    assert [e.type for e in seen] == ["job.cancelled", "job.heartbeat", "job.progress"]
    validator = schema_validator("event")
    for event in seen:
        validator.validate(event.to_dict())
        Event.model_validate(event.to_dict())  # the data model, too (built unvalidated)
