"""Scheduling scenario: where delayed jobs wait (worker memory vs broker) and how late they run.

Plain Celery hands an ``eta``/``countdown`` task to a worker at once and the
worker keeps it in memory until it is due; ojs_kombu parks it in the broker's
TTL ladder (``{prefix}.ojs.queue.schedule.{k}``) and the worker only sees it
when it is due.  So each side gets one real worker *subprocess* (its RSS is
measured apart from the publisher), is loaded with long delays (memory), then
with short ones (lateness).  Called by ``run.py``; see benchmarks/README.rst.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import secrets
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from celery.app.task import Task
from kombu.utils.url import parse_url

from ojs_kombu import enqueue_many

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the worker subprocess imports it the same way (PYTHONPATH)
import workers  # noqa: E402
from admin import delete_swept, list_broker  # noqa: E402
from scheduling_app import IDLE, TASK_NAME  # noqa: E402
from scheduling_worker import (  # noqa: E402
    CONCURRENCY,
    MB,
    POOL,
    SchedSide,
    Worker,
    wait_ready,
    wait_recorded,
)

QUEUE_OJS = "sched"
COUNTDOWN_RANGE = (60.0, 3600.0)
WARMUP = 20
#: A scheduled job may start this much before its due time (clock resolution).
EARLY_TOLERANCE_S = 0.001
#: Informational targets from the spec, for the ojs_kombu side.
TARGET_GROWTH_MB = 5.0
TARGET_P99_MS = 250.0


@dataclass
class Settings:
    """What the scenario loads each side with (``run.py`` flags)."""

    memory_jobs: int = 10_000
    settle_s: float = 15.0
    lateness_jobs: int = 1_000
    window_s: float = 30.0
    #: Extra seconds, after the last due time, the lateness jobs may take to run.
    grace_s: float = 30.0
    #: Seconds ahead the memory jobs are due, from and to (``--schedule-range``).
    countdown_range: tuple[float, float] = COUNTDOWN_RANGE
    #: 0: each memory job is one confirmed ``apply_async``.  N > 0: ojs_kombu
    #: sends them with ``enqueue_many`` N at a time (every job confirmed), plain
    #: Celery, which has no batch publish, with ``apply_async`` and no confirms
    #: (``--schedule-batch``; what a million jobs needs to be published in minutes).
    batch: int = 0


class Admin(Protocol):
    """The part of ``admin.Broker`` used here (deleting what a side declared)."""

    def delete(self, queues: list[str], exchanges: list[str]) -> None: ...


@dataclass
class SideResult:
    rss_before_mb: float
    rss_after_mb: float
    rss_growth_mb: float
    #: RSS and jobs held at the end of the lateness part (memory jobs still waiting).
    rss_end_mb: float
    held_by_worker_end: int | None
    #: Seconds to publish the memory jobs (each confirmed), and the rate.
    publish_s: float
    publish_jobs_per_s: float
    #: At the "after" measurement: messages delivered to the worker and not
    #: acked (held in its memory) and messages ready in the broker.
    held_by_worker: int | None
    waiting_in_broker: int | None
    broker_queues: int | None
    broker_queue_memory_mb: float | None
    lateness_jobs: int
    lateness_ran: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    min_ms: float | None
    early: int


# -- broker inspection ----------------------------------------------------


def _vhost(broker_url: str) -> str:
    return parse_url(broker_url).get("virtual_host") or "/"


def queue_stats(side: SchedSide) -> dict[str, Any]:
    """Queues of the side's job topology: count, ready and unacked messages, memory."""
    rows = list_broker("queues", ["name", "messages_ready", "messages_unacknowledged", "memory"],
                       _vhost(side.broker_url))
    if rows is None:
        return {"held_by_worker": None, "waiting_in_broker": None, "broker_queues": None,
                "broker_queue_memory_mb": None}
    mine = [row for row in rows if len(row) == 4 and side.owns_queue(row[0])]
    return {
        "held_by_worker": sum(int(row[2]) for row in mine),
        "waiting_in_broker": sum(int(row[1]) for row in mine),
        "broker_queues": len(mine),
        "broker_queue_memory_mb": sum(int(row[3]) for row in mine) / MB,
    }


def delete_side(side: SchedSide, admin: Admin) -> None:
    """Delete what the side declared: the known names, then anything else with its marker."""
    queues, exchanges = side.known_entities()
    delete_swept(admin, _vhost(side.broker_url), queues, exchanges,
                 lambda name: side.marker in name)


# -- the measurement -------------------------------------------------------


