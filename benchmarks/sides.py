"""The one place where every contender of the benchmarks is set up.

Plain Celery and ojs_kombu apps (:func:`celery_app`: the same Celery app, the
ojs side with the ``ojs://`` URL and ``ojs_kombu.install(app)`` its README
shows) and the raw py-amqp connection (:func:`connect`) are built here and
nowhere else: every part, every worker app module (``*_app.py``, loaded by
``celery -A``) and every publisher imports them, so a setting that changes one
side changes it in every table.  The in-process sides of the throughput, typed
publish, events and cluster parts are :class:`Side` objects
(:func:`make_plain_side`, :func:`make_ojs_side`).

Dramatiq's broker is built in ``dramatiq_side.py`` alone (its publisher and its
worker module both take it from there): the Dramatiq worker must not load
Celery, whose modules would count in the RSS the latency part measures.
This module imports no other benchmark module: every part stands above it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import amqp
from celery import Celery
from celery.app.task import Task
from kombu import Exchange, Queue
from kombu.utils.url import parse_url

import ojs_kombu

DEFAULT_BROKER = "amqp://guest:guest@127.0.0.1:5672//"
#: The no-op of the drains, the same name on every side (in process and in the workers).
TASK_NAME = "bench.noop"
TASK_ARGS = (42, "benchmark")
WARMUP = 100
#: The in-process worker of the drains.
POOL = "threads"
CONCURRENCY = 4
#: Jobs per batch of ``enqueue_many`` (``--batch-size``).
BATCH_SIZE = 1000
#: ``x-max-priority`` of the ojs_kombu sides' job queues (``ojs_max_priority``).
BENCH_MAX_PRIORITY = 10
#: ojs_kombu publishing without waiting for each confirm (issue 39).
DEFERRED_CONF = {"ojs_publish_confirms": "deferred"}
#: ``--drain-work-ms``: seconds each drained job sleeps (a call to another service).
DRAIN_WORK_S = [0.0]


# -- the apps, the brokers, the connections -------------------------------


def celery_app(name: str, broker_url: str, *, ojs_prefix: str | None = None,
               set_as_current: bool = False) -> Celery:
    """Plain Celery on ``broker_url``; with ``ojs_prefix``, ojs_kombu as its README sets
    an app up (the ``ojs://`` URL, ``ojs_kombu.install(app)``), under that prefix (``""``:
    the default names)."""
    if ojs_prefix is None:
        return Celery(name, broker=broker_url, set_as_current=set_as_current)
    app = Celery(name, broker=ojs_url(broker_url), set_as_current=set_as_current)
    ojs_kombu.install(app)
    if ojs_prefix:
        app.conf.ojs_prefix = ojs_prefix
    # the job queues the figures were measured on: priority queues (AMQP-030), which
    # ojs_kombu declared by default before priorities became what the app asks for
    app.conf.ojs_max_priority = BENCH_MAX_PRIORITY
    return app


def common_conf(app: Celery, queue: str, max_priority: int | None = None,
                quorum: bool = False) -> None:
    """Settings every drain side shares, in process and in the worker subprocesses:
    acks_late (ojs_kombu forces it), no results, no pidbox.

    ``max_priority`` (plain Celery only) declares ``queue`` with that
    ``x-max-priority``, the broker queue type of ojs_kombu's default job queues;
    ``quorum`` (plain Celery only) declares it a quorum queue, as Celery's docs
    show (the ojs side says ``ojs_queue_defaults = {"type": "quorum"}`` instead).
    """
    arguments: dict[str, Any] = {}
    if max_priority:
        arguments["x-max-priority"] = max_priority
    if quorum:
        arguments["x-queue-type"] = "quorum"
    if arguments:
        app.conf.task_queues = [Queue(queue, Exchange(queue), routing_key=queue,
                                      queue_arguments=arguments)]
    app.conf.update(
        task_default_queue=queue,
        task_acks_late=True,
        task_ignore_result=True,
        result_backend=None,
        worker_enable_remote_control=False,  # no pidbox queues/exchanges left behind
        broker_connection_retry_on_startup=True,
    )


def open_record(path: str | None) -> int | None:
    """The record file a worker's jobs append their lines to (``None``: the publishing
    side, where nothing runs).  One short ``O_APPEND`` write per line, so lines from
    the pool's processes and threads never interleave."""
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600) if path else None


def connect(url: str, *, vhost: str | None = None) -> amqp.Connection:
    """A connected py-amqp connection to ``url`` (``vhost`` instead of its own), outside
    every Celery app."""
    parts = parse_url(url)
    connection = amqp.Connection(
        host=host(url), userid=parts.get("userid") or "guest",
        password=parts.get("password") or "guest",
        virtual_host=vhost or parts.get("virtual_host") or "/", connect_timeout=5,
    )
    connection.connect()
    return connection


def host(broker_url: str) -> str:
    """``host:port`` of a broker URL, for messages that must not show the password."""
    parts = parse_url(broker_url)
    return f"{parts.get('hostname') or '127.0.0.1'}:{parts.get('port') or 5672}"


