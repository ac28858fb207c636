"""OJS metrics (events spec section 7, AMQP binding section 12.1) through OpenTelemetry.

Instruments come from the OpenTelemetry metrics API: without an SDK (a
``MeterProvider``) every call is a no-op.  Labels are ``job_type`` and
``queue`` only, never a job id (section 7.3).  To expose them to Prometheus,
install ``opentelemetry-exporter-prometheus`` and configure a provider::

    from opentelemetry import metrics
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import start_http_server

    start_http_server(9464)
    metrics.set_meter_provider(MeterProvider(metric_readers=[PrometheusMetricReader()]))
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry import metrics
from opentelemetry.context import get_current

DURATION_BUCKETS = [5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000]
WAIT_BUCKETS = [10, 50, 100, 500, 1000, 5000, 10000, 30000, 60000, 300000, 600000]
CONFIRM_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5]

#: ``() -> [(queue, value), ...]`` for an observable gauge.
QueueReadings = Callable[[], Iterable[tuple[str, float]]]


class OJSMetrics:
    """Every ojs_kombu instrument; one per process (or per meter provider)."""

    def __init__(self, meter_provider: Any = None) -> None:
        meter = (meter_provider or metrics.get_meter_provider()).get_meter("ojs_kombu")
        self.meter = meter
        self.jobs_enqueued = Tally(meter,
            "ojs.jobs.enqueued", unit="{job}", description="Jobs enqueued")
        self.jobs_completed = Tally(meter,
            "ojs.jobs.completed", unit="{job}", description="Jobs completed successfully")
        self.jobs_failed = Tally(meter,
            "ojs.jobs.failed", unit="{job}", description="Jobs that reached terminal failure")
        self.duration = BufferedHistogram(meter,
            "ojs.jobs.duration_ms", unit="ms", description="Execution time per attempt",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        self.wait = BufferedHistogram(meter,
            "ojs.jobs.wait_ms", unit="ms", description="Time from enqueued_at to started_at",
            explicit_bucket_boundaries_advisory=WAIT_BUCKETS)
        self.published = Tally(meter,
            "ojs_amqp_messages_published_total", description="Messages published")
        self.consumed = Tally(meter,
            "ojs_amqp_messages_consumed_total", description="Messages consumed")
        self.acked = Tally(meter,
            "ojs_amqp_messages_acked_total", description="Messages acknowledged")
        self.nacked = Tally(meter,
            "ojs_amqp_messages_nacked_total", description="Messages negatively acknowledged")
        self.returned = Tally(meter,
            "ojs_amqp_messages_returned_total", description="Messages returned (Basic.Return)")
        self.reconnections = Tally(meter,
            "ojs_amqp_reconnections_total", description="Reconnection attempts")
        self.confirm_latency = BufferedHistogram(meter,
            "ojs_amqp_publish_confirm_latency_seconds", unit="s",
            description="Publisher confirm latency",
            explicit_bucket_boundaries_advisory=CONFIRM_BUCKETS)
        # Backpressure extension, section 10.2 (names as the spec writes them).
        self.backpressure_rejected = Tally(meter,
            "ojs.backpressure.rejected_total", unit="{job}",
            description="Enqueues rejected because the queue was at its bound")
        self.backpressure_dropped = Tally(meter,
            "ojs.backpressure.dropped_total", unit="{job}",
            description="Jobs a drop_oldest queue dropped (counted by its workers)")
        self._pressure_observed = False
        histograms = (self.duration, self.wait, self.confirm_latency)
        # Reports nothing itself: its callback runs on every collection, before the
        # SDK reads its aggregations, and hands them every buffered measurement.
        meter.create_observable_gauge(
            "ojs_kombu.buffered_histograms", callbacks=[_flusher(histograms)],
            description="Flushes ojs_kombu's buffered histograms when metrics are collected")

    def observe_backpressure(self, pressure: QueueReadings) -> None:
        """Register ``ojs.backpressure.pressure`` (depth / bound, 0.0..1.0, last sampled)."""
        if self._pressure_observed:
            return
        self._pressure_observed = True
        self.meter.create_observable_gauge(
            "ojs.backpressure.pressure", callbacks=[_observer(pressure)], unit="1",
            description="Queue depth / depth bound as last sampled by this producer")

    def observe_queues(self, depth: QueueReadings, active: QueueReadings,
                       dead_letters: QueueReadings) -> None:
        """Register the gauges ``ojs.queue.depth``, ``ojs.queue.active`` and
        ``ojs.dead_letter.depth``."""
        for name, read, description in (
            ("ojs.queue.depth", depth, "Jobs available per queue"),
            ("ojs.queue.active", active, "Jobs active per queue"),
            ("ojs.dead_letter.depth", dead_letters, "Jobs in the dead-letter queue"),
        ):
            self.meter.create_observable_gauge(
                name, callbacks=[_observer(read)], unit="{job}", description=description)


def _observer(read: QueueReadings) -> Callable[[Any], Iterable[metrics.Observation]]:
    def observe(_options: Any) -> Iterable[metrics.Observation]:
        try:
            readings = list(read())
        except Exception:  # a broker that is down must not break the exporter
            return []
        return [metrics.Observation(value, {"queue": queue}) for queue, value in readings]
    return observe


def _flusher(histograms: Iterable[BufferedHistogram]
             ) -> Callable[[Any], Iterable[metrics.Observation]]:
    def flush(_options: Any) -> Iterable[metrics.Observation]:
        for histogram in histograms:
            histogram.flush(wait=True)
        return []
    return flush


class BufferedHistogram:
    """An OpenTelemetry histogram whose measurements reach the SDK in batches.

    The SDK's ``Histogram.record`` costs several microseconds per call (attribute
    cleaning and hashing, exemplar sampling, two locks), more from a worker's
    pool threads than from one thread in a loop, and a worker records two per
    job.  :meth:`record` appends the value, its labels and the current context
    (so exemplars still point at the right span); the thread whose value fills
    the buffer hands all of them to the SDK, and so does every collection of
    the metrics (``OJSMetrics`` registers that callback), so an export or a
    test reading the metrics never misses a value.
    """

    __slots__ = ("__weakref__", "_buffer", "_flushing", "_histogram", "name")

    #: Buffered measurements that make the recording thread flush.
    flush_at = 256

    def __init__(self, meter: Any, name: str, **kwargs: Any) -> None:
        self.name = name
        self._histogram = meter.create_histogram(name, **kwargs)
        self._buffer: deque[tuple[float, Mapping[str, Any] | None, Any]] = deque()
        self._flushing = threading.Lock()
        _BUFFERED.add(self)

    def record(self, amount: float, attributes: Mapping[str, Any] | None = None) -> None:
        if self._discards():
            return
        buffer = self._buffer
        buffer.append((amount, attributes, get_current()))
        if len(buffer) >= self.flush_at:
            self.flush()

    def _discards(self) -> bool:
        """No SDK behind the instrument (the API's no-op, or its proxy while no provider
        is set): the API would drop the value, so there is nothing to buffer or flush."""
        histogram = self._histogram
        histogram = getattr(histogram, "_real_instrument", histogram)  # the API's proxy
        return histogram is None or isinstance(histogram, metrics.NoOpHistogram)

    def flush(self, wait: bool = False) -> None:
        """Hand every buffered measurement to the SDK; without ``wait`` a flush already
        running in another thread does it."""
        if not self._flushing.acquire(blocking=wait):
            return
        try:
            record, take = self._histogram.record, self._buffer.popleft
            while True:
                try:
                    amount, attributes, context = take()
                except IndexError:
                    return
                record(amount, attributes, context)
        finally:
            self._flushing.release()

    def __len__(self) -> int:
        """Measurements recorded and not yet handed to the SDK."""
        return len(self._buffer)

    def _forked(self) -> None:
        # The parent records what it buffered; a flush lock held by a parent thread
        # that does not exist here would never be released.
        self._buffer = deque()
        self._flushing = threading.Lock()


_BUFFERED: weakref.WeakSet[BufferedHistogram] = weakref.WeakSet()


def _forget_parent_measurements() -> None:
    for histogram in list(_BUFFERED):
        histogram._forked()


os.register_at_fork(after_in_child=_forget_parent_measurements)


class Tally:
    """A monotonic counter summed in this process and reported as an OpenTelemetry
    ``ObservableCounter`` when the metrics are collected.

    Exporters see the same cumulative sum as from a synchronous ``Counter``, but
    ``add`` is one dict update instead of the SDK's per-measurement work
    (attribute cleaning and hashing, several microseconds): ojs_kombu adds to
    a few counters for every job, in the worker's hot path.  Label sets are
    bounded (``job_type``, ``queue``), and so is the dict.
    """

    __slots__ = ("_counts", "_lock", "name")

    def __init__(self, meter: Any, name: str, *, unit: str = "", description: str = "") -> None:
        self.name = name
        self._counts: dict[tuple[tuple[str, Any], ...], float] = {}
        self._lock = threading.Lock()
        meter.create_observable_counter(name, callbacks=[self._observe], unit=unit,
                                        description=description)

    def add(self, amount: float, attributes: Mapping[str, Any] | None = None) -> None:
        key = tuple(attributes.items()) if attributes else ()
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + amount

    def _observe(self, _options: Any) -> list[metrics.Observation]:
        with self._lock:
            counts = list(self._counts.items())
        return [metrics.Observation(value, dict(key)) for key, value in counts]


def labels(job_type: str, queue: str) -> dict[str, str]:
    return {"job_type": job_type, "queue": queue}
