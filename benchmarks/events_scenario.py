"""Events scenario: what OJS lifecycle events and OpenTelemetry metrics cost ojs_kombu.

The events part (``events_part.py``) measures publish and drain of ojs_kombu apps that
differ only in ``ojs_event_sinks = ["amqp"]`` and ``ojs_meter_provider`` (an SDK
``MeterProvider`` with an ``InMemoryMetricReader``): neither, both, and each
alone (:data:`SIDES`).  This module holds what only the sides with the sink
need: the *tap*, a queue bound with ``#`` to the events exchange that
receives every event the AMQP sink publishes, the probe that waits for the
sink and counts what arrived, and the table.  See benchmarks/README.rst.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable
from contextlib import suppress
from typing import Any, Protocol

import amqp
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from report import grid

from ojs_kombu.events.sinks import AMQPSink
from ojs_kombu.events.wire import decode_events
from ojs_kombu.spec.errors import InvalidEventMessage

#: The sides of the events part: (AMQP sink, metrics provider) of each.  "on" is the
#: side the target judges; "sink" and "metrics" show what each costs alone.
SIDES: dict[str, tuple[bool, bool]] = {
    "off": (False, False), "on": (True, True), "sink": (True, False), "metrics": (False, True),
}
#: Labels of the sides measured besides off and on, in the table.
SPLIT_LABELS = {"sink": "AMQP sink only", "metrics": "metrics only"}

#: The events one successful job emits, in lifecycle order.
JOB_EVENTS = ("job.enqueued", "job.started", "job.completed")
#: Informational target: drain jobs/s with events on divided by events off.
TARGET = 0.95
POLL_S = 0.005


def rotated(kinds: list[str], round_index: int) -> list[str]:
    """The side order of a round: rotated by one side per round, so over as many rounds
    as there are sides each side runs once in every position."""
    shift = round_index % len(kinds)
    return kinds[shift:] + kinds[:shift]


def meter_provider() -> tuple[MeterProvider, InMemoryMetricReader]:
    """A real SDK provider; the in-memory reader collects only when asked (after the run)."""
    reader = InMemoryMetricReader()
    return MeterProvider(metric_readers=[reader]), reader


class Tap:
    """An exclusive queue on the admin connection, bound with ``#`` to the events exchange.

    The exchange is declared here with the arguments the sink uses (topic,
    durable), so the binding exists before the first event is published.  The
    sink's publishes are confirmed, and RabbitMQ confirms a message to this
    (transient) queue once it is in it: when the sink's buffer is empty, the
    tap holds every event delivered so far.
    """

    def __init__(self, connection: amqp.Connection, exchange: str, queue: str) -> None:
        self.connection = connection
        self.exchange = exchange
        self.queue = queue
        self.channel = connection.channel()
        self.channel.exchange_declare(exchange, "topic", durable=True, auto_delete=False)
        self.channel.queue_declare(queue, durable=False, exclusive=True, auto_delete=False)
        self.channel.queue_bind(queue, exchange, "#")

    def depth(self) -> int:
        return int(self.channel.queue_declare(self.queue, passive=True).message_count)

    def purge(self) -> None:
        self.channel.queue_purge(self.queue)

    def take(self, timeout: float) -> list[tuple[str, str | None]]:
        """Consume (and so remove) every message: ``(event type, subject)`` of each event
        (a batch message holds several, see ``ojs_kombu.events.wire``)."""
        wanted = self.depth()
        got: list[tuple[str, str | None]] = []
        messages = 0

        def on_message(message: amqp.Message) -> None:
            nonlocal messages
            messages += 1
            kind = message.delivery_info["routing_key"]
            try:
                events = decode_events(message.body, message.properties.get("content_type"))
            except InvalidEventMessage:
                got.append((kind, None))
                return
            got.extend((kind, event.get("subject")) for event in events)

        self.channel.basic_qos(0, 1000, False)
        tag = self.channel.basic_consume(self.queue, no_ack=True, callback=on_message)
        deadline = time.monotonic() + timeout
        try:
            while messages < wanted and time.monotonic() < deadline:
                with suppress(TimeoutError):
                    self.connection.drain_events(timeout=1)
        finally:
            self.channel.basic_cancel(tag)
        return got

    def close(self) -> None:
        with suppress(Exception):  # the channel may already be closed by an error
            self.channel.close()


class Recorder(Protocol):
    """The part of ``sides.DrainRecorder`` used here."""

    last_end: float | None


class Probe:
    """A side's instruments: its AMQP sink, its tap and its metric reader (``None`` for the
    sink-only side)."""

    def __init__(self, app: Any, tap: Tap, reader: InMemoryMetricReader | None) -> None:
        sinks = [s.callback for s in app.amqp.binding.events.bus.subscriptions
                 if isinstance(s.callback, AMQPSink)]
        if len(sinks) != 1:
            raise RuntimeError(f"expected one AMQP event sink, found {len(sinks)}")
        self.sink: AMQPSink = sinks[0]
        self.tap = tap
        self.reader = reader
        self._base = 0

    def handled(self) -> int:
        """Events the sink delivered, failed to deliver or dropped."""
        return self.sink.delivered + self.sink.failed + self.sink.dropped

    def flush(self, timeout: float) -> float:
        """Wait until the sink's buffer is empty; the seconds it took."""
        started = time.perf_counter()
        if not self.sink.flush(timeout):
            raise RuntimeError(f"the AMQP event sink did not empty its buffer in {timeout:.0f}s "
                               f"(counters: {self.sink_counters()})")
        return time.perf_counter() - started

    def reset(self, timeout: float) -> None:
        """After the warm-up: nothing left in the sink's buffer, an empty tap."""
        self.flush(timeout)
        self.tap.purge()

    def after_publish(self, n: int, timeout: float) -> dict[str, Any]:
        """The publish measurement's ``job.enqueued`` events: how long the sink still needed
        after the loop, and how many arrived.  Leaves the tap empty."""
        backlog_s = self.flush(timeout)
        arrived = sum(1 for kind, _ in self.tap.take(timeout) if kind == "job.enqueued")
        return {"sink_backlog_s": backlog_s, "enqueued_events": arrived, "published": n,
                "every_job_enqueued_event": arrived == n}

    def before_worker(self, timeout: float) -> None:
        """The prefill's ``job.enqueued`` events go out before the worker starts (they stay
        in the tap), so the drain only carries the worker's own events."""
        self.flush(timeout)
        self._base = self.handled()

    def wait_drain_events(self, recorder: Recorder, n: int, timeout: float) -> float | None:
        """With the worker still running: seconds from the last job's end until the sink
        has handled its ``job.started``/``job.completed`` events and ``worker.started``."""
        target = self._base + 2 * n + 1
        deadline = time.monotonic() + timeout
        while self.handled() < target:
            if time.monotonic() >= deadline:
                return None
            time.sleep(POLL_S)
        done = time.perf_counter()
        return None if recorder.last_end is None else max(done - recorder.last_end, 0.0)

    def collect(self, job_ids: list[str], timeout: float) -> dict[str, Any]:
        """After the worker stopped (which closed the sink, its buffer delivered): every event
        in the tap, counted against the jobs."""
        self.flush(timeout)
        events = self.tap.take(timeout)
        return {**count_events(events, job_ids), "sink": self.sink_counters(),
                "metrics": self.metrics()}

    def sink_counters(self) -> dict[str, int]:
        return {"delivered": self.sink.delivered, "failed": self.sink.failed,
                "dropped": self.sink.dropped}

    def metrics(self) -> dict[str, float]:
        """Every instrument the provider saw: a counter's sum, a histogram's count."""
        if self.reader is None:
            return {}
        data = self.reader.get_metrics_data()
        totals: dict[str, float] = {}
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    totals[metric.name] = sum(
                        getattr(point, "count", getattr(point, "value", 0))
                        for point in metric.data.data_points)
        return totals


