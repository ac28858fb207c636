"""ojs_kombu's metrics as an OpenTelemetry SDK and a Prometheus exporter see them."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import generate_latest

from ojs_kombu.amqp.binding import Binding
from ojs_kombu.events.bus import EventBus
from ojs_kombu.events.emitter import JobEvents
from ojs_kombu.events.hook import Hook
from ojs_kombu.events.job_info import JobInfo
from ojs_kombu.events.metric_observer import MetricsObserver
from ojs_kombu.events.metrics import OJSMetrics, track_connection
from ojs_kombu.spec.settings import OJSSettings

LABELS = {"job_type": "email.send", "queue": "email"}


def points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    return {m.name: list(m.data.data_points) for r in (data.resource_metrics if data else [])
            for s in r.scope_metrics for m in s.metrics}


def test_one_set_of_instruments_per_provider() -> None:
    """A meter keeps the first instrument of a name: a second ``OJSMetrics`` for the
    same provider must be the first, or its counts would never be reported."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    first = OJSMetrics(provider)
    Binding.from_settings(OJSSettings(meter_provider=provider))  # makes its own events
    second = OJSMetrics(provider)
    assert second is first
    second.jobs_completed.add(1, LABELS)
    second.duration.record(12.0, LABELS)
    found = points(reader)
    assert [(dict(p.attributes), p.value) for p in found["ojs.jobs.completed"]] == [(LABELS, 1)]
    assert found["ojs.jobs.duration_ms"][0].count == 1
    other = OJSMetrics(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    assert other is not first


def test_the_global_provider_set_after_the_app_gets_every_metric() -> None:
    """The docs' recipe sets the global provider when the worker starts, after the
    app (and its binding) exist."""
    script = textwrap.dedent("""
        import json

        from celery import Celery
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        import ojs_kombu
        from ojs_kombu.events.job_info import JobInfo

        app = ojs_kombu.install(Celery("recipe", broker="ojs://localhost//"))
        hook = app.amqp.binding.hook
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        job = JobInfo("019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f", "email.send", "email", 1)
        hook.job_enqueued(job, None, 0.0)
        hook.job_completed(job, 0.042, None)
        data = reader.get_metrics_data()
        print(json.dumps([m.name for r in data.resource_metrics for s in r.scope_metrics
                          for m in s.metrics]))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=True)
    names = json.loads(done.stdout)
    assert {"ojs.jobs.enqueued", "ojs.jobs.completed", "ojs.jobs.duration_ms",
            "ojs_amqp_connections_active", "ojs_amqp_channels_active"} <= set(names)


def test_jobs_before_the_global_provider_is_set_are_not_counted() -> None:
    """Until an SDK is behind the instruments the metrics observer sleeps (nothing
    counted, nothing built per job), as OpenTelemetry's own counters drop values;
    from the provider on, every job counts."""
    script = textwrap.dedent("""
        import json

        from celery import Celery
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        import ojs_kombu
        from ojs_kombu.events.job_info import JobInfo

        app = ojs_kombu.install(Celery("late", broker="ojs://localhost//"))
        hook = app.amqp.binding.hook
        job = JobInfo("019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f", "email.send", "email", 1)
        before = hook.listens("job_completed")
        hook.job_completed(job, 0.042, None)
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        after = hook.listens("job_completed")
        hook.job_completed(job, 0.042, None)
        hook.job_completed(job, 0.042, None)
        data = reader.get_metrics_data()
        points = {m.name: [p.value for p in m.data.data_points if hasattr(p, "value")]
                  for r in data.resource_metrics for s in r.scope_metrics for m in s.metrics}
        print(json.dumps([before, after, points["ojs.jobs.completed"]]))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=True)
    assert json.loads(done.stdout) == [False, True, [2]]


def prometheus_text() -> str:
    """The Prometheus exposition of every kind of ojs_kombu metric, each recorded once."""
    provider = MeterProvider(metric_readers=[PrometheusMetricReader()])  # global registry
    metrics = OJSMetrics(provider)
    hook = Hook(JobEvents(EventBus(), "ojs://t/p/1"), MetricsObserver(metrics))
    job = JobInfo("019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f", "email.send", "email", 1)
    hook.job_enqueued(job, None, 0.0)
    hook.job_completed(job, 0.042, None)
    metrics.wait.record(3.0, LABELS)
    metrics.confirm_latency.record(0.002)
    for tally in (metrics.published, metrics.consumed, metrics.acked, metrics.nacked,
                  metrics.returned):
        tally.add(1, {"queue": "email"})
    metrics.reconnections.add(1, {"outcome": "succeeded", "role": "worker"})
    return generate_latest().decode()


def test_prometheus_names_carry_no_doubled_unit() -> None:
    text = prometheus_text()
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines()
             if line and not line.startswith("#")}
    assert {"ojs_jobs_enqueued_total", "ojs_jobs_completed_total",
            "ojs_jobs_duration_ms_bucket", "ojs_jobs_duration_ms_count",
            "ojs_jobs_wait_ms_sum", "ojs_amqp_publish_confirm_latency_seconds_count",
            "ojs_amqp_messages_published_total", "ojs_amqp_messages_acked_total",
            "ojs_amqp_reconnections_total"} <= names
    assert not [n for n in names if "milliseconds" in n or "seconds_seconds" in n
                or "total_total" in n], names


