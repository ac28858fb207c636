"""Every way of publishing a job puts the same job on the broker: ``apply_async``,
a signature's ``apply_async`` and ``enqueue_many``, traced or not."""

from __future__ import annotations

from typing import Any

import amqp
import pytest
from celery import Celery

import ojs_kombu
from ojs_kombu.spec.job_ids import new_job_id

from .conftest import body_of, get_message, wait_until

QUEUE = "one-path"
#: Attributes that differ between any two publishes (ids, clocks).
PER_PUBLISH = {"id", "created_at", "enqueued_at"}


def _published(channel: amqp.Channel) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    message = get_message(channel, f"ojs.queue.{QUEUE}")
    body = body_of(message)
    properties = dict(message.properties)
    headers = dict(properties.pop("application_headers"))
    assert properties["message_id"] == body["id"]
    for key in ("message_id", "correlation_id", "timestamp"):
        properties.pop(key)
    for key in ("x-ojs-created-at", "x-ojs-enqueued-at"):
        assert headers.pop(key) == body["created_at"]
    if "expires_at" in body:  # now + expires: only that it is there can match
        body["expires_at"] = True
    return {k: v for k, v in body.items() if k not in PER_PUBLISH}, properties, headers


@pytest.mark.parametrize("args, kwargs, options", [
    ((1, 2), None, {}),
    ((1,), {"y": 2}, {"priority": 7}),
    ((3, 4), None, {"time_limit": 30, "soft_time_limit": 20, "expires": 600}),
    ((5, 6), None, {"ojs_meta": {"tenant": "acme", "tags": ["a", "b"]},
                    "ojs_retry": {"max_attempts": 5}}),
    ((7, 8), None, {"ignore_result": True}),
], ids=["plain", "kwargs-priority", "limits-expires", "meta-retry", "ignore-result"])
def test_every_way_of_publishing_puts_the_same_job_on_the_broker(
        app: Celery, amqp_channel: amqp.Channel, args: Any, kwargs: Any,
        options: dict[str, Any]) -> None:
    add = app.tasks["math.add"]
    options = {"queue": QUEUE, **options}
    single = add.apply_async(args, kwargs, **options)
    seen_single = _published(amqp_channel)
    signature = add.signature(args, kwargs, **options).apply_async()
    seen_signature = _published(amqp_channel)
    [batched] = ojs_kombu.enqueue_many(app, [add.signature(args, kwargs, **options)])
    seen_batched = _published(amqp_channel)
    assert seen_single == seen_signature == seen_batched
    assert seen_single[0]["queue"] == QUEUE
    assert len({single.id, signature.id, batched.id}) == 3
    assert single.ignored == signature.ignored == ("ignore_result" in options)
    assert ("expires_at" in seen_single[0]) == ("expires" in options)


def test_a_traced_publish_puts_the_same_job_on_the_broker_with_its_trace(
        app: Celery, amqp_channel: amqp.Channel) -> None:
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind

    add = app.tasks["math.add"]
    add.apply_async((1, 2), queue=QUEUE)
    untraced = _published(amqp_channel)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = CeleryInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        add.apply_async((1, 2), queue=QUEUE)
    finally:
        instrumentor.uninstrument()
    body, properties, headers = _published(amqp_channel)
    [span] = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.PRODUCER]
    meta = body.pop("meta")
    assert meta["trace_id"] == format(span.context.trace_id, "032x")
    assert headers.pop("x-ojs-trace-id") == meta["traceparent"]
    body["x_celery"].pop("traceparent", None)
    assert (body, properties, headers) == untraced


def test_a_job_with_a_caller_id_runs_on_a_real_worker(app: Celery, worker: Any) -> None:
    job_id = new_job_id()
    add = app.tasks["math.add"]
    result = add.apply_async((20, 22), task_id=job_id)
    assert result.id == job_id
    assert wait_until(lambda: result.ready(), what="the job's result") and \
        result.get(timeout=5) == 42


def test_a_scheduled_job_waits_in_the_broker_then_runs(app: Celery, worker: Any) -> None:
    result = app.tasks["math.add"].apply_async((1, 1), countdown=1)
    assert result.get(timeout=30) == 2
