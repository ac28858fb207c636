"""Every way of sending a task is Celery's send path ending in one OJS job (no broker).

The app's broker is the in-memory one (``tests/in_memory_broker.py``): what
reaches it is the job the ``ojs`` transport would put on the wire.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from celery import Celery, chain
from celery.signals import after_task_publish, before_task_publish
from kombu.exceptions import EncodeError

import ojs_kombu
from ojs_kombu.spec.errors import JobOptionError, NonJSONArgumentError

from .in_memory_broker import Broker, InMemoryTransport

#: Attributes that differ between any two publishes (ids, clocks).
PER_PUBLISH = {"id", "created_at", "enqueued_at"}


@pytest.fixture
def broker() -> Broker:
    broker = Broker()
    broker.declare("ojs.queue.default")
    return broker


@pytest.fixture
def app(broker: Broker) -> Celery:
    app = Celery("sender", broker="ojs://guest:guest@in-memory//", set_as_current=False)
    ojs_kombu.install(app)
    app.conf.broker_transport = type("Transport", (InMemoryTransport,), {"broker": broker})

    @app.task(name="math.add", shared=False)
    def add(x: Any, y: int = 0) -> Any:
        return x

    return app


@pytest.fixture
def signals() -> Iterator[list[str]]:
    """The publish signals Celery sent, in order, with the task id."""
    seen: list[str] = []

    def before(headers: dict[str, Any], **_: Any) -> None:
        seen.append(f"before {headers['id']}")

    def after(headers: dict[str, Any], **_: Any) -> None:
        seen.append(f"after {headers['id']}")

    before_task_publish.connect(before, weak=False)
    after_task_publish.connect(after, weak=False)
    yield seen
    before_task_publish.disconnect(before)
    after_task_publish.disconnect(after)


def jobs(broker: Broker) -> list[dict[str, Any]]:
    return [json.loads(stored.body) for stored in broker.published]


def same_job(job: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in job.items() if k not in PER_PUBLISH}


@pytest.fixture(scope="module")
def plain_send_task_headers() -> dict[str, Any]:
    """The headers of the message a plain Celery app of the installed version sends for
    ``send_task`` without options."""
    plain = Celery("plain", broker="memory://", set_as_current=False)
    seen: list[dict[str, Any]] = []

    def before(headers: dict[str, Any], **_: Any) -> None:
        seen.append(headers)

    before_task_publish.connect(before, weak=False)
    try:
        plain.send_task("math.add", (1,), {"y": 2})
    finally:
        before_task_publish.disconnect(before)
    return seen[0]


def test_every_way_of_sending_sends_the_same_job_through_celerys_signals(
        plain_send_task_headers: dict[str, Any], app: Celery, broker: Broker,
        signals: list[str]) -> None:
    add = app.tasks["math.add"]
    results = [add.delay(1, y=2), add.apply_async((1,), {"y": 2}),
               app.send_task("math.add", (1,), {"y": 2}), add.s(1, y=2).apply_async()]
    sent = jobs(broker)
    assert [job["id"] for job in sent] == [result.id for result in results]
    # send_task states ignore_result where the installed Celery's send_task does (5.5
    # and 5.6 always, False; 5.7 leaves it to the task); apply_async always states it.
    assert (sent[2]["x_celery"].get("ignore_result")
            == plain_send_task_headers.get("ignore_result"))
    assert "ignore_result" in sent[0]["x_celery"]
    assert [job["x_celery"].pop("ignore_result", False) for job in sent] == [False] * 4
    assert all(same_job(job) == same_job(sent[2]) for job in sent)
    assert sent[0]["args"] == [1] and sent[0]["x_celery"]["kwargs"] == {"y": 2}
    assert signals == [f"{when} {result.id}" for result in results
                       for when in ("before", "after")]
    stored = broker.published[0]
    assert (stored.exchange, stored.routing_key) == ("ojs.exchange.direct", "default")
    assert stored.properties["content_type"] == "application/openjobspec+json"


def test_task_protocol_1_sends_the_same_runnable_job(app: Celery, broker: Broker) -> None:
    """``task_protocol=1`` (Celery's old message format) must not publish a message no
    worker can run (its caller would wait for ever): the job is the protocol-2 one."""
    old = Celery("sender-v1", broker="ojs://guest:guest@in-memory//", set_as_current=False)
    ojs_kombu.install(old)
    old.conf.update(broker_transport=app.conf.broker_transport, task_protocol=1)
    old.task(name="math.add", shared=False)(app.tasks["math.add"].run)
    for sender in (app, old):
        sender.send_task("math.add", (1,), {"y": 2}, countdown=5, link=app.signature(
            "math.add", (9,)))
    v2, v1 = jobs(broker)
    assert broker.published[1].properties["content_type"] == "application/openjobspec+json"
    assert (v1["type"], v1["args"], v1["x_celery"]["kwargs"]) == ("math.add", [1], {"y": 2})
    assert "scheduled_at" in v1
    ignore = PER_PUBLISH | {"scheduled_at"}
    v1["x_celery"].pop("origin", None), v2["x_celery"].pop("origin", None)
    assert {k: v for k, v in v1.items() if k not in ignore} == \
        {k: v for k, v in v2.items() if k not in ignore}


def test_a_chain_travels_in_the_first_job(app: Celery, broker: Broker) -> None:
    add = app.tasks["math.add"]
    chain(add.s(1), add.s(2), add.s(3)).apply_async()
    [first] = jobs(broker)
    assert first["args"] == [1]
    assert [link["args"] for link in first["x_celery"]["chain"]] == [[3], [2]]


def test_celerys_headers_and_options_become_the_envelope(app: Celery, broker: Broker) -> None:
    app.tasks["math.add"].apply_async(
        (1,), priority=7, expires=60, time_limit=30, soft_time_limit=20, shadow="math.alias",
        headers={"tenant": "acme"}, ojs_meta={"tags": ["a"]}, ojs_retry={"max_attempts": 5})
    [job] = jobs(broker)
    assert (job["priority"], job["timeout"], job["meta"], job["retry"]["max_attempts"]) == (
        7, 30, {"tags": ["a"]}, 5)
    assert "expires_at" in job
    assert job["x_celery"]["shadow"] == "math.alias" and job["x_celery"]["tenant"] == "acme"
    headers = broker.published[0].properties["application_headers"]
    assert (headers["x-ojs-max-attempts"], headers["x-ojs-tags"]) == (5, "a")


def test_arguments_are_written_in_natural_json_or_refused_naming_the_value(
        app: Celery, broker: Broker) -> None:
    class Point:
        def __json__(self) -> list[int]:
            return [1, 2]

    add = app.tasks["math.add"]
    add.apply_async(((1, 2), Point()))
    assert jobs(broker)[0]["args"] == [[1, 2], [1, 2]]
    when = datetime(2026, 5, 1, 12, 30, tzinfo=UTC)
    add.apply_async((when,), {"y": [b"raw", float("nan")]})
    job = jobs(broker)[1]
    assert job["args"] == ["2026-05-01T12:30:00+00:00"]
    assert job["x_celery"]["kwargs"] == {"y": ["cmF3", "NaN"]}
    assert job["meta"]["x_celery_types"] == {"/args/0": "datetime",
                                             "/x_celery/kwargs/y/0": "bytes",
                                             "/x_celery/kwargs/y/1": "float"}
    for call, path in [(((1, {2}),), "args[1]"),
                       (((1,), {"y": {"order": object()}}), "kwargs['y']['order']")]:
        with pytest.raises(EncodeError, match=re.escape(path)) as info:
            add.apply_async(*call)
        assert isinstance(info.value, NonJSONArgumentError)
        assert "'math.add'" in str(info.value) and info.value.job_id
    assert len(broker.published) == 2


def test_typed_errors_are_raised_before_the_broker_is_reached(app: Celery,
                                                              broker: Broker) -> None:
    add = app.tasks["math.add"]
    with pytest.raises(JobOptionError, match="priority"):
        add.apply_async((1,), priority=1000)
    with pytest.raises(NonJSONArgumentError):
        add.apply_async(({1},))
    assert broker.published == [] and broker.connections_opened == 0


def test_eager_mode_publishes_nothing(app: Celery, broker: Broker) -> None:
    app.conf.task_always_eager = True
    assert app.tasks["math.add"].delay(5).get() == 5
    assert broker.published == []


def test_with_celerys_tracing_the_publish_has_its_span_and_the_same_job(
        app: Celery, broker: Broker) -> None:
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind

    add = app.tasks["math.add"]
    add.apply_async((1,), {"y": 2})
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = CeleryInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        traced = add.apply_async((1,), {"y": 2})
    finally:
        instrumentor.uninstrument()
    [span] = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.PRODUCER]
    assert span.name == "apply_async/math.add"
    # What a plain Celery app's span says about where the task went.
    assert span.attributes["messaging.destination_kind"] == "queue"
    assert span.attributes["messaging.destination"] == "ojs.queue.default"
    untraced_job, traced_job = jobs(broker)
    assert traced_job["id"] == traced.id
    trace_id = format(span.context.trace_id, "032x")
    assert traced_job["meta"]["trace_id"] == trace_id
    assert trace_id in traced_job["meta"]["traceparent"]
    headers = broker.published[1].properties["application_headers"]
    assert headers["x-ojs-trace-id"] == traced_job["meta"]["traceparent"]
    # Apart from the trace context, the job is the one an untraced publish sends.
    traced_job.pop("meta")
    traced_job["x_celery"].pop("traceparent", None)
    assert same_job(traced_job) == same_job(untraced_job)


def test_the_publish_signals_carry_what_celery_gives_them_for_the_same_call(
        app: Celery, broker: Broker) -> None:
    """Tracing instrumentation reads these arguments (and writes its trace context into
    ``headers``): they are the ones a plain Celery app's sender passes."""
    from celery.utils.nodenames import anon_nodename

    plain = Celery("plain", broker="memory://", set_as_current=False)
    seen: list[tuple[str, str, dict[str, Any]]] = []

    def recorder(when: str) -> Any:
        def record(sender: Any, **kwargs: Any) -> None:
            kwargs.pop("signal")
            seen.append((when, sender, kwargs))
        return record

    before, after = recorder("before"), recorder("after")
    before_task_publish.connect(before, weak=False)
    after_task_publish.connect(after, weak=False)
    def mul(x: int, y: int = 0) -> int:
        return x * y

    try:
        for each in (app, plain):
            each.task(name="math.mul", shared=False)(mul)
            each.tasks["math.mul"].apply_async((3,), {"y": 2}, priority=3, expires=60)
    finally:
        before_task_publish.disconnect(before)
        after_task_publish.disconnect(after)
    ojs_before, ojs_after, plain_before, plain_after = seen
    assert [(when, sender) for when, sender, _ in seen] == [
        ("before", "math.mul"), ("after", "math.mul")] * 2
    assert ojs_before[2].keys() == plain_before[2].keys() == {
        "body", "exchange", "routing_key", "declare", "headers", "properties", "retry_policy"}
    assert ojs_after[2].keys() == plain_after[2].keys() == {
        "body", "exchange", "routing_key", "headers"}
    ojs, celery = ojs_before[2], plain_before[2]
    assert ojs["body"] == celery["body"] == ((3,), {"y": 2}, {
        "callbacks": None, "errbacks": None, "chain": None, "chord": None})
    # Celery 5.7 passes the app's policy, 5.5 and 5.6 the call's (None here).
    assert ojs["retry_policy"] == celery["retry_policy"]
    assert ojs["properties"].keys() == celery["properties"].keys()
    assert ojs["properties"]["priority"] == celery["properties"]["priority"] == 3
    # The job queue is the routing key; the task's queue is declared as for any app
    # (the transport declares the OJS topology itself when the job is published).
    assert (ojs["exchange"], ojs["routing_key"]) == ("", "ojs.queue.default")
    assert [(q.name, q.exchange.type) for q in ojs["declare"]] == [
        ("ojs.queue.default", "direct")]
    assert [(q.name, q.exchange.type) for q in celery["declare"]] == [("celery", "direct")]
    ojs_headers, celery_headers = dict(ojs["headers"]), dict(celery["headers"])
    # argsrepr/kwargsrepr are rebuilt by consumers from the job's args and kwargs
    assert celery_headers.pop("argsrepr") == "(3,)"
    assert celery_headers.pop("kwargsrepr") == "{'y': 2}"
    assert ojs_headers["origin"] == celery_headers["origin"] == anon_nodename()
    for headers in (ojs_headers, celery_headers):
        assert headers.pop("id") == headers.pop("root_id")
        assert headers.pop("expires")
    assert ojs_headers == celery_headers
    # The after signal sees the headers the job was written from.
    assert ojs_after[2]["headers"] is ojs["headers"]
    [job] = jobs(broker)
    assert job["id"] == ojs["headers"]["id"]