def publish_memory_jobs(task: Task, n: int, rng: random.Random,
                        countdown_range: tuple[float, float] = COUNTDOWN_RANGE,
                        producer: Any = None) -> float:
    """``n`` jobs due within ``countdown_range`` seconds, one ``apply_async`` each (on
    ``producer`` if given); returns the seconds publishing took."""
    low, high = countdown_range
    started = time.perf_counter()
    for _ in range(n):
        countdown = rng.uniform(low, high)
        task.apply_async((IDLE, time.time() + countdown), countdown=countdown,
                         producer=producer)
    return time.perf_counter() - started


def publish_memory_batches(side: SchedSide, n: int, batch: int, rng: random.Random,
                           countdown_range: tuple[float, float]) -> float:
    """The memory jobs at each side's fastest: ``enqueue_many`` for ojs_kombu, an
    unconfirmed ``apply_async`` loop for plain Celery; returns the seconds it took."""
    app = side.make_app(confirm=False)
    task = app.tasks[TASK_NAME]
    try:
        if side.ojs_prefix is None:
            with app.producer_or_acquire() as producer:
                return publish_memory_jobs(task, n, rng, countdown_range, producer)
        low, high = countdown_range
        started = time.perf_counter()
        for start in range(0, n, batch):
            jobs = []
            for _ in range(min(batch, n - start)):
                countdown = rng.uniform(low, high)
                jobs.append(task.s(IDLE, time.time() + countdown).set(countdown=countdown))
            enqueue_many(app, jobs)
        return time.perf_counter() - started
    finally:
        app.close()


def publish_lateness_jobs(task: Task, n: int, window_s: float, rng: random.Random) -> float:
    """``n`` jobs each due at a random moment of the next ``window_s``; returns the last due."""
    last = 0.0
    for _ in range(n):
        due = time.time() + rng.uniform(0, window_s)
        task.apply_async(("late", due), eta=dt.datetime.fromtimestamp(due, dt.UTC))
        last = max(last, due)
    return last


def measure_side(side: SchedSide, settings: Settings, workdir: Path, seed: int) -> SideResult:
    """Start the worker, then the memory part, then the lateness part; always stop it."""
    app = side.make_app()
    task = app.tasks[TASK_NAME]
    rng = random.Random(seed)
    worker = Worker(side, workdir)
    try:
        wait_ready(app, worker)
        for _ in range(WARMUP):  # connections, imports and the first deliveries on both ends
            task.apply_async(("warm", time.time()))
        if len(wait_recorded(worker, "warm", WARMUP, 60)) < WARMUP:
            raise RuntimeError(f"{side.label}: warm-up jobs did not run\n{worker.log_tail()}")
        time.sleep(2)
        before = worker.rss_mb()
        if settings.batch:
            publish_s = publish_memory_batches(side, settings.memory_jobs, settings.batch, rng,
                                               settings.countdown_range)
        else:
            publish_s = publish_memory_jobs(task, settings.memory_jobs, rng,
                                            settings.countdown_range)
        time.sleep(settings.settle_s)
        after = worker.rss_mb()
        stats = queue_stats(side)
        last_due = publish_lateness_jobs(task, settings.lateness_jobs, settings.window_s, rng)
        timeout = last_due - time.time() + settings.grace_s
        lateness = wait_recorded(worker, "late", settings.lateness_jobs, timeout)
        end = worker.rss_mb()
        held_end = queue_stats(side)["held_by_worker"]
    finally:
        worker.stop()
        app.close()
    return SideResult(
        rss_before_mb=before, rss_after_mb=after, rss_growth_mb=after - before, rss_end_mb=end,
        held_by_worker_end=held_end,
        publish_s=publish_s, publish_jobs_per_s=settings.memory_jobs / publish_s, **stats,
        lateness_jobs=settings.lateness_jobs, lateness_ran=len(lateness),
        early=sum(1 for value in lateness if value < -EARLY_TOLERANCE_S),
        **_percentiles_ms(lateness),
    )


def _percentiles_ms(values: list[float]) -> dict[str, float | None]:
    if len(values) < 2:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None, "min_ms": None}
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50_ms": cuts[49] * 1e3, "p99_ms": cuts[98] * 1e3, "max_ms": max(values) * 1e3,
            "min_ms": min(values) * 1e3}


