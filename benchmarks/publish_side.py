"""One side of the traced publish part, in a process of its own.

``traced_publish.py`` starts ``python benchmarks/publish_side.py plain|ojs
traced|untraced BROKER_URL`` once per side.  A process per side, because
``CeleryInstrumentor().instrument()`` connects Celery's publish signals
process-wide: a traced side in the benchmark's own process would trace every
other side too.  The side is ``run.py``'s own (``make_plain_side`` with
``confirm_publish``, ``make_ojs_side`` with ``ojs_kombu.install``) and
publishes with ``run.publish``, the loop of the throughput part's single
confirmed publishes.  A traced side first sets an SDK ``TracerProvider``
whose spans go through a ``BatchSpanProcessor`` (what an app exporting its
traces runs) to an exporter that only counts them by kind, then instruments.

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
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import run  # benchmarks/ is sys.path[0] when this file runs as a script
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


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


def say(message: dict[str, Any]) -> None:
    print(json.dumps(message), flush=True)


def serve(kind: str, traced: bool, broker_url: str) -> None:
    tracing = Tracing() if traced else None
    side = (run.make_plain_side(broker_url, os.getpid()) if kind == "plain"
            else run.make_ojs_side(broker_url, os.getpid()))
    say({"queue": side.amqp_queue, "queues": side.queues, "exchanges": side.exchanges,
         "sweep_prefix": side.sweep_prefix})
    try:
        side.declare()
        run.publish(side, run.WARMUP)
        spans_before = tracing.producer_spans() if tracing else 0
        say({"ready": True, "warmup_producer_spans": spans_before})
        seconds, cpu, latencies = 0.0, 0.0, []
        for line in sys.stdin:
            command, _, count = line.strip().partition(" ")
            if command == "publish":
                cpu_started, started = time.process_time(), time.perf_counter()
                block = run.publish(side, int(count))
                spent = time.perf_counter() - started
                if tracing:  # the exporter thread's work on these spans is theirs
                    tracing.provider.force_flush()
                cpu += time.process_time() - cpu_started
                seconds += spent
                latencies += block
                say({"seconds": spent})
            elif command == "round":
                spans = tracing.producer_spans() if tracing else 0
                say({**asdict(run.publish_result(len(latencies), seconds, latencies)),
                     "jobs": len(latencies), "cpu_us_per_job": cpu * 1e6 / len(latencies),
                     "producer_spans": spans - spans_before})
                seconds, cpu, latencies, spans_before = 0.0, 0.0, [], spans
            elif command == "quit":
                break
    finally:
        side.app.close()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2] == "traced", sys.argv[3])
