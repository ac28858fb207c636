"""ojs_kombu vs plain Celery and Dramatiq on one local RabbitMQ: publish, drain, traced
publish, events, scheduling and a poison storm.

Run from the repository root::

    python benchmarks/run.py [--jobs N] [--json PATH] [--only PART]

The throughput part publishes with plain Celery (without and with
``confirm_publish``), ojs_kombu (``apply_async`` and batch ``enqueue_many``)
and Dramatiq (without and with ``confirm_delivery``), all in this one process
against the same broker, and drains with plain Celery and ojs_kombu using the
threads pool (in-process worker) and the prefork pool (``prefork_drain.py``,
a worker subprocess), with the same task, arguments, pool and concurrency on
both sides; ``report.py`` holds the comparisons and the targets.  The traced
publish part (``traced_publish.py``) measures single confirmed ``apply_async``
of ojs_kombu and plain Celery with OpenTelemetry's Celery instrumentation on
and off, one subprocess per side (``publish_side.py``).  The events part
(``events_scenario.py``) measures the same two numbers for ojs_kombu with OJS
events (AMQP sink) and OpenTelemetry metrics off and on, and counts the events
that reached the events exchange.  The scheduling part (``scheduling.py``)
runs one worker subprocess per side, to measure where delayed jobs wait and
how late they start.  The poison storm (``poison_storm.py``) floods one worker
subprocess per pool and side with messages it cannot run and times how fast
they reach the dead-letter queue, whether the worker still answers ``ping`` and
how fast it exits after SIGTERM; its backlog form (``storm_backlog.py``) queues
jobs of an unknown type before one worker starts and times their dead-lettering.
The green part (``green_drain.py``) drains I/O-bound jobs with the gevent and
eventlet pools, a worker subprocess per pool and side.
The cluster drain (``cluster_drain.py``, only with ``--only cluster_drain``)
starts a three-node RabbitMQ cluster of its own and drains a quorum queue on it
with both sides.  Missed targets are reported, never fatal: the exit code
is 0 on success, 2 when RabbitMQ is unreachable and 1 on any other error.  See
benchmarks/README.rst for what each number means.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import amqp
import celery
import dramatiq
import kombu
import pika
from celery import Celery
from celery.app.task import Task
from celery.contrib.testing.worker import start_worker
from kombu.utils.url import parse_url

import ojs_kombu
from ojs_kombu.celery.events import events_exchange

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when imported, not run
import cluster_drain
import dedup_drain
import dlq_scale
import events_scenario
import green_drain
import poison_storm
import prefork_drain
import publish_phases
import report
import scale
import scheduling
import storm_backlog
import traced_publish
import typed_publish
from drain_app import TASK_NAME, common_conf
from dramatiq_side import DramatiqPublisher, queues_of
from raw_side import RawConfirmPublisher

DEFAULT_BROKER = "amqp://guest:guest@127.0.0.1:5672//"
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "latest.json"
TASK_ARGS = (42, "benchmark")
WARMUP = 100
POOL = "threads"
CONCURRENCY = 4
#: Jobs per batch of ``enqueue_many`` (``--batch-size``).
BATCH_SIZE = 1000
PARTS = ("throughput", "typed_publish", "traced_publish", "publish_phases", "events",
         "schedule", "storm",
         "storm_backlog", "green", "dedup", "scale", "dlq_scale", "latency_memory")
#: Parts that run only when ``--only`` names them (they start brokers of their own).
EXTRA_PARTS = ("cluster_drain", "scale_cluster")


# -- broker administration (plain py-amqp, outside both Celery apps) -------


class Broker:
    """A py-amqp connection for purging, counting and deleting benchmark entities.

    Kept apart from both Celery apps so administration never shows up in
    their connection pools or in the measured code paths.
    """

    def __init__(self, url: str) -> None:
        self.host = _host(url)
        self.vhost = parse_url(url).get("virtual_host") or "/"
        self.connection = connect(url)
        self.channel = self.connection.channel()

    @property
    def server_version(self) -> str:
        raw = self.connection.server_properties.get("version", "")
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    def _retry(self, call: Callable[[amqp.Channel], Any]) -> Any:
        """Run ``call`` on the admin channel; a 404 closes it, so reopen and give ``None``."""
        try:
            return call(self.channel)
        except amqp.exceptions.NotFound:
            self.channel = self.connection.channel()
            return None

    def purge(self, queue: str) -> None:
        self._retry(lambda ch: ch.queue_purge(queue))

    def depth(self, queue: str) -> int | None:
        """Ready messages in ``queue``; ``None`` if it does not exist."""
        declared = self._retry(lambda ch: ch.queue_declare(queue, passive=True))
        return None if declared is None else int(declared.message_count)

    def delete(self, queues: list[str], exchanges: list[str]) -> None:
        """Delete the given entities (those that do not exist are skipped)."""
        for queue in queues:
            self._retry(lambda ch, q=queue: ch.queue_delete(q))
        for exchange in exchanges:
            self._retry(lambda ch, e=exchange: ch.exchange_delete(e))

    def delete_side(self, side: Side) -> None:
        """What ``side`` declared: the names it knows, plus (with ``rabbitmqctl``) every queue
        and exchange under its OJS prefix, e.g. queues a worker declared on its own."""
        prefix = side.sweep_prefix
        scheduling.delete_swept(self, self.vhost, side.queues, side.exchanges,
                                (lambda name: name.startswith(prefix)) if prefix else None)

    def close(self) -> None:
        with suppress(Exception):
            self.connection.close()


# -- the two sides --------------------------------------------------------


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


#: ``--drain-work-ms``: seconds each drained job sleeps (a call to another service).
DRAIN_WORK_S = [0.0]


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
    app = Celery("bench_plain", broker=broker_url, set_as_current=False)
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
    app = Celery("bench_ojs", broker=_ojs_url(broker_url), set_as_current=False)
    ojs_kombu.install(app)
    queue = "bench"
    common_conf(app, queue)
    app.conf.ojs_prefix = prefix or f"bench{pid}"
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


def connect(url: str) -> amqp.Connection:
    """A connected py-amqp connection to ``url``, outside every Celery app."""
    parts = parse_url(url)
    connection = amqp.Connection(
        host=_host(url), userid=parts.get("userid") or "guest",
        password=parts.get("password") or "guest",
        virtual_host=parts.get("virtual_host") or "/", connect_timeout=5,
    )
    connection.connect()
    return connection


def _host(broker_url: str) -> str:
    """``host:port`` of a broker URL, for messages that must not show the password."""
    parts = parse_url(broker_url)
    return f"{parts.get('hostname') or '127.0.0.1'}:{parts.get('port') or 5672}"


def _ojs_url(broker_url: str) -> str:
    """``ojs://`` for each ``amqp://`` URL of ``broker_url`` (a ``;`` list: failover)."""
    converted = []
    for url in broker_url.split(";"):
        scheme, sep, rest = url.partition("://")
        if not sep or scheme not in ("amqp", "pyamqp"):
            raise SystemExit(f"--broker must be an amqp:// URL, got {broker_url!r}")
        converted.append(f"ojs://{rest}")
    return ";".join(converted)


