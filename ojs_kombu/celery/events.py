"""Celery wiring of observation: sinks from config, worker lifecycle, subscriptions, observers.

Moments come from where a job's fate is decided (the transport on publish
and consume, :class:`~ojs_kombu.celery.request.JobRequest` in the worker) and
reach the binding's hook; worker moments from the :class:`WorkerEvents`
consumer bootstep.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from celery import Celery, bootsteps
from celery.worker import state as worker_state
from vine import promise

from ..amqp.broker.connection import connect_on_demand
from ..amqp.broker.entities import JobQueue
from ..events.bus import EventBus, EventFilter, Subscription
from ..events.emitter import JobEvents
from ..events.models import Event, event_source
from ..events.observer import Observer
from ..events.sinks import AMQPSink, BackgroundSink, FileSink, WebhookSink
from ..spec.errors import OJSConfigurationError
from ..spec.naming import TopologyNames
from ..spec.settings import OJSSettings
from .celery_seam import flush_task_events

#: Topic exchange of the AMQP sink (routing key: the event type).
EVENTS_EXCHANGE = "ojs.exchange.events"

Sink = Callable[[Event], Any]


def events_exchange(names: TopologyNames) -> str:
    return f"{names.prefix}{EVENTS_EXCHANGE}"


def sink_from_spec(spec: Any, app: Celery, names: TopologyNames
                   ) -> tuple[Sink, EventFilter | None]:
    """One ``ojs_event_sinks`` entry as a bus subscriber.

    ``"amqp"``; ``"file:/var/log/ojs.jsonl"``; ``"webhook:https://..."``; a
    callable; or a dict with one of the keys ``amqp`` (exchange name or
    ``True``, with ``batch_size`` and ``batch_ms``: events per message and
    milliseconds to collect them, default 500 and 50; ``batch_size=1``: one
    event per message), ``file`` (path), ``webhook`` (URL, with ``secret``,
    ``timeout``, ``max_retries``), ``callback``, and optionally ``filter``
    (``event_types``, ``queues``, ``job_types``, ``sources``).
    """
    if callable(spec):
        return spec, None
    if isinstance(spec, str):
        kind, _, value = spec.partition(":")
        spec = {kind: value or True}
    if not isinstance(spec, Mapping):
        raise OJSConfigurationError(f"ojs_event_sinks entry {spec!r} is not a sink")
    options = dict(spec)
    event_filter = options.pop("filter", None)
    flt = EventFilter(**event_filter) if event_filter else None
    if "callback" in options:
        return options["callback"], flt
    if "amqp" in options:
        exchange = options["amqp"] if isinstance(options["amqp"], str) else events_exchange(names)
        extra = {k: options[k] for k in ("batch_size", "batch_ms") if k in options}
        try:
            return AMQPSink(lambda: connect_on_demand(app.connection_for_write(),
                                                      "the AMQP event sink"),
                            exchange, **extra), flt
        except ValueError as exc:
            raise OJSConfigurationError(f"ojs_event_sinks entry {spec!r}: {exc}") from None
    if "file" in options:
        return FileSink(options["file"]), flt
    if "webhook" in options:
        extra = {k: options[k] for k in ("secret", "timeout", "max_retries") if k in options}
        return WebhookSink(options["webhook"], **extra), flt
    raise OJSConfigurationError(
        f"ojs_event_sinks entry {spec!r}: expected amqp, file, webhook or callback")


def build_events(app: Celery, settings: OJSSettings, names: TopologyNames) -> JobEvents:
    bus = EventBus()
    for spec in settings.event_sinks:
        sink, flt = sink_from_spec(spec, app, names)
        bus.subscribe(sink, flt)
    service = settings.event_service or app.main or "celery"
    instance = f"{socket.gethostname()}-{os.getpid()}"
    return JobEvents(bus, event_source(service, "producers", instance))


def subscribe(app: Celery, callback: Sink, **event_filter: Any) -> Subscription:
    """Call ``callback(event)`` for every event of this process matching the filter.

    Filter keys (section 6.1, AND across keys): ``event_types`` (``"job.*"``
    prefixes), ``queues``, ``job_types``, ``sources``.  OJS events arrive as
    :class:`~ojs_kombu.events.models.Event`; the out-of-catalog ones
    (``backpressure.*``, ``connection.reconnected``, ``consumer.cancelled``) as
    OJS-envelope dicts, and only when ``event_types`` names them.
    """
    flt = EventFilter(**event_filter) if event_filter else None
    return app.amqp.binding.events.bus.subscribe(callback, flt)


def add_observer(app: Celery, observer: Observer) -> Observer:
    """Call ``observer`` at every moment it overrides, after the OJS events and the metrics
    (see :class:`~ojs_kombu.events.observer.Observer`); ``remove_observer`` undoes it."""
    return app.amqp.binding.hook.add(observer)


def remove_observer(app: Celery, observer: Observer) -> None:
    app.amqp.binding.hook.remove(observer)


def close_sinks(bus: EventBus, timeout: float = 5.0) -> None:
    for subscription in bus.subscriptions:
        if isinstance(subscription.callback, BackgroundSink):
            subscription.callback.close(timeout)


#: Jobs this worker process completed (``worker.stopped.jobs_completed``).
completed_jobs = 0
_completed_lock = threading.Lock()


def count_completed() -> None:
    global completed_jobs
    with _completed_lock:
        completed_jobs += 1


class WorkerEvents(bootsteps.StartStopStep):
    """Consumer bootstep: ``worker.started``, periodic ``worker.heartbeat``, ``worker.stopped``."""

    name = "ojs_kombu.worker_events"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._timer: Any = None
        self._started = time.monotonic()
        self._cpu = (time.process_time(), time.monotonic())

    def start(self, parent: Any) -> None:
        binding = parent.app.amqp.binding
        self._observe_queues(parent)
        service = binding.settings.event_service or parent.app.main or "celery"
        binding.events.source = event_source(service, "workers", parent.hostname)
        if not self._announced:  # the consumer restarts on reconnection: announce once
            self._announced = True
            binding.hook.worker_started(parent.hostname, {
                "queues": self._queues(parent),
                "concurrency": max(self._concurrency(parent), 1)})
        # Registered again on every (re)start: on a reconnect Celery 5.5 clears the
        # worker's timer and 5.7 cancels what was registered while connecting; 5.6
        # keeps it (hence the cancel, so that one beat stays).
        self._cancel_heartbeat()
        interval = parent.app.amqp.binding.settings.worker_heartbeat
        if interval and parent.timer is not None:
            self._timer = parent.timer.call_repeatedly(interval, self.heartbeat, (parent,),
                                                       priority=10)
        flush_buffered_task_events_soon(parent)

    def _cancel_heartbeat(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def heartbeat(self, parent: Any) -> None:
        cpu, wall = time.process_time(), time.monotonic()
        cpu_percent = 100 * (cpu - self._cpu[0]) / max(wall - self._cpu[1], 1e-6)
        self._cpu = (cpu, wall)
        parent.app.amqp.binding.hook.worker_heartbeat(parent.hostname, {
            "active_jobs": len(worker_state.active_requests), "queues": self._queues(parent),
            "memory_mb": _rss_mb(), "cpu_percent": round(max(cpu_percent, 0.0), 1)})

    _announced = False

    def stop(self, parent: Any) -> None:
        """The worker shuts down: it stops fetching, active jobs still finish (``worker.quiet``).

        Not on a reconnection, which stops and restarts the consumer too."""
        if worker_state.should_stop is None and worker_state.should_terminate is None:
            return
        parent.app.amqp.binding.hook.worker_quiet(
            parent.hostname, {"active_jobs": len(worker_state.active_requests)})

    def shutdown(self, parent: Any) -> None:
        self._cancel_heartbeat()
        binding = parent.app.amqp.binding
        binding.hook.worker_stopped(parent.hostname, {
            "reason": "shutdown", "jobs_completed": completed_jobs,
            "uptime_ms": round((time.monotonic() - self._started) * 1000)})
        close_sinks(binding.events.bus)

    _observed = False

    def _observe_queues(self, parent: Any) -> None:
        """The queue gauges of section 7.2, read when the metrics are collected."""
        if WorkerEvents._observed:
            return
        WorkerEvents._observed = True
        binding = parent.app.amqp.binding
        reader = QueueDepths(parent.app)
        queues = self._queues(parent)

        def active() -> list[tuple[str, float]]:
            counts = dict.fromkeys(queues, 0.0)
            for request in list(worker_state.active_requests):
                queue = (request.delivery_info or {}).get("routing_key")
                if queue in counts:
                    counts[queue] += 1
            return list(counts.items())

        binding.metrics.observe_queues(
            depth=lambda: reader.depths(queues, binding.names.job_queue),
            active=active,
            dead_letters=lambda: reader.depths(queues, binding.names.dead_letter_queue))

    @staticmethod
    def _queues(parent: Any) -> list[str]:
        return consumed_queues(parent.app)

    @staticmethod
    def _concurrency(parent: Any) -> int:
        pool = getattr(parent, "pool", None)
        return int(getattr(pool, "num_processes", None) or getattr(pool, "limit", None) or 1)


class QueueDepths:
    """Message counts by passive ``Queue.Declare``, on a connection of its own (the metrics
    exporter calls from its own thread)."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._connection: Any = None
        self._lock = threading.Lock()

    def depths(self, queues: list[str], amqp_name: Callable[[str], str]
               ) -> list[tuple[str, float]]:
        with self._lock:
            try:
                if self._connection is None:
                    self._connection = connect_on_demand(self.app.connection_for_read(),
                                                         "queue-depth gauges")
                channel = self._connection.default_channel
                return [(q, float(channel.queue_declare(amqp_name(q), passive=True)
                                  .message_count)) for q in queues]
            except Exception:
                connection, self._connection = self._connection, None
                if connection is not None:
                    connection.release()
                raise


