"""Cost as the work grows: an app of 1, 10 and 100 job queues, ojs_kombu against plain
Celery on the same broker (issue 39).

Each side and queue count gets a private vhost (created and deleted with
``rabbitmqctl``) and one worker subprocess consuming every queue
(``scale_app.py``, threads pool).  Measured, per side and count:

* the time from starting the worker to its ``ready`` line: its first start,
  which creates the vhost's broker objects, and a restart (stopped after the
  round, started again: what a deploy sees, every object already there);
* queues, exchanges and bindings of the vhost at rest (the worker consuming,
  nothing published), and after a round of retries and schedules (one job per
  queue that fails once and retries with a 2 s countdown, one job per queue
  with a 60 s countdown), both from ``rabbitmqctl``; the server's default
  exchanges and the default exchange's implicit bindings are not counted;
* broker memory: the sum of the ``memory`` RabbitMQ reports for the vhost's
  queues (each queue's own process), at rest and after;
* the worker's RSS (its whole process tree), at rest and after;
* ojs_kombu's retry queues: how many, and the idle time after which the broker
  deletes each (its ``x-expires``).

Called by ``run.py --only scale``; see benchmarks/README.rst.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from admin import Ctl, local_ctl, private_vhost  # noqa: E402
from scale_app import make_app, queue_names  # noqa: E402
from scale_ceiling import measure as measure_ceiling  # noqa: E402
from scale_worker import MB, Worker  # noqa: E402

#: The three-node cluster of the quorum-queue run (``--only scale_cluster``): ports and
#: node names of its own, apart from the fault suite's (5681-5683) and the cluster
#: drain's (5691-5693).
CLUSTER_PORTS = (5786, 5787, 5788)
CLUSTER_DIST_PORTS = (25786, 25787, 25788)
CLUSTER_NAME = "ojs-scl"
SIDES = ("plain", "ojs")
LABELS = {"plain": "plain Celery", "ojs": "ojs_kombu"}
COUNTS = (1, 10, 100)
SCHEDULE_COUNTDOWN_S = 60
#: Targets of issue 39 (item 1) checked here.
START_RATIO_MAX = 1.5


@dataclass
class Settings:
    counts: tuple[int, ...] = COUNTS
    quorum: bool = False
    timeout_s: float = 120.0


@dataclass
class Objects:
    queues: int
    exchanges: int
    bindings: int
    queue_memory_mb: float
    retry_queues: int = 0
    retry_queue_expires_s: list[float] = field(default_factory=list)


@dataclass
class ScaleResult:
    side: str
    job_queues: int
    start_s: float
    rest: Objects
    after: Objects
    rss_rest_mb: float
    rss_after_mb: float
    retried: int
    restart_s: float
    #: ``scale_recovery.Recovery`` as a dict: the cluster run's node restart
    recovery: dict[str, Any] | None = None


def count_objects(ctl: Ctl, vhost: str) -> Objects:
    """What the broker holds in ``vhost`` (its default exchanges left out)."""
    def rows(kind: str, *columns: str) -> list[list[str]]:
        out = ctl(f"list_{kind}", "-p", vhost, "--no-table-headers", *columns)
        return [line.split("\t") for line in out.splitlines() if line.strip()]

    queues = rows("queues", "name", "memory", "arguments")
    exchanges = [r for r in rows("exchanges", "name")
                 if r[0] and not r[0].startswith("amq.")]
    bindings = [r for r in rows("bindings", "source_name") if r[0]]
    retry = [q for q in queues if ".ojs.queue.retry." in f".{q[0]}"]
    expires = []
    for q in retry:
        found = re.search(r'"x-expires",\s*(\d+)', q[2] if len(q) > 2 else "")
        if found:
            expires.append(int(found.group(1)) / 1000)
    return Objects(len(queues), len(exchanges), len(bindings),
                   sum(int(q[1]) for q in queues if q[1].isdigit()) / MB, len(retry),
                   sorted(set(expires)))


#: After a side's restart: ``(side, n, broker_url, vhost, workdir)`` -> recovery figures.
Recover = Callable[[str, int, str, str, Path], dict[str, Any]]


def measure(side: str, n: int, broker_url: str, ctl: Ctl, vhost: str, workdir: Path,
            settings: Settings, log: Callable[[str], None],
            recover: Recover | None = None) -> ScaleResult:
    """One side with ``n`` job queues in ``vhost`` (``broker_url`` points at it)."""
    worker = Worker(side, broker_url, n, workdir, settings.quorum)
    try:
        start_s = worker.wait_ready()
        time.sleep(1.0)  # the consumers and remote control settle
        rest, rss_rest = count_objects(ctl, vhost), worker.rss_mb()
        log(f"scale: {LABELS[side]} x{n}: ready in {start_s:.2f}s, {rest.queues} queues at "
            "rest; a round of retries and schedules ...")
        app = make_app(broker_url, side, quorum=settings.quorum)
        try:
            retry_once, noop = app.tasks["scale.retry_once"], app.tasks["scale.noop"]
            for queue in queue_names(n):
                retry_once.apply_async(("retry",), queue=queue)
                noop.apply_async(("scheduled",), queue=queue, countdown=SCHEDULE_COUNTDOWN_S)
        finally:
            app.close()
        deadline = time.monotonic() + settings.timeout_s
        while worker.done() < n and time.monotonic() < deadline:
            time.sleep(0.1)
        retried = worker.done()
        after, rss_after = count_objects(ctl, vhost), worker.rss_mb()
    finally:
        worker.stop()
    again = Worker(side, broker_url, n, workdir, settings.quorum, tag="-restart")
    try:
        restart_s = again.wait_ready()
    finally:
        again.stop()
    log(f"scale: {LABELS[side]} x{n}: restarted in {restart_s:.2f}s")
    recovery = None
    if recover is not None:
        log(f"scale: {LABELS[side]} x{n}: restarting a node with jobs waiting ...")
        recovery = recover(side, n, broker_url, vhost, workdir)
    return ScaleResult(side, n, start_s, rest, after, rss_rest, rss_after, retried, restart_s,
                       recovery)


def run(broker_url: str, settings: Settings, *, ctl: Ctl = local_ctl,
        log: Callable[[str], None] = print, recover: Recover | None = None) -> dict[str, Any]:
    """Every queue count, plain Celery then ojs_kombu (alternating per count)."""
    results: list[ScaleResult] = []
    netloc = urlsplit(broker_url).netloc
    with tempfile.TemporaryDirectory(prefix="ojs-bench-scale-") as tmp:
        for i, n in enumerate(settings.counts):
            for side in (SIDES if i % 2 == 0 else SIDES[::-1]):
                name = f"ojs-scale-{os.getpid()}-{side}-{n}"
                with private_vhost(ctl, name) as vhost:
                    scheme = "ojs" if side == "ojs" else "amqp"
                    url = f"{scheme}://{netloc}/{vhost}"
                    results.append(measure(side, n, url, ctl, vhost, Path(tmp), settings,
                                           log, recover))
    summary = summarize(results, settings)
    if not settings.quorum:
        top = settings.counts[-1]
        log(f"scale: the broker's ceiling, {top} job queues declared by a bare client ...")
        summary["ceiling"] = {"job_queues": top, "seconds": measure_ceiling(broker_url, ctl, top)}
    return summary


def run_cluster(settings: Settings, log: Callable[[str], None] = print) -> dict[str, Any]:
    """:func:`run` with quorum queues on a three-node cluster started for it (and
    stopped and deleted afterwards, whatever happens); counted on its first node."""
    if str(HERE.parent) not in sys.path:
        sys.path.append(str(HERE.parent))  # the fault suite's cluster
    from scale_recovery import measure as measure_recovery

    from faults.cluster import Cluster

    log(f"scale: starting a three-node cluster on ports {CLUSTER_PORTS} ...")
    with Cluster(CLUSTER_PORTS, CLUSTER_DIST_PORTS, name=CLUSTER_NAME) as cluster:
        first = cluster.nodes[0]
        quorum = Settings(counts=settings.counts, quorum=True, timeout_s=settings.timeout_s)
        try:
            return run(f"amqp://guest:guest@127.0.0.1:{first.port}//", quorum,
                       ctl=first.ctl, log=log,
                       recover=lambda *args: asdict(measure_recovery(*args, cluster=cluster)))
        finally:
            log("scale: stopping the cluster ...")


def summarize(results: list[ScaleResult], settings: Settings) -> dict[str, Any]:
    by = {(r.side, r.job_queues): r for r in results}
    counts = sorted({r.job_queues for r in results})
    per_queue: dict[str, dict[str, float | None]] = {}
    for side in SIDES:
        lo, hi = by.get((side, counts[0])), by.get((side, counts[-1]))
        if lo is None or hi is None or hi.job_queues == lo.job_queues:
            continue
        span = hi.job_queues - lo.job_queues
        per_queue[side] = {
            f"{what}_{kind}": (getattr(getattr(hi, what), kind)
                               - getattr(getattr(lo, what), kind)) / span
            for what in ("rest", "after") for kind in ("queues", "exchanges", "bindings",
                                                        "queue_memory_mb")}
        per_queue[side]["rss_rest_mb"] = (hi.rss_rest_mb - lo.rss_rest_mb) / span
        per_queue[side]["start_s"] = (hi.start_s - lo.start_s) / span
    both = [n for n in counts if ("ojs", n) in by and ("plain", n) in by]
    start_ratio = {n: by[("ojs", n)].start_s / by[("plain", n)].start_s for n in both}
    recovery_ratio = {n: by[("ojs", n)].recovery["queues_online_s"]
                      / by[("plain", n)].recovery["queues_online_s"]
                      for n in both if by[("ojs", n)].recovery and by[("plain", n)].recovery}
    restart_ratio = {n: by[("ojs", n)].restart_s / by[("plain", n)].restart_s for n in both}
    top = counts[-1]
    return {"results": [asdict(r) for r in results], "per_queue": per_queue,
            "start_ratio": start_ratio, "restart_ratio": restart_ratio,
            "recovery_ratio": recovery_ratio,
            "quorum": settings.quorum,
            "target": {"name": f"worker start, {top} queues, <= {START_RATIO_MAX}x plain Celery",
                       "ratio": start_ratio.get(top),
                       "met": start_ratio.get(top) is not None
                       and start_ratio[top] <= START_RATIO_MAX}}


def render(result: dict[str, Any]) -> list[str]:
    from report import grid

    kind = "quorum" if result.get("quorum") else "classic"
    rows: list[tuple[str, ...]] = [(
        f"scale ({kind} queues)", "job queues", "start s (first/restart)", "queues rest/after",
        "exchanges rest/after", "bindings rest/after", "queue mem MB rest/after",
        "worker RSS MB rest/after", "retry queues (idle expiry s)")]
    for r in result["results"]:
        rest, after = r["rest"], r["after"]
        expiry = ",".join(f"{e:.0f}" for e in after["retry_queue_expires_s"]) or "-"
        restart = "-" if r.get("restart_s") is None else f"{r['restart_s']:.2f}"
        rows.append((LABELS[r["side"]], str(r["job_queues"]), f"{r['start_s']:.2f}/{restart}",
                     f"{rest['queues']}/{after['queues']}",
                     f"{rest['exchanges']}/{after['exchanges']}",
                     f"{rest['bindings']}/{after['bindings']}",
                     f"{rest['queue_memory_mb']:.1f}/{after['queue_memory_mb']:.1f}",
                     f"{r['rss_rest_mb']:.0f}/{r['rss_after_mb']:.0f}",
                     f"{after['retry_queues']} ({expiry})"))
    lines = grid(rows)
    for side, slope in result["per_queue"].items():
        lines.append(
            f"  per added job queue, {LABELS[side]}: at rest {slope['rest_queues']:.2f} "
            f"queues, {slope['rest_exchanges']:.2f} exchanges, {slope['rest_bindings']:.2f} "
            f"bindings, {slope['rest_queue_memory_mb'] * 1024:.0f} KB queue memory; after "
            f"{slope['after_queues']:.2f} queues, {slope['after_exchanges']:.2f} exchanges, "
            f"{slope['after_bindings']:.2f} bindings; worker RSS "
            f"{slope['rss_rest_mb'] * 1024:.0f} KB; start {slope['start_s'] * 1000:.1f} ms")
    lines.append("  start ratio (ojs_kombu / plain Celery), first start: " + ", ".join(
        f"{n} queues {ratio:.2f}x" for n, ratio in result["start_ratio"].items()))
    lines.append("  restart ratio (every broker object there): " + ", ".join(
        f"{n} queues {ratio:.2f}x" for n, ratio in result.get("restart_ratio", {}).items()))
    lines += _ceiling_lines(result) + _recovery_lines(result)
    target = result["target"]
    verdict = "-" if target["ratio"] is None else ("met" if target["met"] else "not met")
    ratio = "-" if target["ratio"] is None else f"{target['ratio']:.2f}"
    return [*lines, "", *grid([("target (issue 39)", "ratio", "status"),
                               (target["name"], ratio, verdict)])]


def _ceiling_lines(result: dict[str, Any]) -> list[str]:
    """The bare client's declaration times beside the workers' first starts."""
    ceiling = result.get("ceiling")
    if not ceiling:
        return []
    n, raw = ceiling["job_queues"], ceiling["seconds"]
    starts = {r["side"]: r["start_s"] for r in result["results"] if r["job_queues"] == n}
    lines = [f"  broker's ceiling, {n} job queues declared by bare py-amqp (pipelined, "
             f"4 channels): plain Celery's objects {raw['plain']:.2f}s, ojs_kombu's "
             f"{raw['ojs']:.2f}s ({raw['ojs_no_priority']:.2f}s without x-max-priority)"]
    if len(starts) == 2:
        lines.append(f"  first start, ojs_kombu minus plain Celery: workers "
                     f"{starts['ojs'] - starts['plain']:+.2f}s, bare client "
                     f"{raw['ojs'] - raw['plain']:+.2f}s (what the broker alone adds)")
    return lines


def _recovery_lines(result: dict[str, Any]) -> list[str]:
    """The node restart of the cluster run, per side and count, and its ratio."""
    lines = []
    for r in result["results"]:
        rec = r.get("recovery")
        if rec:
            lines.append(
                f"  node restart, {LABELS[r['side']]} x{r['job_queues']}: node back "
                f"{rec['node_back_s']:.1f}s, every quorum queue online "
                f"{rec['queues_online_s']:.1f}s, "
                f"{rec['published']} jobs drained by {rec['drained_s']:.1f}s: ran {rec['ran']}, "
                f"lost {rec['lost']}, run twice {rec['duplicates']}")
    ratios = result.get("recovery_ratio") or {}
    if ratios:
        lines.append("  recovery ratio (queues online, ojs_kombu / plain Celery; target <= 2x, "
                     "none lost): " + ", ".join(f"{n} queues {ratio:.2f}x"
                                                for n, ratio in ratios.items()))
    return lines