# -- measurements ---------------------------------------------------------


@dataclass
class PublishResult:
    jobs_per_s: float
    seconds: float
    p50_ms: float
    p99_ms: float


@dataclass
class DrainResult:
    jobs_per_s: float
    seconds: float
    left_in_queue: int | None
    dead_lettered: int | None
    #: In-process drains: CPU time of the whole benchmark process (every thread) from
    #: just before the worker starts until the last job ran, per job, in µs (worker
    #: start-up included).  Steadier than jobs/s on a machine whose speed drifts.
    cpu_us_per_job: float | None = None


Result = PublishResult | DrainResult


def publish(side: Side, n: int) -> list[float]:
    """``n`` sequential ``apply_async`` calls; returns each call's latency in seconds."""
    apply_async, clock = side.task.apply_async, time.perf_counter
    latencies: list[float] = []
    for _ in range(n):
        started = clock()
        apply_async(TASK_ARGS)
        latencies.append(clock() - started)
    return latencies


#: ojs_kombu publishing without waiting for each confirm (issue 39).
DEFERRED_CONF = {"ojs_publish_confirms": "deferred"}


def publish_deferred(side: Side, n: int) -> list[float]:
    """:func:`publish` on a side with :data:`DEFERRED_CONF`, then
    ``ojs_kombu.flush_confirms()``: the block's time includes every confirm (the calls'
    latencies do not; the flush is the last call's)."""
    latencies = publish(side, n)
    started = time.perf_counter()
    ojs_kombu.flush_confirms()
    latencies[-1] += time.perf_counter() - started
    return latencies


def publish_batches(side: Side, n: int, size: int) -> list[float]:
    """``n`` jobs as ``enqueue_many`` calls of ``size`` signatures; each call's latency.

    Building the signatures is inside the loop (so in jobs/s) but outside the
    per-call latency.
    """
    app, signature, clock = side.app, side.task.s, time.perf_counter
    latencies: list[float] = []
    for done in range(0, n, size):
        jobs = [signature(*TASK_ARGS) for _ in range(min(size, n - done))]
        started = clock()
        ojs_kombu.enqueue_many(app, jobs)
        latencies.append(clock() - started)
    return latencies


def warm_up(side: Side, broker: Broker) -> None:
    """Declare the queue, open the producer connection and fill caches, then purge."""
    side.declare()
    publish(side, WARMUP)
    broker.purge(side.amqp_queue)


def measure_publish(side: Side, broker: Broker, n: int) -> PublishResult:
    """Jobs/s over the whole loop (client CPU and broker confirm round trip alike).

    The queue is purged before and after so both sides publish into an empty queue.
    """
    return measure_calls(lambda k: publish(side, k), side.amqp_queue, broker, n)


def measure_calls(send: Callable[[int], list[float]], queue: str, broker: Broker,
                  n: int) -> PublishResult:
    """Time ``send(n)`` (which returns per-call latencies) into the purged ``queue``."""
    seconds, latencies = time_block(send, queue, broker, n)
    return publish_result(n, seconds, latencies)


def time_block(send: Callable[[int], list[float]], queue: str, broker: Broker,
               n: int) -> tuple[float, list[float]]:
    """Seconds ``send(n)`` took into the purged ``queue``, and its per-call latencies."""
    broker.purge(queue)
    started = time.perf_counter()
    latencies = send(n)
    seconds = time.perf_counter() - started
    broker.purge(queue)
    return seconds, latencies


def publish_result(n: int, seconds: float, latencies: list[float]) -> PublishResult:
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return PublishResult(n / seconds, seconds, cuts[49] * 1e3, cuts[98] * 1e3)


def interleaved_publishes(
    publishers: dict[str, tuple[Callable[[int], list[float]], str, int]], broker: Broker,
    blocks: int, forward: bool, round_label: str,
) -> tuple[dict[str, PublishResult], list[list[str]]]:
    """Every publish scenario, each cut into ``blocks`` blocks run in turns.

    Block ``b`` runs every scenario once, in an order rotated by one per block
    (and reversed on odd rounds), so a slow patch of the shared machine (the
    broker's disk flushes dominate confirmed publishes) lands on every
    contender alike instead of on whichever ran during it.  A scenario's rate
    is its jobs over the sum of its blocks' times.
    """
    keys = list(publishers)
    sizes = {key: report.block_sizes(publishers[key][2], blocks) for key in keys}
    spent = dict.fromkeys(keys, 0.0)
    latencies: dict[str, list[float]] = {key: [] for key in keys}
    orders = report.block_orders(keys, blocks, forward)
    for b, order in enumerate(orders):
        for key in order:
            if b >= len(sizes[key]):
                continue
            _progress(f"throughput: {round_label}, block {b + 1}/{len(orders)}, "
                      f"{report.BY_KEY[key].label}")
            send, queue, _n = publishers[key]
            seconds, lat = time_block(send, queue, broker, sizes[key][b])
            spent[key] += seconds
            latencies[key] += lat
    results = {key: publish_result(publishers[key][2], spent[key], latencies[key])
               for key in orders[0]}
    return results, orders


def filler(side: Side) -> Callable[[int], None]:
    """A ``fill`` that queues with ``side``'s confirmed ``apply_async`` (a side that
    publishes without confirms fills through another on the same queue)."""
    def fill(n: int) -> None:
        publish(side, n)
    return fill


