"""Poison storm, backlog form: jobs of a type no task handles, queued while no worker
runs, then one worker started (as after a deploy that dropped a task, or a foreign
producer's new type that reached the queue before its handler).

Per round and side (three rounds at least, alternating which side goes
first): declare the side's queue and dead-letter queue, publish N poison jobs
with pipelined confirms and no worker running (ojs_kombu: valid OJS envelopes
of an unknown type, ``UNKNOWN_JOB_TYPE``; plain Celery: protocol-2 messages of
an unregistered task into a queue with a dead-letter exchange, which its
consumer rejects), then start one worker (``-P solo`` by default) and poll the
dead-letter queue's depth every ``POLL_S``.  The rate is measured from the
first dead letter seen to the last (worker start-up is left out), and the run
then counts where each message ended: published, dead-lettered, left, lost, duplicated.
"""

from __future__ import annotations

import os
import secrets
import statistics
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import amqp
import storm_ceiling
import workers
from poison_storm import (
    CONCURRENCY,
    Admin,
    StormSide,
    Worker,
    declare,
    delete_side,
    route_of,
    where_each_ended,
)
from storm_messages import PipelinedPublisher, ojs_poison, plain_poison

#: The storm worker's prefetch (Celery's default multiplier, 4, times its concurrency),
#: and a larger one, for the raw ceiling.
CEILING_PREFETCH = (4 * CONCURRENCY, 64)
#: The depth poll: its period bounds the error of the first and last dead letter's time.
POLL_S = 0.01
LABELS = {"plain": "plain Celery (unregistered task, rejected into a DLX)",
          "ojs": "ojs_kombu (unknown job type, UNKNOWN_JOB_TYPE)"}
#: The kind of each side's storm messages (``storm_messages``) that the backlog holds.
KINDS = {"plain": "unregistered task", "ojs": "unknown type"}


def measure_side(side: StormSide, admin: Admin, connect: Callable[[], amqp.Connection],
                 jobs: int, timeout_s: float, workdir: Any) -> dict[str, Any]:
    app = side.make_app()
    route = route_of(side, app)
    connection = connect()
    worker: Worker | None = None
    try:
        declare(side, app, route)
        poison = (ojs_poison(jobs, route.routing_key) if side.key == "ojs"
                  else plain_poison(app, jobs))
        poison = [message for message in poison if message[0] == KINDS[side.key]]
        PipelinedPublisher(connection).publish(poison, route.exchange, route.routing_key)
        queued = admin.depth(route.job_queue)
        worker = Worker(side, workdir)
        started = time.perf_counter()
        first, last = storm_ceiling.watch_dead_letters(
            admin, route.dead_letter_queue, len(poison), timeout_s, POLL_S, worker.check_alive)
        timed_out = last[1] < len(poison)
        worker.terminate()
        _dead_letters, kinds = where_each_ended(worker, connection, route, poison)
    finally:
        if worker is not None:
            worker.kill()
        with suppress(Exception):
            connection.close()
        app.close()
        delete_side(side, route, admin)
    counts = kinds[KINDS[side.key]]
    span = (last[0] - first[0]) if first is not None else 0.0
    return {"side": side.key, "published": len(poison), "queued_before_start": queued,
            "dead_lettered": counts["dead_lettered"], "left": counts["left"],
            "lost": counts["lost"], "duplicated": counts["duplicated"],
            "timed_out": timed_out, "first_dead_letter_s": first[0] - started if first else None,
            "span_s": span,
            "rate": (last[1] - first[1]) / span if first is not None and span > 0 else None}


