"""Metrics (OpenTelemetry) and W3C trace propagation through a real worker."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import amqp
import pytest
from celery import Celery
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import ojs_kombu
from ojs_kombu.events.metric_observer import MetricsObserver
from ojs_kombu.events.metrics import OJSMetrics
from ojs_kombu.spec.job_ids import new_job_id

from .conftest import get_message, publish_raw, wait_until


@pytest.fixture
def metric_reader(app: Celery) -> Iterator[InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    observer = ojs_kombu.add_observer(
        app, MetricsObserver(OJSMetrics(MeterProvider(metric_readers=[reader]))))
    yield reader
    ojs_kombu.remove_observer(app, observer)


def points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


def test_job_metrics_have_job_type_and_queue_labels_only(
        app: Celery, worker: Any, metric_reader: InMemoryMetricReader) -> None:
    add = app.tasks["math.add"]
    assert add.apply_async((1, 1), queue="canvas").get(timeout=20) == 2
    wait_until(lambda: {"ojs.jobs.completed", "ojs_amqp_messages_acked_total"}
               <= set(points(metric_reader)), timeout=10, what="the completion and its ack")
    found = points(metric_reader)
    labels = {"job_type": "math.add", "queue": "canvas"}
    for name in ("ojs.jobs.enqueued", "ojs.jobs.completed"):
        assert [(dict(p.attributes), p.value) for p in found[name]] == [(labels, 1)], name
    duration = found["ojs.jobs.duration_ms"][0]
    assert dict(duration.attributes) == labels and duration.count == 1
    assert list(duration.explicit_bounds) == [5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000,
                                              10000, 30000, 60000, 300000]
    assert found["ojs.jobs.wait_ms"][0].count == 1
    for name in ("ojs_amqp_messages_published_total", "ojs_amqp_messages_consumed_total",
                 "ojs_amqp_messages_acked_total"):
        assert [(dict(p.attributes), p.value) for p in found[name]] == [({"queue": "canvas"}, 1)]
    assert found["ojs_amqp_publish_confirm_latency_seconds"][0].count >= 1
    for points_ in found.values():
        for point in points_:
            assert set(point.attributes) <= {"job_type", "queue"}  # never a job id


def test_discarded_jobs_count_as_failed(app: Celery, worker: Any,
                                        metric_reader: InMemoryMetricReader) -> None:
    app.tasks["reject.value"].apply_async(queue="events")
    # discarded with Basic.Nack (AMQP-009): counted as nacked, not acked
    wait_until(lambda: {"ojs.jobs.failed", "ojs_amqp_messages_nacked_total"}
               <= set(points(metric_reader)), timeout=20, what="the discard and its nack")
    failed = points(metric_reader)["ojs.jobs.failed"]
    assert [(dict(p.attributes), p.value) for p in failed] == [
        ({"job_type": "reject.value", "queue": "events"}, 1)]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    CeleryInstrumentor().instrument(tracer_provider=provider)
    yield exporter
    CeleryInstrumentor().uninstrument()


def test_one_trace_from_producer_to_consumer(app: Celery, worker: Any,
                                             spans: InMemorySpanExporter,
                                             amqp_channel: amqp.Channel) -> None:
    result = app.tasks["math.add"].apply_async((5, 5), queue="canvas")
    assert result.get(timeout=20) == 10
    wait_until(lambda: any(s.kind == SpanKind.CONSUMER for s in spans.get_finished_spans()),
               timeout=10, what="the consumer span")
    finished = spans.get_finished_spans()
    producer = next(s for s in finished if s.kind == SpanKind.PRODUCER)
    consumer = next(s for s in finished if s.kind == SpanKind.CONSUMER)
    assert consumer.context.trace_id == producer.context.trace_id
    assert consumer.parent is not None and consumer.parent.span_id == producer.context.span_id

    # On the wire: x-ojs-trace-id and meta carry the producer's context.
    other = app.tasks["math.add"].apply_async((1, 2), queue="trace-raw")
    message = get_message(amqp_channel, "ojs.queue.trace-raw")
    traceparent = message.properties["application_headers"]["x-ojs-trace-id"]
    body = json.loads(message.body)
    assert body["meta"]["traceparent"] == traceparent
    assert body["meta"]["trace_id"] == traceparent.split("-")[1]
    producer = next(s for s in spans.get_finished_spans()
                    if s.kind == SpanKind.PRODUCER and other.id in s.name + str(s.attributes))
    assert traceparent.split("-")[1] == f"{producer.context.trace_id:032x}"


def test_a_foreign_producers_trace_is_continued(app: Celery, worker: Any,
                                                spans: InMemorySpanExporter,
                                                amqp_channel: amqp.Channel) -> None:
    job_id, trace_id = new_job_id(), "0af7651916cd43dd8448eb211c80319c"
    traceparent = f"00-{trace_id}-b7ad6b7169203331-01"
    publish_raw(amqp_channel,
                amqp.Message(json.dumps({"specversion": "1.0", "id": job_id, "type": "math.add",
                                         "queue": "canvas", "args": [2, 3]}),
                             content_type="application/openjobspec+json", message_id=job_id,
                             application_headers={"x-ojs-traceparent": traceparent,
                                                  "x-ojs-attempt": 1}),
                "canvas")
    app.calls.wait_for(job_id)
    wait_until(lambda: any(s.kind == SpanKind.CONSUMER for s in spans.get_finished_spans()),
               timeout=10, what="the consumer span")
    consumer = next(s for s in spans.get_finished_spans() if s.kind == SpanKind.CONSUMER)
    assert f"{consumer.context.trace_id:032x}" == trace_id
    assert consumer.parent is not None and f"{consumer.parent.span_id:016x}" == "b7ad6b7169203331"


def test_queue_depths_are_read_from_the_broker(app: Celery, amqp_channel: amqp.Channel) -> None:
    from ojs_kombu.celery.events import QueueDepths

    add = app.tasks["math.add"]
    for _ in range(3):
        add.apply_async((1, 1), queue="gauge-depth")
    names = app.amqp.binding.names
    reader = QueueDepths(app)
    assert reader.depths(["gauge-depth"], names.job_queue) == [("gauge-depth", 3.0)]
    assert reader.depths(["gauge-depth"], names.dead_letter_queue) == [("gauge-depth", 0.0)]
    with pytest.raises(amqp.exceptions.NotFound):  # fails the reading, not the process
        reader.depths(["no-such-queue"], names.job_queue)
    assert reader.depths(["gauge-depth"], names.job_queue) == [("gauge-depth", 3.0)]