def measure_drain(side: Side, broker: Broker, n: int, timeout: float, *,
                  job_ids: list[str] | None = None,
                  before_start: Callable[[], None] | None = None,
                  when_done: Callable[[], None] | None = None,
                  fill: Callable[[int], None] | None = None) -> DrainResult:
    """Fill the queue with no worker, then time one worker from first start to last end.

    The events part passes ``job_ids`` (filled with the prefilled jobs' ids),
    ``before_start`` (called before the worker starts, the recorder reset) and
    ``when_done`` (called after the last job ran, the worker still running); none
    of them is timed.  ``fill`` replaces the confirmed ``apply_async`` calls that
    fill the queue (the cluster drain fills in batches).
    """
    broker.purge(side.amqp_queue)
    if fill is not None:
        fill(n)
    elif job_ids is None:
        publish(side, n)
    else:
        job_ids.extend(side.task.apply_async(TASK_ARGS).id for _ in range(n))
    queued = broker.depth(side.amqp_queue)
    if queued != n:
        raise RuntimeError(f"{side.label}: expected {n} messages in {side.amqp_queue}, "
                           f"found {queued}")
    side.recorder.reset(n)
    if before_start is not None:
        before_start()
    cpu_started = time.process_time()
    with start_worker(side.app, pool=POOL, concurrency=CONCURRENCY, perform_ping_check=False,
                      queues=[side.celery_queue], shutdown_timeout=30):
        if not side.recorder.done.wait(timeout):
            raise RuntimeError(f"{side.label}: only {side.recorder.count}/{n} jobs ran "
                               f"within {timeout:.0f}s")
        cpu = time.process_time() - cpu_started
        if when_done is not None:
            when_done()
    seconds = side.recorder.elapsed()
    dead = broker.depth(side.dead_letter_queue) if side.dead_letter_queue else None
    return DrainResult(n / seconds, seconds, broker.depth(side.amqp_queue), dead,
                       cpu * 1e6 / n)


def measure_prefork_drain(side: Side, broker: Broker, n: int, timeout: float, workdir: Path,
                          name: str, *, fill: Callable[[int], None] | None = None,
                          started: Callable[[int], None] | None = None,
                          when_done: Callable[[], None] | None = None) -> DrainResult:
    """As :func:`measure_drain`, with a ``prefork`` worker subprocess (``prefork_drain``);
    ``started`` gets the worker's pid."""
    broker.purge(side.amqp_queue)
    if fill is not None:
        fill(n)
    else:
        publish(side, n)
    queued = broker.depth(side.amqp_queue)
    if queued != n:
        raise RuntimeError(f"{side.label}: expected {n} messages in {side.amqp_queue}, "
                           f"found {queued}")
    seconds = prefork_drain.drain(
        label=side.label, broker_url=side.app.conf.broker_url, queue=side.celery_queue,
        ojs_prefix=side.app.conf.get("ojs_prefix"), n=n, timeout=timeout, workdir=workdir,
        name=name, max_priority=side.max_priority, ojs_acks=side.app.conf.get("ojs_acks"),
        quorum=side.quorum, acks_early=side.acks_early, work_ms=DRAIN_WORK_S[0] * 1000,
        started=started, when_done=when_done)
    dead = broker.depth(side.dead_letter_queue) if side.dead_letter_queue else None
    return DrainResult(n / seconds, seconds, broker.depth(side.amqp_queue), dead)


# -- reporting ------------------------------------------------------------


def summarize(results: list[Result] | list[dict[str, Any]]) -> dict[str, float]:
    """Median of every float field over the rounds (counters stay in the per-round data)."""
    rows = [r if isinstance(r, dict) else asdict(r) for r in results]
    return {k: statistics.median(row[k] for row in rows)
            for k, v in rows[0].items() if isinstance(v, float)}


def render(results: dict[str, dict[str, Any]]) -> str:
    """The throughput tables, the traced publish table, the events tables, the scheduling
    table, the storm table, then the green table (of the parts run)."""
    tables: list[list[str]] = []
    if "throughput" in results:
        tp = results["throughput"]
        tables.append(report.render(tp["medians"], tp["jobs"], tp["settings"]["batch_size"]))
    if "typed_publish" in results:
        tables.append(typed_publish.render(results["typed_publish"]))
    if "traced_publish" in results:
        tables.append(traced_publish.render(results["traced_publish"]))
    if "publish_phases" in results:
        tables.append(publish_phases.render(results["publish_phases"]))
    if "events" in results:
        tables.append(events_scenario.render(results["events"]))
    if "schedule" in results:
        tables.append(scheduling.render(results["schedule"]))
    if "storm" in results:
        tables.append(poison_storm.render(results["storm"]))
    if "storm_backlog" in results:
        tables.append(storm_backlog.render(results["storm_backlog"]))
    if "green" in results:
        tables.append(green_drain.render(results["green"]))
    if "dedup" in results:
        tables.append(dedup_drain.render(results["dedup"]))
    if "scale" in results:
        tables.append(scale.render(results["scale"]))
    if "dlq_scale" in results:
        tables.append(dlq_scale.render(results["dlq_scale"]))
    if "latency_memory" in results:
        import latency_memory

        tables.append(latency_memory.render(results["latency_memory"]))
    if "cluster_drain" in results:
        tables.append(cluster_drain.render(results["cluster_drain"]))
    if "scale_cluster" in results:
        tables.append(scale.render(results["scale_cluster"]))
    return "\n\n".join("\n".join(table) for table in tables)


def _command(*argv: str) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else None


def machine_info(broker: Broker) -> dict[str, Any]:
    """Enough context to compare results across machines and commits."""
    repo = Path(__file__).resolve().parent.parent
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "rabbitmq": _command("rabbitmqctl", "version") or broker.server_version,
        "celery": celery.__version__,
        "kombu": kombu.__version__,
        "amqp": amqp.__version__,
        "dramatiq": dramatiq.__version__,
        "pika": pika.__version__,
        "ojs_kombu": ojs_kombu.__version__,
        "git": _command("git", "-C", str(repo), "describe", "--always", "--dirty"),
    }


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")


# -- main -----------------------------------------------------------------