def run(admin: Admin, connect: Callable[[], amqp.Connection], broker_url: str, ojs_url: str,
        jobs: int = 5000, pool: str = "solo", timeout_s: float = 120.0, rounds: int = 3,
        log: Callable[[str], None] = print) -> dict[str, Any]:
    """``rounds`` rounds, alternating which side goes first, each side with fresh names;
    the median rate of each side, their ratio and the target."""
    tag = f"{os.getpid()}-{secrets.token_hex(3)}"
    plain_url = "pyamqp://" + broker_url.partition("://")[2]
    urls = {"plain": plain_url, "ojs": ojs_url}
    sides: dict[str, list[dict[str, Any]]] = {"plain": [], "ojs": []}
    with workers.workdir("storm") as workdir:
        for round_ in range(rounds):
            for key in ("plain", "ojs") if round_ % 2 == 0 else ("ojs", "plain"):
                log(f"storm backlog: round {round_ + 1}/{rounds}, {jobs} jobs, {pool}, "
                    f"{LABELS[key]} ...")
                side = StormSide(key, pool, f"bench-backlog-{key}-{tag}-{round_}", urls[key])
                sides[key].append(measure_side(side, admin, connect, jobs, timeout_s, workdir))
    ceiling = []
    for prefetch in CEILING_PREFETCH:
        for mode in storm_ceiling.MODES:
            log(f"storm backlog: raw ceiling, {mode}, prefetch {prefetch} ...")
            ceiling.append(storm_ceiling.measure(
                admin, connect, ojs_url, mode, jobs, prefetch,
                f"bench-ceiling-{mode}-{prefetch}-{tag}", POLL_S, timeout_s))
    medians = {key: statistics.median(r["rate"] or 0.0 for r in runs)
               for key, runs in sides.items()}
    ratio = medians["ojs"] / medians["plain"] if medians["plain"] and medians["ojs"] else None
    clean = all(r["lost"] == 0 and r["duplicated"] == 0 and not r["timed_out"]
                for runs in sides.values() for r in runs)
    return {"rounds": sides, "median_rate": medians, "ratio": ratio, "target": 1.0,
            "met": bool(clean and ratio is not None and ratio >= 1.0), "ceiling": ceiling,
            "settings": {"jobs": jobs, "pool": pool, "poll_s": POLL_S, "timeout_s": timeout_s,
                         "rounds": rounds}}


def render(result: dict[str, Any]) -> list[str]:
    """The backlog table: one row per side and round, the medians, then the ratio."""
    settings = result["settings"]
    lines = [f"Poison storm, backlog form: {settings['jobs']} jobs queued before one "
             f"-P {settings['pool']} worker starts; rate from the first dead letter to the "
             f"last; {settings['rounds']} round(s), medians", "",
             f"{'side':<56} {'round':>5} {'dead-lettered':>13} {'lost':>5} {'dup':>4} "
             f"{'span s':>7} {'per s':>8}"]
    for key, runs in result["rounds"].items():
        for number, side in enumerate(runs, 1):
            rate = f"{side['rate']:.0f}" if side["rate"] else "-"
            lines.append(f"{LABELS[key]:<56} {number:>5} {side['dead_lettered']:>13} "
                         f"{side['lost']:>5} {side['duplicated']:>4} {side['span_s']:>7.2f} "
                         f"{rate:>8}" + ("  TIMED OUT" if side["timed_out"] else ""))
        lines.append(f"{LABELS[key]:<56} {'median':>5} {'':>13} {'':>5} {'':>4} {'':>7} "
                     f"{result['median_rate'][key]:>8.0f}")
    ratio = result["ratio"]
    lines.append(f"ojs_kombu / plain Celery: {ratio:.2f}x (target >= {result['target']:.1f}x, "
                 f"nothing lost or doubled): {'met' if result['met'] else 'NOT met'}"
                 if ratio is not None else "ojs_kombu / plain Celery: no rate (see counts)")
    if result.get("ceiling"):
        lines += ["", *storm_ceiling.render(result["ceiling"])]
        lines += _beside_the_ceiling(result)
    return lines


def _beside_the_ceiling(result: dict[str, Any]) -> list[str]:
    """The target's ratio and the ceiling's against the same plain Celery rate: the raw
    copy at the storm worker's prefetch is what the binding's dead letter allows."""
    copy = next((row["rate"] for row in result["ceiling"]
                 if row["mode"] == "copy" and row["prefetch"] == CEILING_PREFETCH[0]), None)
    plain, ojs = result["median_rate"].get("plain"), result["median_rate"].get("ojs")
    if not (copy and plain and ojs):
        return []
    return [f"ceiling beside the target (prefetch {CEILING_PREFETCH[0]}): raw copy / plain "
            f"Celery {copy / plain:.2f}x; ojs_kombu / raw copy {ojs / copy:.2f}x"]