def make_sides(broker_url: str, ojs_url: str) -> list[SchedSide]:
    """Both sides, named after this run (pid and a random suffix), so nothing is shared."""
    tag = f"{os.getpid()}-{secrets.token_hex(3)}"
    plain = f"bench-sched-plain-{tag}"
    ojs = f"bench-sched-ojs-{tag}"
    return [SchedSide("plain", "plain Celery", plain, broker_url, plain),
            SchedSide("ojs", "ojs_kombu", ojs, ojs_url, QUEUE_OJS, ojs_prefix=ojs)]


def run(admin: Admin, broker_url: str, ojs_url: str, settings: Settings,
        log: Callable[[str], None] = print) -> dict[str, Any]:
    """Both sides one after the other (they would share 2 cores otherwise), then targets."""
    results: dict[str, SideResult] = {}
    sides = make_sides(broker_url, ojs_url)
    seed = secrets.randbits(32)
    with workers.workdir("sched") as workdir:
        for side in sides:
            log(f"scheduling: {side.label} ...")
            try:
                results[side.key] = measure_side(side, settings, workdir, seed)
            finally:
                delete_side(side, admin)
    ojs = results["ojs"]
    checks = {
        "rss_growth_mb": {"target": f"< {TARGET_GROWTH_MB:g}",
                          "met": ojs.rss_growth_mb < TARGET_GROWTH_MB},
        "p99_ms": {"target": f"< {TARGET_P99_MS:g}",
                   "met": ojs.p99_ms is not None and ojs.p99_ms < TARGET_P99_MS
                   and ojs.lateness_ran == ojs.lateness_jobs},
        "early": {"target": "= 0", "met": ojs.early == 0 and ojs.lateness_ran > 0},
    }
    return {"plain": asdict(results["plain"]), "ojs": asdict(ojs), "targets": checks,
            "settings": {**asdict(settings),
                         "countdown_range_s": list(settings.countdown_range),
                         "pool": POOL, "concurrency": CONCURRENCY, "warmup": WARMUP,
                         "seed": seed}}


def _span(countdown_range: Any) -> str:
    low, high = countdown_range
    return f"due in {low / 3600:g} h to {high / 86400:g} d" if high >= 86400 \
        else f"due in {low:g} s to {high:g} s"


def render(result: dict[str, Any]) -> list[str]:
    """Table lines: one row per number, plain and ojs side by side, ojs targets at the end."""
    plain, ojs, targets = result["plain"], result["ojs"], result["targets"]

    def cell(value: Any, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    def row(title: str, key: str, fmt: str, target: str | None = None) -> tuple[str, ...]:
        check = targets.get(target or "")
        return (title, cell(plain[key], fmt), cell(ojs[key], fmt),
                check["target"] if check else "",
                ("met" if check["met"] else "not met") if check else "")

    settings = result["settings"]
    rows = [
        ("scheduling", "plain Celery", "ojs_kombu", "target (ojs)", "status"),
        row("worker RSS before MB", "rss_before_mb", ".1f"),
        row(f"worker RSS after MB ({settings['memory_jobs']} delayed, "
            f"{_span(settings.get('countdown_range_s', COUNTDOWN_RANGE))})", "rss_after_mb",
            ".1f"),
        row("worker RSS growth MB", "rss_growth_mb", ".1f", "rss_growth_mb"),
        row("jobs held by the worker", "held_by_worker", "d"),
        row("jobs waiting in the broker", "waiting_in_broker", "d"),
        row("broker queues used", "broker_queues", "d"),
        row("broker queue memory MB", "broker_queue_memory_mb", ".1f"),
        ("broker queue memory per delayed job, bytes",
         *[cell(None if side["broker_queue_memory_mb"] is None
                else side["broker_queue_memory_mb"] * MB / settings["memory_jobs"], ".0f")
           for side in (plain, ojs)], "", ""),
        row("delayed publish jobs/s" + (
            f" (ojs: enqueue_many x{settings['batch']}, plain: no confirms)"
            if settings.get("batch") else " (each confirmed)"), "publish_jobs_per_s", ".0f"),
        row("worker RSS at end MB", "rss_end_mb", ".1f"),
        row("jobs held by the worker at end", "held_by_worker_end", "d"),
        row(f"lateness jobs run (of {settings['lateness_jobs']})", "lateness_ran", "d"),
        row("lateness p50 ms", "p50_ms", ".1f"),
        row("lateness p99 ms", "p99_ms", ".1f", "p99_ms"),
        row("lateness max ms", "max_ms", ".1f"),
        row("started early (< -1 ms)", "early", "d", "early"),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    text = [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in rows]
    return [text[0], "-+-".join("-" * w for w in widths), *text[1:]]