@contextmanager
def sides(broker: Broker, broker_url: str
          ) -> Iterator[tuple[Side, Side, Side, Side, Side, Side]]:
    """Plain Celery with and without confirms (without: on all its defaults, acks on
    receipt too), plain Celery on a priority queue,
    ojs_kombu, ojs_kombu with ``ojs_acks="multiple"`` (drains only) and ojs_kombu on a
    classic queue (publishes only); on exit their connections close and every
    entity they made is deleted."""
    pid = os.getpid()
    made: list[Side] = []
    try:
        made.append(make_plain_side(broker_url, pid))
        # Celery on its defaults: no confirms, acks on receipt (the drains' first reference)
        made.append(make_plain_side(broker_url, pid, confirm=False, acks_early=True))
        made.append(make_ojs_side(broker_url, pid))
        # The same x-max-priority as the ojs_kombu job queue (AMQP-030 default).
        priority = made[2].app.amqp.binding.declare_arguments(made[2].celery_queue)[
            "x-max-priority"]
        made.append(make_plain_side(broker_url, pid, max_priority=priority))
        made.append(make_ojs_side(broker_url, pid, prefix=f"bench{pid}m",
                                  label="ojs_kombu ojs_acks=multiple",
                                  conf={"ojs_acks": "multiple"}))
        # The queue type Dramatiq declares: no x-max-priority.
        made.append(make_ojs_side(broker_url, pid, prefix=f"bench{pid}c",
                                  label="ojs_kombu classic queue",
                                  conf={"ojs_max_priority": None}))
        yield made[0], made[1], made[3], made[2], made[4], made[5]
    finally:
        for side in made:
            side.app.close()
            broker.delete_side(side)


@contextmanager
def deferred_side(broker: Broker, broker_url: str, classic: bool = False) -> Iterator[Side]:
    """ojs_kombu with ``ojs_publish_confirms="deferred"`` (``classic``: on a job queue
    without ``x-max-priority``, as plain Celery's); deleted on exit."""
    conf: dict[str, Any] = {**DEFERRED_CONF, "ojs_max_priority": None} if classic \
        else DEFERRED_CONF
    side = make_ojs_side(broker_url, os.getpid(),
                         prefix=f"bench{os.getpid()}{'dc' if classic else 'd'}",
                         label="ojs_kombu deferred confirms", conf=conf)
    try:
        yield side
    finally:
        side.app.close()
        broker.delete_side(side)


@contextmanager
def dramatiq_publishers(broker: Broker, broker_url: str, queue: str
                        ) -> Iterator[tuple[DramatiqPublisher, DramatiqPublisher]]:
    """Dramatiq without and with ``confirm_delivery`` on ``queue``; on exit their
    connections close and the queue, its ``.DQ`` and its ``.XQ`` are deleted."""
    made: list[DramatiqPublisher] = []
    try:
        made.append(DramatiqPublisher(broker_url, queue, confirm=False))
        made.append(DramatiqPublisher(broker_url, queue, confirm=True))
        yield made[0], made[1]
    finally:
        for publisher in made:
            publisher.close()
        broker.delete(queues_of(queue), [])


@contextmanager
def raw_publisher(broker: Broker, broker_url: str, ojs: Side) -> Iterator[RawConfirmPublisher]:
    """A raw py-amqp publisher of a copy of one ``ojs`` job (read back from its queue)."""
    broker.purge(ojs.amqp_queue)
    ojs.task.apply_async(TASK_ARGS)
    message = broker.channel.basic_get(ojs.amqp_queue, no_ack=True)
    if message is None:
        raise RuntimeError(f"{ojs.label}: the job published for the raw publisher is not "
                           f"in {ojs.amqp_queue}")
    names = ojs.app.amqp.binding.names
    body = message.body  # py-amqp decodes a body that declares its content_encoding
    if isinstance(body, str):
        body = body.encode(message.properties.get("content_encoding") or "utf-8")
    publisher = RawConfirmPublisher(connect(broker_url), names.direct_exchange,
                                    ojs.celery_queue, bytes(body), dict(message.properties))
    try:
        yield publisher
    finally:
        publisher.close()


@contextmanager
def _workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ojs-bench-drain-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run(broker: Broker, args: argparse.Namespace) -> dict[str, Any]:
    """The selected parts in ``PARTS`` order, throughput first, green drains last; the
    results keyed by part."""
    results: dict[str, Any] = {}
    if "throughput" in args.parts:
        results["throughput"] = run_throughput(broker, args)
    if "typed_publish" in args.parts:
        results["typed_publish"] = run_typed_publish(broker, args)
    if "traced_publish" in args.parts:
        traced = traced_publish.Settings(jobs=args.jobs, rounds=args.rounds, blocks=args.blocks,
                                         timeout_s=args.timeout)
        results["traced_publish"] = traced_publish.run(broker, args.broker, traced,
                                                       log=_progress)
    if "publish_phases" in args.parts:
        results["publish_phases"] = publish_phases.run_part(
            args.broker, args.jobs, max(args.rounds, 3), log=_progress)
    if "events" in args.parts:
        results["events"] = run_events(broker, args)
    if "schedule" in args.parts:
        settings = scheduling.Settings(
            memory_jobs=args.schedule_jobs, settle_s=args.settle,
            countdown_range=args.schedule_range,
            lateness_jobs=args.lateness_jobs, grace_s=args.lateness_grace,
            batch=args.schedule_batch)
        results["schedule"] = scheduling.run(broker, args.broker, _ojs_url(args.broker),
                                             settings, log=_progress)
    if "storm" in args.parts:
        storm = poison_storm.Settings(jobs=args.storm_jobs, pools=args.storm_pools,
                                      timeout_s=args.storm_timeout)
        results["storm"] = poison_storm.run(broker, lambda: connect(args.broker), args.broker,
                                            _ojs_url(args.broker), storm, log=_progress)
    if "storm_backlog" in args.parts:
        results["storm_backlog"] = storm_backlog.run(
            broker, lambda: connect(args.broker), args.broker, _ojs_url(args.broker),
            jobs=args.storm_jobs, timeout_s=args.storm_timeout, rounds=max(args.rounds, 3),
            log=_progress)
    if "green" in args.parts:
        green = green_drain.Settings(jobs=args.green_jobs, rounds=args.rounds,
                                     timeout_s=args.timeout)
        results["green"] = green_drain.run(broker, args.broker, _ojs_url(args.broker), green,
                                           log=_progress)
    if "dedup" in args.parts:
        dedup = dedup_drain.Settings(jobs=args.dedup_jobs, rounds=max(args.rounds, 3),
                                     timeout_s=args.timeout, work_ms=args.dedup_work_ms)
        results["dedup"] = dedup_drain.run(broker, args.broker, _ojs_url(args.broker), dedup,
                                           log=_progress)
    if "scale" in args.parts:
        results["scale"] = scale.run(args.broker, scale.Settings(counts=args.scale_queues),
                                     log=_progress)
    if "dlq_scale" in args.parts:
        results["dlq_scale"] = dlq_scale.run(args.broker, args.dlq_sizes, log=_progress)
    if "latency_memory" in args.parts:
        import latency_memory  # imports this module: only once it is loaded

        results["latency_memory"] = latency_memory.run_part(
            args.broker, args.latency_jobs, args.memory_jobs, log=_progress)
    if "cluster_drain" in args.parts:
        results["cluster_drain"] = run_cluster_drain(args)
    if "scale_cluster" in args.parts:
        results["scale_cluster"] = scale.run_cluster(scale.Settings(counts=args.scale_queues),
                                                     log=_progress)
    return results


