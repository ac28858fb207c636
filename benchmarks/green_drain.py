"""Drain of I/O-bound jobs with the gevent and eventlet pools: ojs_kombu vs plain Celery.

Per round, pool and side: the queue is filled with N jobs of ``bench.io`` (a
green ``time.sleep(0.01)``, ``green_app.py``) with no worker running; then
``python -m celery -A green_app worker -P <pool> -c 100`` drains it, and is
stopped once the record file holds one line per job (``prefork_drain``'s
stop: SIGTERM, then SIGKILL of its process group).  The drain time runs from
the earliest job start to the latest job end, so start-up and shut-down are not
part of it.  Sides alternate which goes first per round; the table shows the
medians and the ratio ojs_kombu / plain Celery per pool.

Workers run ``--without-heartbeat --without-gossip``, as the prefork drain's do,
and here for a reason of Celery's own: with worker heartbeat events or gossip
on, Celery 5.7's loop for green pools waits up to 100 ms on the event
connection after every message it reads, capping either side at about 10
jobs/s (benchmarks/README.rst, *Green pools*).
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the worker subprocess imports green_app the same way
import workers  # noqa: E402
from green_app import SLEEP_S, make_app  # noqa: E402
from report import grid  # noqa: E402
from worker_side import Admin, WorkerSide  # noqa: E402

POOLS = ("gevent", "eventlet")
SIDES = ("plain", "ojs")
LABELS = {"plain": "plain Celery", "ojs": "ojs_kombu"}
CONCURRENCY = 100
QUEUE = "bench-green"


@dataclass
class Settings:
    """What ``run.py`` asks for (``--green-jobs``, ``--rounds``, ``--timeout``)."""

    jobs: int = 3000
    pools: tuple[str, ...] = POOLS
    rounds: int = 1
    timeout_s: float = 120.0


@dataclass
class GreenDrain:
    """One drain: jobs/s from the first job start to the last job end."""

    jobs_per_s: float
    seconds: float
    left_in_queue: int | None


class _Side(WorkerSide):
    """The green part's side: ``bench.io`` of ``green_app``."""

    def __init__(self, key: str, broker_url: str, tag: str) -> None:
        prefix = f"bench{tag}g" if key == "ojs" else None
        queue = QUEUE if prefix else f"{QUEUE}-{tag}"
        super().__init__(key, make_app(broker_url, queue, None, prefix), "bench.io", queue,
                         prefix)


def drain(side: _Side, broker: Admin, pool: str, n: int, timeout: float, workdir: Path,
          name: str) -> GreenDrain:
    """Fill the queue, then time one ``-P pool -c 100`` worker from first start to last end."""
    broker.purge(side.amqp_queue)
    side.fill(n)
    deadline = time.monotonic() + 10  # plain Celery's unconfirmed publishes land shortly
    while (queued := broker.depth(side.amqp_queue)) != n and time.monotonic() < deadline:
        time.sleep(0.05)
    if queued != n:
        raise RuntimeError(f"{LABELS[side.key]}: expected {n} jobs in {side.amqp_queue}, "
                           f"found {queued}")
    env = {"BENCH_GREEN_BROKER": side.app.conf.broker_url, "BENCH_GREEN_QUEUE": side.queue,
           "BENCH_GREEN_OJS_PREFIX": side.prefix or ""}
    with workers.WorkerProcess(app_module="green_app", pool=pool,
                                     concurrency=CONCURRENCY, queue=side.queue,
                                     workdir=workdir, name=name,
                                     record_var="BENCH_GREEN_RECORD", env=env) as worker:
        spans = worker.spans(n, timeout, f"{LABELS[side.key]} {pool}")
    seconds = workers.elapsed(spans)
    return GreenDrain(n / seconds, seconds, broker.depth(side.amqp_queue))


def run(broker: Admin, broker_url: str, ojs_url: str, settings: Settings,
        log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every pool and side for ``settings.rounds`` rounds; per pool the medians and ratio."""
    tag = f"{os.getpid()}"
    sides = {"plain": _Side("plain", broker_url, tag), "ojs": _Side("ojs", ojs_url, tag)}
    rounds: dict[str, dict[str, list[dict[str, Any]]]] = {
        pool: {key: [] for key in SIDES} for pool in settings.pools}
    workdir = Path(tempfile.mkdtemp(prefix="ojs-bench-green-"))
    try:
        for side in sides.values():
            side.declare()
        for i in range(settings.rounds):
            order = SIDES if i % 2 == 0 else SIDES[::-1]
            for pool in settings.pools:
                for key in order:
                    log(f"green: round {i + 1}/{settings.rounds}, {pool}, {LABELS[key]}, "
                        f"{settings.jobs} jobs")
                    result = drain(sides[key], broker, pool, settings.jobs, settings.timeout_s,
                                   workdir, f"bench-green-{key}-{pool}-{tag}-{i}")
                    rounds[pool][key].append(asdict(result))
    finally:
        for side in sides.values():
            side.cleanup(broker)
        shutil.rmtree(workdir, ignore_errors=True)
    pools = {}
    for pool, by_side in rounds.items():
        medians = {key: {field: statistics.median(r[field] for r in runs)
                         for field in ("jobs_per_s", "seconds")}
                   for key, runs in by_side.items()}
        plain = medians["plain"]["jobs_per_s"]
        pools[pool] = {**medians, "ratio": medians["ojs"]["jobs_per_s"] / plain if plain else None,
                       "rounds": by_side}
    return {"jobs": settings.jobs, "pools": pools,
            "settings": {"concurrency": CONCURRENCY, "sleep_s": SLEEP_S,
                         "rounds": settings.rounds,
                         "worker_flags": ["--without-heartbeat", "--without-gossip"]}}


def render(result: dict[str, Any]) -> list[str]:
    """One row per pool: each side's jobs/s and the ratio."""
    rows: list[tuple[str, ...]] = [(
        f"green drain ({result['jobs']} I/O jobs, -c {result['settings']['concurrency']})",
        "plain Celery jobs/s", "ojs_kombu jobs/s", "ratio (ojs/plain)")]
    for pool, measured in result["pools"].items():
        ratio = measured["ratio"]
        rows.append((pool, f"{measured['plain']['jobs_per_s']:.0f}",
                     f"{measured['ojs']['jobs_per_s']:.0f}",
                     "-" if ratio is None else f"{ratio:.2f}"))
    lines = grid(rows)
    lines.append(f"  each job: time.sleep({result['settings']['sleep_s']:g}) (green); first job "
                 "start to last job end; workers --without-heartbeat --without-gossip")
    return lines
