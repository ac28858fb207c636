"""OJS metrics (events spec section 7, AMQP binding section 12.1) through OpenTelemetry.

Instruments come from the OpenTelemetry metrics API: without an SDK (a
``MeterProvider``) every call is a no-op.  Labels are ``job_type`` and
``queue`` only, never a job id (section 7.3).  The docs' "Events, metrics
and tracing" page has the Prometheus recipe.

Names are the specs' own.  ``ojs.jobs.duration_ms`` and ``ojs.jobs.wait_ms``
carry their unit in the name, so their instruments declare none: exporters
that append a unit suffix (Prometheus: ``_milliseconds``) would double it.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

from opentelemetry import metrics
from opentelemetry.context import get_current

from .otel_seam import instrument_probe

DURATION_BUCKETS = [5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000]
WAIT_BUCKETS = [10, 50, 100, 500, 1000, 5000, 10000, 30000, 60000, 300000, 600000]
CONFIRM_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5]

#: ``() -> [(queue, value), ...]`` for an observable gauge.
QueueReadings = Callable[[], Iterable[tuple[str, float]]]


class OJSMetrics:
    """Every ojs_kombu instrument: one set per meter provider in a process.

    An OpenTelemetry meter keeps the first instrument registered under a name and
    drops later ones (with their callbacks), so ``OJSMetrics(provider)`` returns the
    instance already made for ``provider``; ``None`` and the global provider (the
    default, also when it is set later) share one.
    """

    _made: ClassVar[weakref.WeakKeyDictionary[Any, OJSMetrics]] = weakref.WeakKeyDictionary()
    _global: ClassVar[OJSMetrics | None] = None
    _making: ClassVar[threading.Lock] = threading.Lock()

    def __new__(cls, meter_provider: Any = None) -> OJSMetrics:
        is_global = meter_provider is None or meter_provider is metrics.get_meter_provider()
        with cls._making:
            made = cls._global if is_global else cls._made.get(meter_provider)
            if made is not None:
                return made
            made = super().__new__(cls)
            made.register_instruments(metrics.get_meter_provider() if is_global else meter_provider)
            if is_global:
                cls._global = made
            else:
                cls._made[meter_provider] = made
            return made

    def __init__(self, meter_provider: Any = None) -> None:
        """Nothing to do: :meth:`__new__` registered the instruments once."""

    #: Set once an SDK is behind the instruments (a provider is never unset).
    _live = False

    def live(self) -> bool:
        """Whether an OpenTelemetry SDK is behind the instruments (a ``MeterProvider``
        was given, or set globally since): until then nothing is worth counting.
        Asked at every moment of every job while no SDK is set."""
        if not self._live:
            self._live = not self.duration.discards()
        return self._live

    def register_instruments(self, meter_provider: Any) -> None:
        meter = meter_provider.get_meter("ojs_kombu")
        self.meter = meter
        self.jobs_enqueued = Tally(meter,
            "ojs.jobs.enqueued", unit="{job}", description="Jobs enqueued")
        self.jobs_completed = Tally(meter,
            "ojs.jobs.completed", unit="{job}", description="Jobs completed successfully")
        self.jobs_failed = Tally(meter,
            "ojs.jobs.failed", unit="{job}", description="Jobs that reached terminal failure")
        self.duration = BufferedHistogram(meter,
            "ojs.jobs.duration_ms", description="Execution time per attempt, in milliseconds",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        self.wait = BufferedHistogram(meter,
            "ojs.jobs.wait_ms", description="Time from enqueued_at to started_at, in "
            "milliseconds", explicit_bucket_boundaries_advisory=WAIT_BUCKETS)
        self.published = Tally(meter,
            "ojs_amqp_messages_published_total", unit="{message}",
            description="Messages published")
        self.consumed = Tally(meter,
            "ojs_amqp_messages_consumed_total", unit="{message}",
            description="Messages consumed")
        self.acked = Tally(meter,
            "ojs_amqp_messages_acked_total", unit="{message}",
            description="Messages acknowledged")
        self.nacked = Tally(meter,
            "ojs_amqp_messages_nacked_total", unit="{message}",
            description="Messages negatively acknowledged")
        self.returned = Tally(meter,
            "ojs_amqp_messages_returned_total", unit="{message}",
            description="Messages returned (Basic.Return)")
        self.reconnections = Tally(meter,
            "ojs_amqp_reconnections_total", unit="{attempt}",
            description="Reconnection attempts")
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
        self.dedup_degraded = Tally(meter,
            "ojs.dedup.degraded", unit="{job}",
            description="Keyed or unique jobs run or retried without the dedup store")
        self.control_refused = Tally(meter,
            "ojs.control.refused", unit="{request}",
            description="CANCEL and INFO requests a worker refused "
                        "(reason: user, no_user_id, reply_to, reply_queue)")
        self._pressure_observed = self._queues_observed = False
        histograms = (self.duration, self.wait, self.confirm_latency)
        # Reports nothing itself: its callback runs on every collection, before the
        # SDK reads its aggregations, and hands them every buffered measurement.
        meter.create_observable_gauge(
            "ojs_kombu.buffered_histograms", callbacks=[_flusher(histograms)],
            description="Flushes ojs_kombu's buffered histograms when metrics are collected")
        _observe_connections(meter)

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
        ``ojs.dead_letter.depth`` (the first readings given win)."""
        if self._queues_observed:
            return
        self._queues_observed = True
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


#: The ``ojs`` transport's connections of this process (:func:`track_connection`).
_CONNECTIONS: weakref.WeakSet[Any] = weakref.WeakSet()