def run_cluster_drain(args: argparse.Namespace) -> dict[str, Any]:
    """Both sides' drains on a three-node cluster of the run's own (``cluster_drain``),
    with the in-process and prefork drains of the throughput part."""
    settings = cluster_drain.Settings(jobs=args.cluster_jobs, rounds=args.rounds,
                                      timeout_s=args.timeout, ports=args.cluster_ports,
                                      dist_ports=args.cluster_dist_ports)
    pid, n = os.getpid(), settings.jobs
    with cluster_drain.started(settings, log=_progress) as cluster, _workdir() as workdir:
        admin = Broker(cluster_drain.urls(cluster, "amqp").split(";")[0])
        made: list[Side] = []
        try:
            made.append(make_plain_side(cluster_drain.urls(cluster, "pyamqp"), pid,
                                        confirm=False, quorum=True))
            made.append(make_ojs_side(cluster_drain.urls(cluster, "amqp"), pid,
                                      prefix=f"bench{pid}q", label="ojs_kombu (quorum queue)",
                                      conf=cluster_drain.OJS_CONF))
            sides = dict(zip(cluster_drain.SIDES, made, strict=True))
            for side in made:
                side.declare()

            def measure(key: str, pool: str, i: int) -> dict[str, Any]:
                side = sides[key]
                fill: Callable[[int], None] = (
                    (lambda k: cluster_drain.fill_ojs(side.app, side.task, k)) if key == "ojs"
                    else (lambda k: cluster_drain.fill_plain(
                        side.app, side.task, k, lambda: admin.depth(side.amqp_queue))))
                if pool == "threads":
                    watch = cluster_drain.Watch(cluster, side.amqp_queue,
                                                lambda: side.recorder.count > 0)
                    result = measure_drain(side, admin, n, settings.timeout_s, fill=fill,
                                           before_start=lambda: watch.start(os.getpid()),
                                           when_done=watch.done)
                else:
                    name = f"bench-cl-{key}-{pid}-{i}"
                    record = workdir / f"{name}.record"
                    watch = cluster_drain.Watch(
                        cluster, side.amqp_queue,
                        lambda: record.exists() and record.stat().st_size > 0)
                    result = measure_prefork_drain(side, admin, n, settings.timeout_s, workdir,
                                                   name, fill=fill, started=watch.start,
                                                   when_done=watch.done)
                return {**asdict(result), **watch.numbers(n)}

            result = cluster_drain.run(settings, measure, log=_progress)
            result["leaders"] = cluster_drain.leaders(
                cluster, {key: side.amqp_queue for key, side in sides.items()})
        finally:
            for side in made:
                side.app.close()
            admin.close()
    result["settings"] = {"ports": list(settings.ports), "rounds": settings.rounds,
                          "threads": {"pool": POOL, "concurrency": CONCURRENCY},
                          "prefork": {"pool": prefork_drain.POOL,
                                      "concurrency": prefork_drain.CONCURRENCY},
                          "ojs_conf": cluster_drain.OJS_CONF,
                          "plain_queue_arguments": {"x-queue-type": "quorum"}}
    return result


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_throughput(broker: Broker, args: argparse.Namespace) -> dict[str, Any]:
    """Every publish scenario (interleaved in ``--blocks`` blocks), then the drains, per
    round; medians, ratios and targets.

    Odd rounds run the publish blocks in reverse order and each drain pair ojs
    first, so drift on the shared machine hits every contender alike.
    """
    pid = os.getpid()
    dramatiq_queue = f"bench{pid}-dramatiq"
    fast, single, drained = args.fast_jobs, args.jobs, args.drain_jobs
    with sides(broker, args.broker) as (plain, plain_nc, plain_pq, ojs, ojs_multi,
                                        ojs_classic), \
            dramatiq_publishers(broker, args.broker, dramatiq_queue) as (dq, dq_confirm), \
            raw_publisher(broker, args.broker, ojs) as raw, _workdir() as workdir, \
            deferred_side(broker, args.broker) as ojs_deferred, \
            deferred_side(broker, args.broker, classic=True) as ojs_deferred_classic:
        for side in (plain, plain_nc, plain_pq, ojs, ojs_multi, ojs_classic, ojs_deferred,
                     ojs_deferred_classic):
            warm_up(side, broker)
        for side in (ojs, ojs_classic):
            publish_batches(side, WARMUP, WARMUP)
            broker.purge(side.amqp_queue)
        for publisher in (dq, dq_confirm):
            publisher.send(WARMUP, TASK_ARGS)
        broker.purge(dramatiq_queue)
        raw.send(WARMUP, WARMUP)
        broker.purge(ojs.amqp_queue)
        publishers: dict[str, tuple[Callable[[int], list[float]], str, int]] = {
            "plain_publish": (lambda k: publish(plain_nc, k), plain.amqp_queue, fast),
            "plain_publish_confirm": (lambda k: publish(plain, k), plain.amqp_queue, single),
            "ojs_publish": (lambda k: publish(ojs, k), ojs.amqp_queue, single),
            "ojsclassic_publish": (lambda k: publish(ojs_classic, k), ojs_classic.amqp_queue,
                                   single),
            "ojs_publish_deferred": (lambda k: publish_deferred(ojs_deferred, k),
                                     ojs_deferred.amqp_queue, fast),
            "ojsclassic_publish_deferred": (
                lambda k: publish_deferred(ojs_deferred_classic, k),
                ojs_deferred_classic.amqp_queue, fast),
            "ojs_batch": (lambda k: publish_batches(ojs, k, args.batch_size),
                          ojs.amqp_queue, fast),
            "ojsclassic_batch": (lambda k: publish_batches(ojs_classic, k, args.batch_size),
                                 ojs_classic.amqp_queue, fast),
            "raw_batch": (lambda k: raw.send(k, args.batch_size), ojs.amqp_queue, fast),
            "raw_publish": (lambda k: raw.send(k, 1), ojs.amqp_queue, single),
            "dramatiq_send": (lambda k: dq.send(k, TASK_ARGS), dramatiq_queue, fast),
            "dramatiq_send_confirm": (lambda k: dq_confirm.send(k, TASK_ARGS),
                                      dramatiq_queue, single),
        }
        drains: dict[str, Callable[[int], DrainResult]] = {
            "plaindef_drain_threads": lambda i: measure_drain(
                plain_nc, broker, drained, args.timeout, fill=filler(plain)),
            "plain_drain_threads": lambda i: measure_drain(plain, broker, drained, args.timeout),
            "plainpq_drain_threads": lambda i: measure_drain(plain_pq, broker, drained,
                                                             args.timeout),
            "ojs_drain_threads": lambda i: measure_drain(ojs, broker, drained, args.timeout),
            "ojsmulti_drain_threads": lambda i: measure_drain(ojs_multi, broker, drained,
                                                              args.timeout),
            "plaindef_drain_prefork": lambda i: measure_prefork_drain(
                plain_nc, broker, drained, args.timeout, workdir, f"bench-plaind-{pid}-{i}",
                fill=filler(plain)),
            "plain_drain_prefork": lambda i: measure_prefork_drain(
                plain, broker, drained, args.timeout, workdir, f"bench-plain-{pid}-{i}"),
            "plainpq_drain_prefork": lambda i: measure_prefork_drain(
                plain_pq, broker, drained, args.timeout, workdir, f"bench-plainpq-{pid}-{i}"),
            "ojs_drain_prefork": lambda i: measure_prefork_drain(
                ojs, broker, drained, args.timeout, workdir, f"bench-ojs-{pid}-{i}"),
            "ojsmulti_drain_prefork": lambda i: measure_prefork_drain(
                ojs_multi, broker, drained, args.timeout, workdir, f"bench-ojsm-{pid}-{i}"),
        }
        rounds: dict[str, list[dict[str, Any]]] = {key: [] for key in [*publishers, *drains]}
        orders: list[list[str]] = []
        block_orders: list[list[list[str]]] = []
        for i in range(args.rounds):
            forward = i % 2 == 0
            label = f"round {i + 1}/{args.rounds}"
            published, blocks = interleaved_publishes(publishers, broker, args.blocks, forward,
                                                      label)
            block_orders.append(blocks)
            for key, result in published.items():
                rounds[key].append(asdict(result))
            order = list(published)
            for pool in ("threads", "prefork"):
                group = [f"{side}_drain_{pool}" for side in ("plaindef", "plain", "plainpq",
                                                             "ojs", "ojsmulti")]
                order += group if forward else group[::-1]
            orders.append(order)
            for key in order[len(published):]:
                _progress(f"throughput: {label}, {report.BY_KEY[key].label}")
                rounds[key].append(asdict(drains[key](i)))
    medians = {key: summarize(results) for key, results in rounds.items()}
    jobs = {key: publishers[key][2] if key in publishers else drained for key in rounds}
    return {"medians": medians, "jobs": jobs, **report.assess(medians), "rounds": rounds,
            "orders": orders, "publish_block_orders": block_orders,
            "settings": {"batch_size": args.batch_size, "warmup": WARMUP,
                         "publish_blocks": args.blocks,
                         "threads": {"pool": POOL, "concurrency": CONCURRENCY},
                         "prefork": {"pool": prefork_drain.POOL,
                                     "concurrency": prefork_drain.CONCURRENCY},
                         "dramatiq_queue": dramatiq_queue}}


