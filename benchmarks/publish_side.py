"""One side of the traced publish part, in a process of its own.

``traced_publish.py`` starts ``python benchmarks/publish_side.py
plain|plainnc|ojs|deferred|raw traced|untraced BROKER_URL`` once per side
(``plainnc``: plain Celery without confirms; ``deferred``: ojs_kombu with
``ojs_publish_confirms="deferred"``, every block ending with
``ojs_kombu.flush_confirms()`` inside its time).  A process per side, because
``CeleryInstrumentor().instrument()`` connects Celery's publish signals
process-wide: a traced side in the benchmark's own process would trace every
other side too.  The side is the throughput part's own (``sides.make_plain_side`` with
``confirm_publish``, ``sides.make_ojs_side`` with ``ojs_kombu.install``) and
publishes with ``publish``, the loop of the throughput part's single
confirmed publishes; its app is made the current one, as an app's own is, for
the instrumentation looks the task up there.  A traced side first sets an SDK
``TracerProvider`` whose spans go through a ``BatchSpanProcessor`` (what an
app exporting its traces runs) to an exporter that only counts them by kind,
then instruments.
The ``raw`` side (:class:`RawSide`) is the ceiling of any client under the
same tracing: raw py-amqp publishing a copy of one job ojs_kombu published,
one confirmed message at a time, between Celery's publish signals when traced.

It speaks one JSON line per line on stdout: its broker names first (before any
I/O, so the parent can delete them whatever happens), ``ready`` after the
warm-up; then it answers ``publish K`` (one timed block) with the block's
seconds and ``round`` with the round's result (which resets it), until
``quit`` or the end of stdin.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict
from functools import partial
from typing import Any

import amqp
from admin import Broker  # benchmarks/ is sys.path[0] when this file runs as a script
from celery import signals
from measure import publish, publish_deferred, publish_result
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from raw_side import raw_publisher
from sides import DEFERRED_CONF, WARMUP, Side, make_ojs_side, make_plain_side


class CountingExporter(SpanExporter):
    """Counts finished spans by kind and drops them: tracing configured, the export
    itself free, so what is measured is the instrumentation and the SDK."""

    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.kinds.update(span.kind.name for span in spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


class Tracing:
    """The global SDK ``TracerProvider`` and ``CeleryInstrumentor``, as a traced app sets
    them up at start (README, *Tracing*)."""

    def __init__(self) -> None:
        from opentelemetry import trace
        from opentelemetry.instrumentation.celery import CeleryInstrumentor
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        self.exporter = CountingExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(BatchSpanProcessor(self.exporter))
        trace.set_tracer_provider(self.provider)
        CeleryInstrumentor().instrument()

    def producer_spans(self) -> int:
        """PRODUCER spans exported so far (every ended span flushed first)."""
        self.provider.force_flush()
        return self.exporter.kinds["PRODUCER"]


class RawSide:
    """Raw py-amqp publishes of one job ``side`` (ojs_kombu) published, each waiting for
    its confirm (``RawConfirmPublisher``, read back as the throughput part's raw publisher
    does); ``traced``, each between Celery's ``before_task_publish`` and
    ``after_task_publish`` sent as ``send_task_message`` sends them.

    The signals' arguments are those of that one ``apply_async`` (captured), with a
    new ``headers`` dict per publish (the instrumentation injects into it) holding a
    new task id (its span's message id).  The injected ``traceparent`` goes into the
    message's ``x-ojs-trace-id`` header; the body stays the read-back job's.  No
    Celery app per call: ``side``'s app, made once, names the task.
    """

    def __init__(self, side: Side, broker_url: str, traced: bool) -> None:
        self.traced = traced
        calls: list[dict[str, Any]] = []

        def capture(**kwargs: Any) -> None:
            calls.append(kwargs)

        signals.before_task_publish.connect(capture, weak=False)
        broker, self.stack = Broker(broker_url), ExitStack()
        try:
            self.publisher = self.stack.enter_context(
                raw_publisher(broker, broker_url, side))
        finally:
            signals.before_task_publish.disconnect(capture)
            broker.close()
        call = calls[0]
        self.call = {key: call[key] for key in (
            "sender", "body", "exchange", "routing_key", "declare", "properties",
            "retry_policy")}
        self.headers = {key: value for key, value in call["headers"].items()
                        if key != "traceparent"}  # injected per publish
        self.application_headers: dict[str, Any] = self.publisher.properties.setdefault(
            "application_headers", {})

    def send(self, n: int) -> list[float]:
        """``n`` confirmed publishes, one at a time; each one's latency in seconds."""
        if not self.traced:
            return self.publisher.send(n, 1)
        p = self.publisher
        publish, drain, Message = p.channel.basic_publish, p.connection.drain_events, amqp.Message
        before, after = signals.before_task_publish.send, signals.after_task_publish.send
        call, template, trace_header = self.call, self.headers, self.application_headers
        sender, body, exchange, routing_key = (call["sender"], call["body"], call["exchange"],
                                               call["routing_key"])
        message_body, properties = p.body, p.properties
        new_id, clock = uuid.uuid4, time.perf_counter
        latencies: list[float] = []
        for _ in range(n):
            started = clock()
            headers = template.copy()
            headers["id"] = headers["root_id"] = str(new_id())
            before(headers=headers, **call)
            trace_header["x-ojs-trace-id"] = headers["traceparent"]
            publish(Message(message_body, **properties), p.exchange, p.routing_key,
                    mandatory=True)
            p.published += 1
            while p.confirmed < p.published:
                drain(timeout=30)
            after(sender=sender, body=body, headers=headers, exchange=exchange,
                  routing_key=routing_key)
            latencies.append(clock() - started)
        p.raise_if_refused()
        return latencies

    def close(self) -> None:
        self.stack.close()


def say(message: dict[str, Any]) -> None:
    print(json.dumps(message), flush=True)


def serve(kind: str, traced: bool, broker_url: str) -> None:
    tracing = Tracing() if traced else None
    side = (make_plain_side(broker_url, os.getpid()) if kind == "plain"
            else make_plain_side(broker_url, os.getpid(), confirm=False)
            if kind == "plainnc"
            else make_ojs_side(broker_url, os.getpid(), conf=DEFERRED_CONF)
            if kind == "deferred"
            else make_ojs_side(broker_url, os.getpid()))
    # The one app of this process is its current app, as an app's own is (sides.py makes
    # them with set_as_current=False, for two in one process): the instrumentation finds
    # the task in current_app.tasks, so its span stays open over the publish until
    # after_task_publish ends it.  Not found, the span ended in before_task_publish.
    side.app.set_current()
    say({"queue": side.amqp_queue, "queues": side.queues, "exchanges": side.exchanges,
         "sweep_prefix": side.sweep_prefix})
    with ExitStack() as stack:
        stack.callback(side.app.close)
        side.declare()
        send: Callable[[int], list[float]] = partial(
            publish_deferred if kind == "deferred" else publish, side)
        if kind == "raw":
            raw = RawSide(side, broker_url, traced)
            stack.callback(raw.close)
            send = raw.send
        send(WARMUP)
        spans_before = tracing.producer_spans() if tracing else 0
        say({"ready": True, "warmup_producer_spans": spans_before})
        seconds, cpu, latencies = 0.0, 0.0, []
        for line in sys.stdin:
            command, _, count = line.strip().partition(" ")
            if command == "publish":
                cpu_started, started = time.process_time(), time.perf_counter()
                block = send(int(count))
                spent = time.perf_counter() - started
                if tracing:  # the exporter thread's work on these spans is theirs
                    tracing.provider.force_flush()
                cpu += time.process_time() - cpu_started
                seconds += spent
                latencies += block
                say({"seconds": spent})
            elif command == "round":
                spans = tracing.producer_spans() if tracing else 0
                say({**asdict(publish_result(len(latencies), seconds, latencies)),
                     "jobs": len(latencies), "cpu_us_per_job": cpu * 1e6 / len(latencies),
                     "producer_spans": spans - spans_before})
                seconds, cpu, latencies, spans_before = 0.0, 0.0, [], spans
            elif command == "quit":
                break


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2] == "traced", sys.argv[3])