def track_connection(connection: Any) -> None:
    """Count ``connection`` in the AMQP gauges of section 12.1 while it is open.

    ``connection`` is a py-amqp connection (``connected``, ``channels``) whose
    channels tell ``ojs_prefetch_count``, ``ojs_consumed_queues`` and
    ``ojs_unacked()`` (the OJS queue of each unsettled job delivery).
    """
    _CONNECTIONS.add(connection)


def _channels() -> tuple[int, list[Any]]:
    """(open connections, their open channels), read from the exporter's thread."""
    connections = [c for c in list(_CONNECTIONS) if c.connected]
    channels = [channel for c in connections for number, channel in list(c.channels.items())
                if number and channel.is_open]
    return len(connections), channels


def _consumer_readings() -> tuple[dict[str, float], dict[str, float]]:
    """Per consumed OJS queue: unsettled job deliveries, and their share of the prefetch
    window (1.0: the consumer is saturated, the broker holds further messages back)."""
    unacked: dict[str, float] = {}
    utilization: dict[str, float] = {}
    for channel in _channels()[1]:
        counts = dict.fromkeys(getattr(channel, "ojs_consumed_queues", ()), 0)
        for queue in channel.ojs_unacked() if hasattr(channel, "ojs_unacked") else ():
            counts[queue] = counts.get(queue, 0) + 1
        prefetch = getattr(channel, "ojs_prefetch_count", 0)
        for queue, count in counts.items():
            unacked[queue] = unacked.get(queue, 0) + count
            if prefetch:  # per consumer (Basic.Qos global=false); 0: no window
                utilization[queue] = max(utilization.get(queue, 0.0), min(count / prefetch, 1.0))
    return unacked, utilization


def _observe_connections(meter: Any) -> None:
    """The gauges of section 12.1, read from this process's connections when collected."""
    def connections(_options: Any) -> list[metrics.Observation]:
        return [metrics.Observation(_channels()[0])]

    def channels(_options: Any) -> list[metrics.Observation]:
        return [metrics.Observation(len(_channels()[1]))]

    def by_queue(index: int) -> Callable[[Any], list[metrics.Observation]]:
        def observe(_options: Any) -> list[metrics.Observation]:
            readings = _consumer_readings()[index]
            return [metrics.Observation(value, {"queue": q}) for q, value in readings.items()]
        return observe

    for name, callback, unit, description in (
        ("ojs_amqp_connections_active", connections, "{connection}",
         "Open AMQP connections of this process"),
        ("ojs_amqp_channels_active", channels, "{channel}",
         "Open AMQP channels of this process"),
        ("ojs_amqp_messages_unacked", by_queue(0), "{message}",
         "Job deliveries not yet acked or nacked, per consumed queue"),
        ("ojs_amqp_consumer_utilization", by_queue(1), "1",
         "Unacked job deliveries / prefetch count, per consumed queue (0.0-1.0)"),
    ):
        meter.create_observable_gauge(name, callbacks=[callback], unit=unit,
                                      description=description)


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

    __slots__ = ("__weakref__", "_buffer", "_flushing", "_histogram", "_real", "name")

    #: Buffered measurements that make the recording thread flush.
    flush_at = 256

    def __init__(self, meter: Any, name: str, **kwargs: Any) -> None:
        self.name = name
        self._histogram = meter.create_histogram(name, **kwargs)
        self._real = instrument_probe(self._histogram)
        self._buffer: deque[tuple[float, Mapping[str, Any] | None, Any]] = deque()
        self._flushing = threading.Lock()
        _BUFFERED.add(self)

    def record(self, amount: float, attributes: Mapping[str, Any] | None = None) -> None:
        if self.discards():
            return
        buffer = self._buffer
        buffer.append((amount, attributes, get_current()))
        if len(buffer) >= self.flush_at:
            self.flush()

    def discards(self) -> bool:
        """No SDK behind the instrument (the API's no-op, or its proxy while no provider
        is set): the API would drop the value, so there is nothing to buffer or flush,
        and nothing worth computing."""
        histogram = self._real()  # the API's proxy: its SDK instrument
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

    def forget_parent(self) -> None:
        # The parent records what it buffered; a flush lock held by a parent thread
        # that does not exist here would never be released.
        self._buffer = deque()
        self._flushing = threading.Lock()


_BUFFERED: weakref.WeakSet[BufferedHistogram] = weakref.WeakSet()


def _forget_parent_measurements() -> None:
    """A forked process (a prefork pool process) counts its own jobs and connections:
    the parent's are the parent's to report."""
    for histogram in list(_BUFFERED):
        histogram.forget_parent()
    for tally in list(_TALLIES):
        tally.forget_parent()
    _CONNECTIONS.clear()


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

    __slots__ = ("__weakref__", "_counts", "_lock", "name")

    def __init__(self, meter: Any, name: str, *, unit: str = "", description: str = "") -> None:
        self.name = name
        self._counts: dict[tuple[tuple[str, Any], ...], float] = {}
        self._lock = threading.Lock()
        meter.create_observable_counter(name, callbacks=[self._observe], unit=unit,
                                        description=description)
        _TALLIES.add(self)

    def add(self, amount: float, attributes: Mapping[str, Any] | None = None) -> None:
        key = tuple(attributes.items()) if attributes else ()
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + amount

    def _observe(self, _options: Any) -> list[metrics.Observation]:
        with self._lock:
            counts = list(self._counts.items())
        return [metrics.Observation(value, dict(key)) for key, value in counts]

    def forget_parent(self) -> None:
        self._counts = {}
        self._lock = threading.Lock()


_TALLIES: weakref.WeakSet[Tally] = weakref.WeakSet()


def labels(job_type: str, queue: str) -> dict[str, str]:
    return {"job_type": job_type, "queue": queue}