def count_events(events: list[tuple[str, str | None]], job_ids: list[str]) -> dict[str, Any]:
    """By type, and for each job event type how many of the drained jobs have exactly one."""
    by_type = Counter(kind for kind, _ in events)
    jobs = set(job_ids)
    per_job = {kind: Counter(subject for k, subject in events if k == kind and subject in jobs)
               for kind in JOB_EVENTS}
    job_events = sum(by_type[kind] for kind in JOB_EVENTS)
    return {
        "jobs": len(job_ids),
        "total": len(events),
        "by_type": dict(sorted(by_type.items())),
        "job_events_per_job": job_events / len(job_ids) if job_ids else 0.0,
        "missing": {kind: len(jobs - set(per_job[kind])) for kind in JOB_EVENTS},
        "duplicated": {kind: sum(1 for c in per_job[kind].values() if c > 1)
                       for kind in JOB_EVENTS},
        "every_job_completed_event": not (jobs - set(per_job["job.completed"])),
    }


# -- results ---------------------------------------------------------------


def _over_off(side: dict[str, float], off: dict[str, float]) -> dict[str, float]:
    """``ratio``: a side's jobs/s over events off; ``cpu_ratio`` (drains): CPU per job
    off / side, the jobs/s ratio's steadier counterpart (informational)."""
    ratios = {"ratio": side["jobs_per_s"] / off["jobs_per_s"]}
    if "cpu_us_per_job" in side and "cpu_us_per_job" in off:
        ratios["cpu_ratio"] = off["cpu_us_per_job"] / side["cpu_us_per_job"]
    return ratios