class FakeChannel:
    """What the ``ojs`` transport's channels tell the AMQP gauges."""

    def __init__(self, prefetch: int, consumed: set[str], unacked: list[str],
                 is_open: bool = True) -> None:
        self.ojs_prefetch_count = prefetch
        self.ojs_consumed_queues = consumed
        self.unacked = unacked
        self.is_open = is_open

    def ojs_unacked(self) -> list[str]:
        return list(self.unacked)


class FakeConnection:
    def __init__(self, connected: bool, *channels: FakeChannel) -> None:
        self.connected = connected
        self.channels: dict[int, Any] = {0: self}
        self.channels.update(enumerate(channels, start=1))


def gauges(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, Any], float]]]:
    return {name: [(dict(p.attributes), p.value) for p in found]
            for name, found in points(reader).items() if name.startswith("ojs_amqp_c")
            or name == "ojs_amqp_messages_unacked"}


def test_connection_gauges_read_the_open_connections() -> None:
    reader = InMemoryMetricReader()
    OJSMetrics(MeterProvider(metric_readers=[reader]))
    consumer = FakeChannel(4, {"email", "sms"}, ["email", "email", "email"])
    idle = FakeChannel(0, {"email"}, ["email"])  # no prefetch window: no utilization
    live = FakeConnection(True, consumer, idle, FakeChannel(1, set(), [], is_open=False))
    gone = FakeConnection(False, FakeChannel(1, {"email"}, ["email"]))
    track_connection(live)
    track_connection(gone)
    found = gauges(reader)
    assert found["ojs_amqp_connections_active"][0][1] >= 1
    assert found["ojs_amqp_channels_active"][0][1] >= 2
    assert ({"queue": "email"}, 4) in found["ojs_amqp_messages_unacked"]
    assert ({"queue": "sms"}, 0) in found["ojs_amqp_messages_unacked"]
    assert ({"queue": "email"}, 0.75) in found["ojs_amqp_consumer_utilization"]
    assert ({"queue": "sms"}, 0.0) in found["ojs_amqp_consumer_utilization"]
    before = found["ojs_amqp_connections_active"][0][1]
    live.connected = False  # closed: neither it nor its channels count
    after = gauges(reader)
    assert after["ojs_amqp_connections_active"][0][1] == before - 1
    assert not [q for q, _ in after.get("ojs_amqp_messages_unacked", []) if q == {"queue": "sms"}]


_FORK_READER: InMemoryMetricReader | None = None


def _completed_in_child() -> list[Any]:
    assert _FORK_READER is not None
    return [p.value for p in points(_FORK_READER).get("ojs.jobs.completed", [])]


@pytest.mark.skipif(sys.platform == "win32", reason="fork")
def test_a_forked_process_reports_only_its_own_counts() -> None:
    """Prefork pool processes inherit the parent's tallies; the parent reports them."""
    global _FORK_READER
    _FORK_READER = reader = InMemoryMetricReader()
    metrics = OJSMetrics(MeterProvider(metric_readers=[reader]))
    metrics.jobs_completed.add(2, LABELS)
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply(_completed_in_child) == []
    assert [p.value for p in points(reader)["ojs.jobs.completed"]] == [2]
