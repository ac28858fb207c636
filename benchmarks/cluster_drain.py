"""Drain on a three-node RabbitMQ cluster with quorum queues: ojs_kombu vs plain Celery.

``run.py --only cluster_drain`` starts a cluster of its own with the fault
suite's :class:`faults.cluster.Cluster` (nodes ``ojs-b1..3@localhost``, AMQP on
5691-5693 by default: apart from the fault suite's 5681-5683, so both can run
on one machine) and always stops it and deletes its data, also after an error,
Ctrl-C or SIGTERM.  Both sides get all three node URLs and a quorum queue:
ojs_kombu through ``ojs_queue_defaults = {"type": "quorum"}``, plain Celery
through ``Queue(..., queue_arguments={"x-queue-type": "quorum"})``.  Per round,
pool (``threads`` in process, ``prefork`` as a subprocess) and side, the queue
is filled with no worker running, then one worker drains it; the sides swap
places every round.

Besides jobs/s (first job start to last job end), a :class:`Watch` reads the
CPU time the worker and the three RabbitMQ nodes spent between the first job
start and the last job end (``/proc``), and which QoS the worker's consumer
asked for.  Plain Celery's worker sees a quorum queue and switches on its
native delayed delivery (it declares 28 ``celery_delayed_*`` quorum queues at
start) and per-consumer QoS (``worker_detect_quorum_queues``): the delayed
delivery topology is declared once before the first round, so every drain runs
on the same cluster, and no job has a countdown or an eta.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kombu import Connection
from kombu.transport.native_delayed_delivery import (
    declare_native_delayed_delivery_exchanges_and_queues,
)

import ojs_kombu

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # also when imported, not run
if str(HERE.parent) not in sys.path:
    sys.path.append(str(HERE.parent))  # the fault suite's cluster, imported as faults.cluster
from report import grid  # noqa: E402

from faults.cluster import Cluster  # noqa: E402

POOLS = ("threads", "prefork")
SIDES = ("plain", "ojs")
LABELS = {"plain": "plain Celery", "ojs": "ojs_kombu"}
NODE_NAME = "ojs-b"
#: The issue's target: ojs_kombu drains at least this share of plain Celery's jobs/s.
TARGET = 0.9
#: What makes every ojs_kombu queue a quorum queue (README, *Production*).
OJS_CONF: dict[str, Any] = {"ojs_queue_defaults": {"type": "quorum"}}
#: Jobs per ``enqueue_many`` call when filling the ojs_kombu side's queue.
FILL_BATCH = 1000
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Settings:
    """What ``run.py`` asks for (``--cluster-jobs``, ``--rounds``, ``--timeout``, ports)."""

    jobs: int = 4000
    rounds: int = 1
    timeout_s: float = 300.0
    ports: tuple[int, int, int] = (5691, 5692, 5693)
    dist_ports: tuple[int, int, int] = (25691, 25692, 25693)


def urls(cluster: Cluster, scheme: str) -> str:
    """Every node's URL with ``scheme``, ``;``-separated (kombu's failover list)."""
    return ";".join(f"{scheme}://guest:guest@127.0.0.1:{node.port}//" for node in cluster.nodes)


@contextmanager
def started(settings: Settings, log: Callable[[str], None] = print) -> Iterator[Cluster]:
    """A fresh three-node cluster, stopped and deleted on exit whatever happens."""
    log(f"cluster_drain: starting nodes {NODE_NAME}1..3 on ports "
        f"{', '.join(map(str, settings.ports))} ...")
    began = time.monotonic()
    with Cluster(settings.ports, settings.dist_ports, name=NODE_NAME) as cluster:
        log(f"cluster_drain: cluster up after {time.monotonic() - began:.0f}s")
        with Connection(urls(cluster, "pyamqp").split(";")[0]) as connection:
            declare_native_delayed_delivery_exchanges_and_queues(connection, "quorum")
        try:
            yield cluster
        finally:
            log("cluster_drain: stopping the cluster ...")


def fill_ojs(app: Any, task: Any, n: int) -> None:
    """``n`` jobs in confirmed ``enqueue_many`` batches (one confirm each on a quorum
    queue would make filling the slowest part of the run)."""
    for done in range(0, n, FILL_BATCH):
        ojs_kombu.enqueue_many(app, [task.s(42, "benchmark")
                           for _ in range(min(FILL_BATCH, n - done))])


def fill_plain(app: Any, task: Any, n: int, depth: Callable[[], int | None],
               timeout: float = 30.0) -> None:
    """``n`` unconfirmed ``apply_async`` calls on one producer (the fastest way plain Celery
    has), then until the queue holds them all."""
    with app.producer_or_acquire() as producer:
        for _ in range(n):
            task.apply_async((42, "benchmark"), producer=producer)
    deadline = time.monotonic() + timeout
    while (depth() or 0) < n and time.monotonic() < deadline:
        time.sleep(0.05)


def cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU time of ``pids`` (every thread of each), from ``/proc``."""
    total = 0
    for pid in pids:
        with suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            total += int(fields[11]) + int(fields[12])
    return total / _TICK


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (the prefork pool's processes)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for children in Path(f"/proc/{current}/task").glob("*/children"):
            with suppress(OSError, ValueError):
                todo += [int(c) for c in children.read_text().split()]
    return found


class Watch:
    """CPU of one drain's worker and of the three nodes, first job start to last job end,
    and the QoS its consumer asked for.

    :meth:`start` (the worker's pid) starts a thread that polls ``first_job`` every
    10 ms and reads the CPU times once it is true; :meth:`done` reads them again
    and asks the first node for the consumers of ``queue`` and their channels.
    """

    def __init__(self, cluster: Cluster, queue: str, first_job: Callable[[], bool]) -> None:
        self.cluster, self.queue, self.first_job = cluster, queue, first_job
        self.worker_pid: int | None = None
        self.began: tuple[float, float] | None = None
        self.ended: tuple[float, float] | None = None
        self.qos: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _cpu(self) -> tuple[float, float]:
        assert self.worker_pid is not None
        brokers = [node.pid for node in self.cluster.nodes if node.pid is not None]
        return cpu_seconds(process_tree(self.worker_pid)), cpu_seconds(brokers)

    def _poll(self) -> None:
        while not self._stop.wait(0.01):
            if self.first_job():
                self.began = self._cpu()
                return

    def start(self, worker_pid: int) -> None:
        self.worker_pid = worker_pid
        self._thread.start()

    def done(self) -> None:
        self.ended = self._cpu()
        self._stop.set()
        self._thread.join(5)
        self.qos = consumer_qos(self.cluster, self.queue)

    def numbers(self, n: int) -> dict[str, Any]:
        """Worker and broker CPU per job in µs (``None`` if the first job was not seen)."""
        if self.began is None or self.ended is None:
            return {"worker_cpu_us_per_job": None, "broker_cpu_us_per_job": None, **self.qos}
        return {"worker_cpu_us_per_job": (self.ended[0] - self.began[0]) * 1e6 / n,
                "broker_cpu_us_per_job": (self.ended[1] - self.began[1]) * 1e6 / n,
                **self.qos}


def consumer_qos(cluster: Cluster, queue: str) -> dict[str, Any]:
    """The prefetch of every consumer of ``queue`` and the global prefetch of its channel
    (``rabbitmqctl list_consumers``/``list_channels``; global > 0: global QoS was asked)."""
    node = cluster.nodes[0]
    consumers = [line.split("\t") for line in node.ctl(
        "list_consumers", "--no-table-headers", "queue_name", "channel_pid", "prefetch_count",
        check=False).splitlines() if line.startswith(f"{queue}\t")]
    channels = {row[0]: row[1:] for row in (line.split("\t") for line in node.ctl(
        "list_channels", "--no-table-headers", "pid", "prefetch_count", "global_prefetch_count",
        check=False).splitlines()) if len(row) == 3}
    return {"consumers": len(consumers),
            "prefetch_count": [int(row[2]) for row in consumers],
            "global_prefetch_count": [int(channels[row[1]][1]) for row in consumers
                                      if row[1] in channels]}


def leaders(cluster: Cluster, queues: dict[str, str]) -> dict[str, str | None]:
    """Per side the node holding its queue's leader (both should be the first node,
    where the clients connect)."""
    found: dict[str, str | None] = {}
    for key, queue in queues.items():
        try:
            found[key] = cluster.leader(queue).name
        except LookupError:
            found[key] = None
    return found


def order_of(round_index: int) -> tuple[str, ...]:
    """The sides' order in a round: plain Celery first on even rounds, ojs_kombu on odd."""
    return SIDES if round_index % 2 == 0 else SIDES[::-1]


def run(settings: Settings, measure: Callable[[str, str, int], dict[str, Any]],
        log: Callable[[str], None] = print) -> dict[str, Any]:
    """``measure(side, pool, round)`` for every round, pool and side; medians and ratios."""
    rounds: dict[str, dict[str, list[dict[str, Any]]]] = {
        pool: {key: [] for key in SIDES} for pool in POOLS}
    orders = []
    for i in range(settings.rounds):
        orders.append(list(order_of(i)))
        for pool in POOLS:
            for key in order_of(i):
                log(f"cluster_drain: round {i + 1}/{settings.rounds}, {pool}, {LABELS[key]}, "
                    f"{settings.jobs} jobs")
                rounds[pool][key].append(measure(key, pool, i))
    return {**summarize(rounds), "jobs": settings.jobs, "orders": orders}


def _median(runs: list[dict[str, Any]], field: str) -> float | None:
    values = [r[field] for r in runs if r.get(field) is not None]
    return statistics.median(values) if values else None


def summarize(rounds: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Per pool each side's medians, the jobs/s ratio ojs/plain, the CPU ratios and the
    target; also whether any consumer of a side asked for global QoS."""
    pools: dict[str, Any] = {}
    for pool, by_side in rounds.items():
        medians = {key: {field: _median(runs, field) for field in
                         ("jobs_per_s", "seconds", "worker_cpu_us_per_job",
                          "broker_cpu_us_per_job")}
                   for key, runs in by_side.items() if runs}
        if set(medians) != set(SIDES):
            continue
        plain, ojs = medians["plain"], medians["ojs"]
        ratio = ojs["jobs_per_s"] / plain["jobs_per_s"] if plain["jobs_per_s"] else None
        pools[pool] = {
            **medians, "ratio": ratio,
            "worker_cpu_ratio": _ratio(ojs["worker_cpu_us_per_job"],
                                       plain["worker_cpu_us_per_job"]),
            "broker_cpu_ratio": _ratio(ojs["broker_cpu_us_per_job"],
                                       plain["broker_cpu_us_per_job"]),
            "global_qos": {key: any(g > 0 for r in runs
                                    for g in r.get("global_prefetch_count", []))
                           for key, runs in by_side.items()},
            "target": {"minimum": TARGET, "met": ratio is not None and ratio >= TARGET},
            "rounds": by_side}
    return {"pools": pools}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def render(result: dict[str, Any]) -> list[str]:
    """One row per pool and side (jobs/s, CPU per job), then the targets."""
    rows: list[tuple[str, ...]] = [(
        f"cluster drain ({result['jobs']} jobs, 3 nodes, quorum queue)", "jobs/s",
        "ratio (ojs/plain)", "worker CPU us/job", "broker CPU us/job", "global QoS")]
    targets: list[tuple[str, ...]] = [("target (issue 28)", "ratio", "status")]
    for pool, measured in result["pools"].items():
        for key in SIDES:
            side = measured[key]
            rows.append((f"{LABELS[key]}, {pool}", _cell(side["jobs_per_s"], ".0f"),
                         _cell(measured["ratio"], ".2f") if key == "ojs" else "",
                         _cell(side["worker_cpu_us_per_job"], ".0f"),
                         _cell(side["broker_cpu_us_per_job"], ".0f"),
                         "yes" if measured["global_qos"][key] else "no"))
        ratio = measured["ratio"]
        targets.append((f"drain {pool} on the cluster >= {TARGET}x plain Celery",
                        _cell(ratio, ".2f"),
                        "-" if ratio is None else
                        ("met" if measured["target"]["met"] else "not met")))
    lines = grid(rows)
    lines.append("  CPU: first job start to last job end; worker = its process tree, broker = "
                 "the three nodes' VMs")
    if result.get("leaders"):
        lines.append("  queue leaders: " + ", ".join(
            f"{LABELS[k]} {v or '?'}" for k, v in result["leaders"].items()))
    return [*lines, "", *grid(targets)]