def summarize(rounds: list[dict[str, Any]],
              median_of: Callable[[list[dict[str, Any]]], dict[str, float]]) -> dict[str, Any]:
    """Per-side medians over the rounds, the ratios on/off and the target check; for the
    sides with the sink or the metrics alone (when measured) their drain over events off."""
    result: dict[str, Any] = {}
    for scenario in ("publish", "drain"):
        off = median_of([r["off"][scenario] for r in rounds])
        on = median_of([r["on"][scenario] for r in rounds])
        result[scenario] = {"off": off, "on": on, **_over_off(on, off)}
    result["drain"].update(target=TARGET, met=result["drain"]["ratio"] >= TARGET)
    split: dict[str, Any] = {}
    for kind in SPLIT_LABELS:
        if all(kind in r for r in rounds):
            drain = median_of([r[kind]["drain"] for r in rounds])
            split[kind] = {"drain": drain, **_over_off(drain, result["drain"]["off"])}
    if split:
        result["split"] = split
    lags = [r["on"]["drain_events_lag_s"] for r in rounds
            if r["on"]["drain_events_lag_s"] is not None]
    result["drain_events_lag_s"] = statistics.median(lags) if lags else None
    result["every_job_completed_event"] = all(
        r["on"]["events"]["every_job_completed_event"] for r in rounds)
    result["every_job_enqueued_event_on_publish"] = all(
        r["on"]["publish_events"]["every_job_enqueued_event"] for r in rounds)
    result["rounds"] = rounds
    return result


def _split_rows(result: dict[str, Any]) -> list[tuple[str, ...]]:
    """Table rows of the sides with the sink alone and the metrics alone, against off."""
    off = result["drain"]["off"]
    rows: list[tuple[str, ...]] = []
    for kind, part in result.get("split", {}).items():
        label, drain = SPLIT_LABELS[kind], part["drain"]
        rows.append((f"drain jobs/s, {label}", f"{off['jobs_per_s']:.0f}",
                     f"{drain['jobs_per_s']:.0f}", f"{part['ratio']:.2f}", "", ""))
        if "cpu_ratio" in part:
            rows.append((f"drain CPU us/job, {label}", f"{off['cpu_us_per_job']:.0f}",
                         f"{drain['cpu_us_per_job']:.0f}", f"{part['cpu_ratio']:.2f}*", "", ""))
    return rows


def render(result: dict[str, Any]) -> list[str]:
    """The on/off table, then what the tap received in each round."""
    pub, drain = result["publish"], result["drain"]
    rows: list[tuple[str, ...]] = [
        ("events (ojs_kombu)", "events off", "events on", "ratio (on/off)", "target",
         "status"),
        ("publish jobs/s", f"{pub['off']['jobs_per_s']:.0f}", f"{pub['on']['jobs_per_s']:.0f}",
         f"{pub['ratio']:.2f}", "", ""),
        ("drain jobs/s", f"{drain['off']['jobs_per_s']:.0f}",
         f"{drain['on']['jobs_per_s']:.0f}", f"{drain['ratio']:.2f}",
         f">= {drain['target']:.2f}", "met" if drain["met"] else "not met"),
        *([("drain CPU us/job", f"{drain['off']['cpu_us_per_job']:.0f}",
             f"{drain['on']['cpu_us_per_job']:.0f}", f"{drain['cpu_ratio']:.2f}*", "", "")]
           if "cpu_ratio" in drain else []),
        *_split_rows(result),
        ("publish p50 ms", f"{pub['off']['p50_ms']:.3f}", f"{pub['on']['p50_ms']:.3f}", "", "",
         ""),
        ("publish p99 ms", f"{pub['off']['p99_ms']:.3f}", f"{pub['on']['p99_ms']:.3f}", "", "",
         ""),
    ]
    lines = grid(rows)
    if "cpu_ratio" in drain:
        lines.append("* CPU ratio is off/on: the share of the events-off speed the events-on "
                     "side would keep if CPU alone set it")
    if "split" in result:
        lines.append("  AMQP sink only / metrics only: the events on side's two parts alone, "
                     "informational (events on column: that side)")
    lines.append("")
    detail: list[tuple[str, ...]] = [("events on, per round", "value")]
    for i, rnd in enumerate(result["rounds"], 1):
        on = rnd["on"]
        events, published = on["events"], on["publish_events"]
        kinds = ", ".join(f"{k} {v}" for k, v in events["by_type"].items())
        missing = sum(events["missing"].values())
        lag = on["drain_events_lag_s"]
        tag = f"round {i} " if len(result["rounds"]) > 1 else ""
        detail += [
            (f"{tag}drain: events received", f"{events['total']} ({kinds})"),
            (f"{tag}drain: job events per job", f"{events['job_events_per_job']:.2f}"),
            (f"{tag}drain: job.completed for every job",
             f"{'yes' if events['every_job_completed_event'] else 'no'} "
             f"({events['jobs'] - events['missing']['job.completed']}/{events['jobs']})"),
            (f"{tag}drain: job events missing / duplicated",
             f"{missing} / {sum(events['duplicated'].values())}"),
            (f"{tag}drain: sink done after last job s", "-" if lag is None else f"{lag:.2f}"),
            (f"{tag}publish: job.enqueued received",
             f"{published['enqueued_events']} of {published['published']}"),
            (f"{tag}publish: sink done after loop s", f"{published['sink_backlog_s']:.2f}"),
            (f"{tag}sink delivered / failed / dropped",
             "{delivered} / {failed} / {dropped}".format(**events["sink"])),
            (f"{tag}OTel ojs.jobs.enqueued / completed",
             f"{events['metrics'].get('ojs.jobs.enqueued', 0):.0f} / "
             f"{events['metrics'].get('ojs.jobs.completed', 0):.0f}"),
        ]
    return lines + grid(detail)