def run_typed_publish(broker: Broker, args: argparse.Namespace) -> dict[str, Any]:
    """Typed and untyped confirmed publishes, plain Celery beside ojs_kombu
    (``typed_publish.py``)."""
    pid = os.getpid()
    made = [make_plain_side(args.broker, pid), make_ojs_side(args.broker, pid)]
    try:
        for side in made:
            warm_up(side, broker)
        return typed_publish.run(made[0], made[1], broker, time_block, jobs=args.jobs,
                                 rounds=max(args.rounds, 3), blocks=args.blocks,
                                 log=_progress)
    finally:
        for side in made:
            side.app.close()
            broker.delete_side(side)


@contextmanager
def events_side(broker: Broker, broker_url: str, kind: str
                ) -> Iterator[tuple[Side, events_scenario.Probe | None]]:
    """A fresh ojs_kombu side of ``kind`` (``events_scenario.SIDES``: off, on, or the AMQP
    sink or the metrics alone) and, with the sink, its probe with a tap queue.

    Fresh per round: an in-process worker's shutdown closes the app's event
    sinks for good (see README), so an app is not reused after its worker ran.
    On exit its connections close and everything it (or the tap) declared is deleted.
    """
    pid = os.getpid()
    prefix = f"bench{pid}-ev{kind}"
    sink, metrics = events_scenario.SIDES[kind]
    conf: dict[str, Any] = {}
    provider = reader = None
    if metrics:
        provider, reader = events_scenario.meter_provider()
        conf["ojs_meter_provider"] = provider
    if sink:
        conf["ojs_event_sinks"] = ["amqp"]
    side = make_ojs_side(broker_url, pid, prefix=prefix, conf=conf,
                         label=f"ojs_kombu events {kind}")
    tap = None
    try:
        probe = None
        if sink:
            exchange = events_exchange(side.app.amqp.binding.names)
            side.exchanges.append(exchange)
            side.queues.append(f"{prefix}-events-tap")
            tap = events_scenario.Tap(broker.connection, exchange, side.queues[-1])
            probe = events_scenario.Probe(side.app, tap, reader)
        yield side, probe
    finally:
        side.app.close()
        if provider is not None:
            provider.shutdown()
        if tap is not None:
            tap.close()
        broker.delete_side(side)


def measure_events_side(broker: Broker, args: argparse.Namespace, kind: str
                        ) -> dict[str, Any]:
    """Warm-up, publish, drain of one side; with the sink, also what the tap received."""
    with events_side(broker, args.broker, kind) as (side, probe):
        warm_up(side, broker)
        if probe is None:
            return {"publish": measure_publish(side, broker, args.jobs),
                    "drain": measure_drain(side, broker, args.drain_jobs, args.timeout)}
        probe.reset(args.timeout)
        published = measure_publish(side, broker, args.jobs)
        publish_events = probe.after_publish(args.jobs, args.timeout)
        job_ids: list[str] = []
        lag: list[float | None] = []
        drained = measure_drain(
            side, broker, args.drain_jobs, args.timeout, job_ids=job_ids,
            before_start=lambda: probe.before_worker(args.timeout),
            when_done=lambda: lag.append(
                probe.wait_drain_events(side.recorder, args.drain_jobs, args.timeout)))
        return {"publish": published, "drain": drained, "publish_events": publish_events,
                "drain_events_lag_s": lag[0] if lag else None,
                "events": probe.collect(job_ids, args.timeout)}