def flush_buffered_task_events_soon(consumer: Any) -> None:
    """Flush the task events Celery buffers through the loop's ``call_soon``, as Celery 5.7
    does.

    Celery 5.5 and 5.6 ask for the flush by adding to the hub's ready set directly,
    from whichever thread sent the event: from the threads pool's threads that wakes
    nothing (and takes no lock), so a job's ``task-succeeded`` and the next job's
    events waited for the loop's next poll (Flower and ``celery events`` saw them
    late, or the worker's shutdown sent them).  ``call_soon`` wakes the loop
    (:func:`ojs_kombu.amqp.wire.kombu_seam.wake_on_foreign_call_soon` on kombu 5.5/5.6),
    and :func:`~.celery_seam.flush_task_events` keeps what a pool thread buffers
    during the flush.  Called after each (re)start of the consumer: its event
    dispatcher is new then."""
    hub, dispatcher = getattr(consumer, "hub", None), consumer.event_dispatcher
    if hub is None or dispatcher is None or dispatcher.on_send_buffered is None:
        return
    flush = promise(flush_task_events, (dispatcher,))  # one pending flush in the ready set
    dispatcher.on_send_buffered = lambda: hub.call_soon(flush)


def consumed_queues(app: Celery) -> list[str]:
    """The OJS queues this worker consumes."""
    consume_from = app.amqp.queues.consume_from or {}
    return sorted(q.ojs_queue for q in consume_from.values() if isinstance(q, JobQueue))


def _rss_mb() -> float | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None