def ojs_url(broker_url: str) -> str:
    """``ojs://`` for each ``amqp://`` URL of ``broker_url`` (a ``;`` list: failover)."""
    converted = []
    for url in broker_url.split(";"):
        scheme, sep, rest = url.partition("://")
        if not sep or scheme not in ("amqp", "pyamqp", "ojs"):
            raise SystemExit(f"--broker must be an amqp:// URL, got {broker_url!r}")
        converted.append(f"ojs://{rest}")
    return ";".join(converted)


# -- the in-process sides -------------------------------------------------


class DrainRecorder:
    """Thread-safe first-start / last-completion clock shared by the no-op task's threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset(0)

    def reset(self, expected: int) -> None:
        with self._lock:
            self.expected = expected
            self.count = 0
            self.first_start: float | None = None
            self.last_end: float | None = None
            self.done = threading.Event()

    def record(self, started: float) -> None:
        with self._lock:
            if self.first_start is None or started < self.first_start:
                self.first_start = started
            self.count += 1
            self.last_end = time.perf_counter()
            if self.count >= self.expected:
                self.done.set()

    def elapsed(self) -> float:
        """Seconds from the first task start to the last task completion."""
        if self.first_start is None or self.last_end is None:
            raise RuntimeError("no job has run yet")
        return self.last_end - self.first_start


@dataclass
class Side:
    """One contender: its app, its no-op task and every broker entity it creates."""

    label: str
    app: Celery
    task: Task
    recorder: DrainRecorder
    celery_queue: str
    amqp_queue: str
    declare: Callable[[], None]
    dead_letter_queue: str | None = None
    queues: list[str] = field(default_factory=list)
    exchanges: list[str] = field(default_factory=list)
    #: Every queue and exchange whose name starts with it is the side's (OJS prefix).
    sweep_prefix: str | None = None
    #: Plain Celery: ``x-max-priority`` of its queue (``None``: a classic queue).
    max_priority: int | None = None
    #: Its job queue is a quorum queue (the prefork worker subprocess declares it so too).
    quorum: bool = False
    #: Plain Celery on its default ``task_acks_late=False`` (acks on receipt).
    acks_early: bool = False


def _register_noop(app: Celery, recorder: DrainRecorder) -> Task:
    """Register the no-op on ``app`` only (``shared=False``): a shared task would reach
    the other app too and tick the wrong recorder."""

    @app.task(name=TASK_NAME, ignore_result=True, shared=False)
    def noop(*_args: Any) -> None:
        started = time.perf_counter()
        if DRAIN_WORK_S[0]:
            time.sleep(DRAIN_WORK_S[0])
        recorder.record(started)

    return noop


def make_plain_side(broker_url: str, pid: int, *, confirm: bool = True,
                    max_priority: int | None = None, quorum: bool = False,
                    acks_early: bool = False) -> Side:
    """Plain Celery over py-amqp, publishing with or without ``confirm_publish``
    (both variants use the same queue); with ``max_priority``, on a queue of its own
    declared with that ``x-max-priority``, the broker queue type ojs_kombu's job queues
    have by default; with ``quorum``, on a quorum queue of its own."""
    app = celery_app("bench_plain", broker_url)
    queue = (f"bench-plainpq-{pid}" if max_priority else
             f"bench-plainqq-{pid}" if quorum else f"bench-plain-{pid}")
    common_conf(app, queue, max_priority, quorum)
    if acks_early:  # Celery's own default, where common_conf says acks_late
        app.conf.task_acks_late = False
    if confirm:
        app.conf.broker_transport_options = {"confirm_publish": True}
    recorder = DrainRecorder()

    def declare() -> None:
        with app.connection_for_write() as connection:
            app.amqp.queues[queue](connection.default_channel).declare()

    label = "plain Celery" if confirm else "plain Celery (no confirms)"
    if max_priority:
        label += f" (x-max-priority={max_priority})"
    if quorum:
        label += " (quorum queue)"
    if acks_early:
        label += " (acks on receipt)"
    return Side(label, app, _register_noop(app, recorder), recorder, queue, queue,
                declare, queues=[queue], exchanges=[queue], max_priority=max_priority,
                quorum=quorum, acks_early=acks_early)


def make_ojs_side(broker_url: str, pid: int, *, prefix: str | None = None,
                  label: str = "ojs_kombu", conf: dict[str, Any] | None = None) -> Side:
    """The ojs_kombu side; ``conf`` adds settings (read when ``app.amqp.binding`` is built,
    just below)."""
    app = celery_app("bench_ojs", broker_url, ojs_prefix=prefix or f"bench{pid}")
    queue = "bench"
    common_conf(app, queue)
    app.conf.update(conf or {})
    recorder = DrainRecorder()
    names = app.amqp.binding.names
    return Side(
        label, app, _register_noop(app, recorder), recorder, queue,
        names.job_queue(queue), lambda: ojs_kombu.declare_topology(app, [queue]),
        dead_letter_queue=names.dead_letter_queue(queue),
        queues=[names.job_queue(queue), names.dead_letter_queue(queue)],
        exchanges=[names.direct_exchange, names.dlx_exchange], sweep_prefix=names.prefix,
        quorum=(conf or {}).get("ojs_queue_defaults", {}).get("type") == "quorum",
    )