def run_events(broker: Broker, args: argparse.Namespace) -> dict[str, Any]:
    """Events off, on, and (unless ``--no-events-split``) the sink alone and the metrics
    alone; a fresh app per side and round, the order rotated by one side per round."""
    kinds = list(events_scenario.SIDES) if args.events_split else ["off", "on"]
    rounds: list[dict[str, Any]] = []
    for i in range(args.rounds):
        order = events_scenario.rotated(kinds, i)
        got: dict[str, Any] = {"order": order}
        for kind in order:
            _progress(f"events: round {i + 1}/{args.rounds}, events {kind} ...")
            got[kind] = measure_events_side(broker, args, kind)
        rounds.append(_plain(got))
    result = events_scenario.summarize(rounds, summarize)
    result["settings"] = {"event_sinks": ["amqp"], "metric_reader": "InMemoryMetricReader",
                          "pool": POOL, "concurrency": CONCURRENCY, "warmup": WARMUP,
                          "sides": kinds}
    return result


def _plain(value: Any) -> Any:
    """Results (dataclasses inside dicts) as JSON-ready dicts; ``summarize`` takes these."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return asdict(value) if isinstance(value, (PublishResult, DrainResult)) else value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000,
                        help="jobs per side for confirmed single publishes (the traced publish "
                        "and events parts' publishes too)")
    parser.add_argument("--drain-work-ms", type=float, default=0.0,
                        help="each drained job sleeps this long (10: a call to another "
                        "service); 0, the default: no-op jobs")
    parser.add_argument("--drain-jobs", type=int, default=8000,
                        help="jobs each drain runs, throughput and events (a drain of a few "
                        "thousand no-op jobs lasts under a second and reads high)")
    parser.add_argument("--fast-jobs", type=int, default=20_000,
                        help="jobs for the fast publish scenarios: plain Celery and Dramatiq "
                        "without confirms, ojs_kombu batch")
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE,
                        help="jobs per enqueue_many call")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="results file")
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeat the throughput and events scenarios, alternating which "
                        "side goes first, and report medians (steadier ratios on a noisy "
                        "machine)")
    parser.add_argument("--blocks", type=int, default=5,
                        help="throughput and traced publish: cut each publish scenario of a "
                        "round into this many blocks, run in turns with the other scenarios "
                        "(1: one block each)")
    parser.add_argument("--broker", default=DEFAULT_BROKER, help="amqp:// URL of RabbitMQ")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds a drain may take before it counts as an error")
    parser.add_argument("--only", choices=PARTS + EXTRA_PARTS,
                        help="run one part: throughput (publish, drain), typed_publish "
                        "(confirmed apply_async with typed and untyped arguments), traced_publish "
                        "(single apply_async with OpenTelemetry's Celery instrumentation on and "
                        "off), events (ojs_kombu "
                        "with events off vs on), schedule, storm (poison messages), green "
                        "(gevent and eventlet drains), dedup (drain with idempotency keys on "
                        "and off), scale (apps of 1, 10 and 100 job queues), dlq_scale (the "
                        "dlq commands on 10,000 and 100,000 dead letters) or "
                        "cluster_drain (a three-node cluster with quorum queues; only with "
                        "--only)")
    parser.add_argument("--skip-traced-publish", action="store_true",
                        help="leave out the traced publish part")
    parser.add_argument("--skip-events", action="store_true", help="leave out the events part")
    parser.add_argument("--no-events-split", dest="events_split", action="store_false",
                        help="events: only events off and on, without the sides with the "
                        "AMQP sink alone and the metrics alone")
    parser.add_argument("--skip-schedule", action="store_true",
                        help="leave out the scheduling part")
    parser.add_argument("--skip-storm", action="store_true", help="leave out the poison storm")
    parser.add_argument("--storm-jobs", type=int, default=5000,
                        help="storm: poison jobs per side (each side also gets as many "
                        "deliveries that are not jobs)")
    parser.add_argument("--storm-pools", type=_pools, default=poison_storm.POOLS,
                        help="storm: comma-separated worker pools (solo,prefork,threads)")
    parser.add_argument("--storm-timeout", type=float, default=120.0,
                        help="storm: seconds a side may take to dead-letter its storm")
    parser.add_argument("--skip-green", action="store_true",
                        help="leave out the gevent and eventlet drains")
    parser.add_argument("--skip-dedup", action="store_true",
                        help="leave out the drain with idempotency keys on and off")
    parser.add_argument("--dedup-jobs", type=int, default=5000,
                        help="dedup: no-op jobs per drain (each side, each round), and keys "
                        "in the store-alone loop")
    parser.add_argument("--dedup-work-ms", type=float, default=0.0,
                        help="dedup: milliseconds of CPU each job spins (0: a no-op job)")
    parser.add_argument("--green-jobs", type=int, default=3000,
                        help="green: I/O-bound jobs (a 10 ms green sleep each) per drain")
    parser.add_argument("--schedule-jobs", type=int, default=10_000,
                        help="scheduling: jobs due in 60 s to 1 h, for the memory numbers")
    parser.add_argument("--schedule-range", type=_seconds_range,
                        default=scheduling.COUNTDOWN_RANGE,
                        help="scheduling: LOW,HIGH seconds ahead the memory jobs are due "
                        "(3600,604800: the next hour to 7 days)")
    parser.add_argument("--schedule-batch", type=int, default=0,
                        help="scheduling: publish the memory jobs N at a time with "
                        "enqueue_many (plain Celery: apply_async without confirms); "
                        "0: one confirmed apply_async each")
    parser.add_argument("--lateness-jobs", type=int, default=1_000,
                        help="scheduling: jobs due within 30 s, for the lateness numbers")
    parser.add_argument("--settle", type=float, default=15.0,
                        help="scheduling: seconds between publishing and measuring RSS")
    parser.add_argument("--lateness-grace", type=float, default=30.0,
                        help="scheduling: seconds after the last due time before jobs that "
                        "have not run count as missing")
    parser.add_argument("--scale-queues", type=_counts, default=scale.COUNTS,
                        help="scale: comma-separated job-queue counts of the apps compared")
    parser.add_argument("--dlq-sizes", type=_counts, default=dlq_scale.SIZES,
                        help="dlq_scale: comma-separated dead-letter queue lengths")
    parser.add_argument("--charts", action="store_true",
                        help="draw the charts of the parts run into docs/_static/perf "
                        "(benchmarks/charts.py; matplotlib, in the bench extra)")
    parser.add_argument("--latency-jobs", type=int, default=2000,
                        help="latency_memory: jobs whose publish-to-start latency is measured")
    parser.add_argument("--memory-jobs", type=int, default=100_000,
                        help="latency_memory: jobs a worker runs before its RSS is read again")
    parser.add_argument("--skip-scale", action="store_true",
                        help="leave out the scale parts (apps of 1, 10 and 100 job queues; "
                        "dead letters at scale)")
    parser.add_argument("--cluster-jobs", type=int, default=cluster_drain.Settings.jobs,
                        help="cluster_drain: jobs per drain")
    parser.add_argument("--cluster-ports", type=_three_ports,
                        default=cluster_drain.Settings.ports,
                        help="cluster_drain: the three nodes' AMQP ports (comma-separated)")
    parser.add_argument("--cluster-dist-ports", type=_three_ports,
                        default=cluster_drain.Settings.dist_ports,
                        help="cluster_drain: the three nodes' Erlang distribution ports")
    args = parser.parse_args(argv)
    if args.jobs < 2 or args.drain_jobs < 2 or args.rounds < 1 or args.blocks < 1:
        parser.error("--jobs and --drain-jobs must be at least 2, --rounds and --blocks at "
                     "least 1")
    if args.jobs < 2 * args.blocks:
        parser.error("--jobs must be at least twice --blocks (every block needs jobs)")
    if args.drain_work_ms < 0:
        parser.error("--drain-work-ms must not be negative")
    DRAIN_WORK_S[0] = args.drain_work_ms / 1000
    if args.batch_size < 1 or args.fast_jobs < 2 * args.batch_size:
        parser.error("--batch-size must be at least 1 and --fast-jobs at least twice it "
                     "(for the batch latency percentiles)")
    if (args.schedule_jobs < 1 or args.lateness_jobs < 2 or args.settle < 0
            or args.lateness_grace < 0 or args.schedule_batch < 0):
        parser.error("--schedule-jobs must be at least 1, --lateness-jobs at least 2, "
                     "--settle, --lateness-grace and --schedule-batch not negative")
    if args.storm_jobs < 1 or args.storm_timeout <= 0:
        parser.error("--storm-jobs must be at least 1 and --storm-timeout positive")
    if args.dedup_jobs < 1 or args.dedup_work_ms < 0:
        parser.error("--dedup-jobs must be at least 1, --dedup-work-ms not negative")
    if args.green_jobs < 1 or args.cluster_jobs < 2:
        parser.error("--green-jobs must be at least 1, --cluster-jobs at least 2")
    if args.only and (args.skip_traced_publish or args.skip_events or args.skip_schedule
                      or args.skip_storm or args.skip_green or args.skip_dedup
                      or args.skip_scale):
        parser.error("--only cannot be combined with --skip-traced-publish, --skip-events, "
                     "--skip-schedule, --skip-storm, --skip-green or --skip-dedup")
    skipped = {"traced_publish"} if args.skip_traced_publish else set()
    skipped |= {"events"} if args.skip_events else set()
    skipped |= {"schedule"} if args.skip_schedule else set()
    skipped |= {"storm", "storm_backlog"} if args.skip_storm else set()
    skipped |= {"green"} if args.skip_green else set()
    skipped |= {"dedup"} if args.skip_dedup else set()
    skipped |= {"scale", "dlq_scale"} if args.skip_scale else set()
    args.parts = (args.only,) if args.only else tuple(p for p in PARTS if p not in skipped)
    return args


def _three_ports(value: str) -> tuple[int, int, int]:
    """``--cluster-ports``/``--cluster-dist-ports``: three comma-separated port numbers."""
    try:
        ports = tuple(int(p) for p in value.split(","))
    except ValueError:
        ports = ()
    if len(ports) != 3 or len(set(ports)) != 3:
        raise argparse.ArgumentTypeError(f"three distinct ports, got {value!r}")
    return ports  # type: ignore[return-value]


def _seconds_range(value: str) -> tuple[float, float]:
    """``--schedule-range``: ``LOW,HIGH`` seconds, 0 < LOW <= HIGH."""
    try:
        low, high = (float(v) for v in value.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"LOW,HIGH seconds, got {value!r}") from None
    if not 0 < low <= high:
        raise argparse.ArgumentTypeError(f"0 < LOW <= HIGH, got {value!r}")
    return low, high


def _counts(value: str) -> tuple[int, ...]:
    """``--scale-queues``: comma-separated positive counts."""
    try:
        counts = tuple(sorted({int(c) for c in value.split(",") if c.strip()}))
    except ValueError:
        counts = ()
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError(f"positive counts, got {value!r}")
    return counts


def _pools(value: str) -> tuple[str, ...]:
    """``--storm-pools``: a comma-separated subset of ``poison_storm.POOLS``, in that order."""
    chosen = {name.strip() for name in value.split(",") if name.strip()}
    unknown = chosen - set(poison_storm.POOLS)
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"pools are {', '.join(poison_storm.POOLS)}; got "
                                         f"{value!r}")
    return tuple(pool for pool in poison_storm.POOLS if pool in chosen)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM -> SystemExit, so the finally blocks still delete what the run declared.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        broker = Broker(args.broker)
    except (OSError, amqp.exceptions.AMQPError) as exc:
        print(f"RabbitMQ is not reachable at {_host(args.broker)} ({exc}); start it with "
              "`rabbitmq-server -detached` and retry", file=sys.stderr)
        return 2
    try:
        machine = machine_info(broker)
        machine["load_start"] = round(os.getloadavg()[0], 2)  # 1-minute load average
        results = run(broker, args)
        machine["load_end"] = round(os.getloadavg()[0], 2)
    finally:
        broker.close()
    print(render(results))
    write_json(args.json, {
        "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "parts": list(args.parts), "jobs": args.jobs, "drain_jobs": args.drain_jobs,
        "drain_work_ms": args.drain_work_ms, "fast_jobs": args.fast_jobs,
        "batch_size": args.batch_size, "rounds": args.rounds, "warmup": WARMUP,
        "pool": POOL, "concurrency": CONCURRENCY,
        "machine": machine, "results": results,
    })
    print(f"\nresults written to {args.json}")
    if args.charts:
        import charts  # matplotlib: the bench extra

        for path in charts.draw(json.loads(args.json.read_text())):
            print(f"chart written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
