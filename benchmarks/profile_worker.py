"""Where a worker's main process spends its time per delivery: ojs_kombu beside plain Celery.

For each pool (``prefork -c 2``, ``threads -c 4``) and side (ojs_kombu on its defaults,
plain Celery with ``task_acks_late=True`` and on its own defaults, each on a classic
queue; ``--ojs-priority``: ojs_kombu on the other parts' priority queues), fill the
side's queue with ``--jobs`` no-op jobs, start one ``celery worker`` subprocess
(``drain_app``) and wait until every job ran.  Two readings of the worker's main process:

* its CPU time (``/proc/<pid>/stat``, user + system) from the first job recorded to the
  last, per delivery: little disturbed by other load on the machine, unlike wall-clock;
* with ``--cprofile``, a second run under cProfile timed by the main thread's CPU clock
  (``cpu_profile.py``: the consumer's event loop, from ``worker_ready`` on), its
  functions' own time per delivery, largest first, and the same summed per package.
  cProfile slows every call about alike, so read its shares, not its absolute figures;
* with ``--stages``, a third run with the main thread's real CPU time clocked per stage
  of a delivery (``stage_clock.py``: receive, envelope check, strategy, accepted, ready,
  ack flush, socket writes), the sides side by side.

Run from the repository root::

    .venv/bin/python benchmarks/profile_worker.py --jobs 5000 --cprofile
    .venv/bin/python benchmarks/profile_worker.py --jobs 20000 --pools prefork:2 --stages \
        --sides ojs,plaindef
    .venv/bin/python benchmarks/profile_worker.py --poison --pools solo:1 --cprofile

``--poison`` queues jobs of a type no task handles instead (the poison storm's backlog:
ojs_kombu dead-letters them with ``UNKNOWN_JOB_TYPE``; plain Celery rejects them, into
nothing here, as its queue has no dead-letter exchange) and times until the queue is empty.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from contextlib import suppress
from pathlib import Path
from typing import Any, TypedDict
from urllib.parse import urlparse

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workers
from admin import Broker
from measure import publish
from raw_side import raw_drain
from sides import DEFAULT_BROKER, TASK_ARGS, Side, make_ojs_side, make_plain_side

#: cProfile entries that are the event loop waiting, not work.
_IDLE = ("poll", "select", "epoll", "sleep", "wait", "acquire")
_TICKS = os.sysconf("SC_CLK_TCK")
#: ``--poison``: a job type no worker task handles.
POISON_TYPE = "bench.unknown"


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of one process (not its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def children_cpu(pid: int) -> float:
    """CPU seconds of the running children of ``pid`` (the pool processes)."""
    total = 0.0
    for child in psutil.Process(pid).children():
        with suppress(psutil.Error):
            times = child.cpu_times()
            total += times.user + times.system
    return total


def broker_pid(port: int) -> int | None:
    """The pid of the process listening on ``port`` (the RabbitMQ node), if readable."""
    with suppress(psutil.Error):
        for conn in psutil.net_connections("tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
                return int(conn.pid)
    return None


class CpuMeter:
    """CPU seconds of the worker's main process, its pool processes and the broker, read
    at the first job and after the last: where each job's CPU goes, whole-machine."""

    def __init__(self, pid: int, broker: int | None) -> None:
        self.pid, self.broker = pid, broker
        self.start: tuple[float, float, float] | None = None

    def read(self) -> tuple[float, float, float]:
        return (process_cpu(self.pid), children_cpu(self.pid),
                process_cpu(self.broker) if self.broker else 0.0)

    def mark(self) -> None:
        self.start = self.read()

    def per_delivery(self, n: int) -> dict[str, float]:
        end, start = self.read(), self.start or (0.0, 0.0, 0.0)
        main, pool, broker = ((e - s) * 1e6 / n for e, s in zip(end, start, strict=True))
        return {"main_cpu_us_per_delivery": round(main, 1),
                "pool_cpu_us_per_delivery": round(pool, 1),
                "broker_cpu_us_per_delivery": round(broker, 1)}


def _package(filename: str) -> str:
    for name in ("ojs_kombu", "kombu", "amqp", "celery", "billiard", "vine"):
        if f"/{name}/" in filename:
            return name
    return "stdlib/builtins"


def summarize_profile(path: Path, n: int, top: int) -> dict[str, Any]:
    """Own time per delivery (µs) of the busiest functions and of each package."""
    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    rows: list[tuple[float, int, str]] = []
    packages: dict[str, float] = {}
    for (filename, line, function), (_cc, calls, tottime, _ct, _callers) in stats.items():
        if any(word in function for word in _IDLE) and filename == "~":
            continue
        package = _package(filename)
        packages[package] = packages.get(package, 0.0) + tottime
        short = filename.rsplit("site-packages/", 1)[-1].rsplit("ojs_kombu/", 1)[-1]
        rows.append((tottime, calls, f"{short}:{line}({function})"))
    rows.sort(reverse=True)
    return {
        "us_per_delivery": round(sum(packages.values()) * 1e6 / n, 1),
        "packages": {k: round(v * 1e6 / n, 1) for k, v in
                     sorted(packages.items(), key=lambda kv: -kv[1])},
        "functions": [{"us": round(t * 1e6 / n, 2), "calls_per_delivery": round(c / n, 2),
                       "function": f} for t, c, f in rows[:top]],
    }


def measure(side: Side, broker: Broker, pool: str, concurrency: int, n: int,
            workdir: Path, name: str, profile: Path | None, poison: bool = False,
            extra_args: tuple[str, ...] = (), acks_early: bool = False,
            no_priority: bool = False, stages: Path | None = None,
            unchecked: bool = False) -> dict[str, Any]:
    broker.purge(side.amqp_queue)
    if poison:  # jobs of a type no task handles: dead-lettered (ojs_kombu) or rejected
        for _ in range(n):
            side.app.send_task(POISON_TYPE, TASK_ARGS, queue=side.celery_queue)
    else:
        publish(side, n)
    env = {
        "BENCH_DRAIN_BROKER": side.app.conf.broker_url,
        "BENCH_DRAIN_QUEUE": side.celery_queue,
        "BENCH_DRAIN_OJS_PREFIX": side.app.conf.get("ojs_prefix") or "",
        "BENCH_DRAIN_ACKS_EARLY": "1" if acks_early else "",
        "BENCH_DRAIN_OJS_NO_PRIORITY": "1" if no_priority else "",
        "BENCH_DRAIN_UNCHECKED": "1" if unchecked else "",
    }
    with workers.WorkerProcess(
            app_module="drain_app", pool=pool, concurrency=concurrency,
            queue=side.celery_queue, workdir=workdir, name=name,
            record_var="BENCH_DRAIN_RECORD", env=env, profile=profile,
            extra_args=extra_args, stages=stages) as worker:
        meter = CpuMeter(worker.pid, broker_pid(urlparse(side.app.conf.broker_url).port
                                                  or 5672))
        if poison:
            seconds = _wait_empty(broker, side.amqp_queue, n, meter.mark)
        else:
            seconds = workers.elapsed(
                worker.spans(n, 600, name, poll_s=0.05, on_first=meter.mark))
        cpu = meter.per_delivery(n)
    return {**cpu, "jobs_per_s": round(n / seconds, 1)}


def measure_raw(side: Side, broker: Broker, concurrency: int, n: int) -> dict[str, Any]:
    """The raw py-amqp drain (``raw_side.raw_drain``) of ``n`` jobs of plain Celery's queue,
    at the prefetch a worker of ``concurrency`` takes (Celery's multiplier, 4)."""
    broker.purge(side.amqp_queue)
    publish(side, n)
    return raw_drain(side.app.conf.broker_url, side.amqp_queue, n, 4 * concurrency)


def _wait_empty(broker: Broker, queue: str, n: int, first: Any) -> float:
    """Seconds from the first message taken off ``queue`` until it is empty (polled)."""
    deadline, started = time.monotonic() + 600, None
    while time.monotonic() < deadline:
        depth = broker.depth(queue)
        if started is None and depth is not None and depth < n:
            started = time.monotonic()
            first()
        if depth == 0:
            return time.monotonic() - (started or time.monotonic())
        time.sleep(0.02)
    raise RuntimeError(f"{queue} still holds messages after 600 s")


def _print_medians(results: dict[str, Any], pool: str, concurrency: str,
                   keys: list[str]) -> None:
    """Each side's medians over the rounds, and jobs/s and main-process CPU as ratios to
    plain Celery on its defaults (``plaindef``) when it ran, also within each round."""
    def rounds(key: str) -> list[dict[str, float]]:
        return results[f"{key} {pool} c{concurrency}"]["rounds"]

    medians = {}
    for key in keys:
        entry = results[f"{key} {pool} c{concurrency}"]
        entry["median"] = medians[key] = {
            field: statistics.median(r[field] for r in entry["rounds"])
            for field in entry["rounds"][0]}
    base = medians.get("plaindef")
    for key, median in medians.items():
        ratios = ""
        if base:
            cpu = median["main_cpu_us_per_delivery"] / base["main_cpu_us_per_delivery"]
            ratios = (f"  jobs/s {median['jobs_per_s'] / base['jobs_per_s']:.2f}x, "
                      f"main CPU {cpu:.2f}x plaindef")
        print(f"=== {key} {pool} c{concurrency} median: {median}{ratios}", flush=True)
        if base and key != "plaindef":
            print(f"=== {key} {pool} c{concurrency} paired with plaindef, per round: "
                  + _paired(rounds(key), rounds("plaindef")), flush=True)


def _paired(rounds: list[dict[str, float]], base: list[dict[str, float]]) -> str:
    """A side's ratio to ``plaindef`` within each round (the two drained one after the
    other), their median and range: a VM whose speed drifts between rounds moves both
    sides of a round alike, so these spread less than the ratio of medians."""
    line = []
    for field, name in (("jobs_per_s", "jobs/s"), ("main_cpu_us_per_delivery", "main CPU")):
        paired = sorted(r[field] / b[field] for r, b in zip(rounds, base, strict=True)
                        if r.get(field) and b.get(field))
        if paired:
            line.append(f"{name} {statistics.median(paired):.2f}x "
                        f"({paired[0]:.2f} to {paired[-1]:.2f})")
    return ", ".join(line)


def _wait_written(path: Path, timeout: float = 30.0) -> None:
    """Until the stopped worker's wrapper wrote ``path`` (at its exit)."""
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)


class WorkerOptions(TypedDict):
    """``measure``'s flags: what sets a side's worker apart from its app's."""

    acks_early: bool
    no_priority: bool
    unchecked: bool


def _worker_options(key: str, args: argparse.Namespace) -> WorkerOptions:
    return {"acks_early": key == "plaindef", "no_priority": not args.ojs_priority,
            "unchecked": key == "unchecked"}


def _profile(side: Side, broker: Broker, pool: str, concurrency: int,
             args: argparse.Namespace, workdir: Path, key: str) -> dict[str, Any]:
    """One more drain under cProfile (``cpu_profile.py``), summarized and printed."""
    label = f"{key} {pool} c{concurrency}"
    out = (args.profile_dir or workdir) / f"{key}-{pool}.prof"
    measure(side, broker, pool, concurrency, args.jobs, workdir, f"{key}-{pool}-prof", out,
            args.poison, **_worker_options(key, args))
    _wait_written(out)
    summary = summarize_profile(out, args.jobs, args.top)
    print(f"--- {label} under cProfile: {summary['us_per_delivery']} us/delivery "
          f"{summary['packages']}")
    for row in summary["functions"]:
        print(f"  {row['us']:8.2f} us  x{row['calls_per_delivery']:<6} {row['function']}")
    return summary


def _stages(sides: dict[str, Side], broker: Broker, pool: str, concurrency: int,
            args: argparse.Namespace, workdir: Path) -> dict[str, dict[str, float]]:
    """One more drain per side with the stage clock (``stage_clock.py``): the main
    thread's CPU per delivery in each stage, the sides side by side."""
    readings: dict[str, dict[str, float]] = {}
    calls: dict[str, dict[str, float]] = {}
    for key, side in sides.items():
        if key == "raw":
            continue
        out = workdir / f"{key}-{pool}.stages"
        measure(side, broker, pool, concurrency, args.jobs, workdir, f"{key}-{pool}-stages",
                None, args.poison, stages=out, **_worker_options(key, args))
        _wait_written(out)
        totals = json.loads(out.read_text())
        readings[key] = {stage: round(ns / 1000 / args.jobs, 1)
                         for stage, (ns, _calls) in sorted(totals.items())}
        calls[key] = {stage: round(count / args.jobs, 2)
                      for stage, (_ns, count) in sorted(totals.items())}
    names = sorted({stage for reading in readings.values() for stage in reading})
    print(f"--- {pool} c{concurrency}: main-thread CPU us per delivery by stage, and calls "
          "per delivery (stage_clock.py; stages nest)")
    print(f"  {'stage':28}" + "".join(f"{key:>10}" for key in readings)
          + "".join(f"{'x ' + key:>12}" for key in readings))
    for name in names:
        print(f"  {name:28}" + "".join(f"{reading.get(name, 0.0):>10}"
                                       for reading in readings.values())
              + "".join(f"{count.get(name, 0.0):>12}" for count in calls.values()))
    return readings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default=DEFAULT_BROKER)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--pools", default="prefork:2,threads:4")
    parser.add_argument("--cprofile", action="store_true")
    parser.add_argument("--stages", action="store_true",
                        help="one more drain per side with the main thread's CPU clocked "
                             "per stage of a delivery (stage_clock.py)")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--sides", default="ojs,plain,plaindef",
                        help="ojs; plain (acks late, as ojs_kombu); plaindef (acks early); raw "
                             "(a raw py-amqp consumer acking after each no-op: the ceiling); "
                             "unchecked (ojs as if checking an envelope cost nothing: "
                             "unchecked.py)")
    parser.add_argument("--worker-args", default="",
                        help="more ``celery worker`` options, e.g. '--prefetch-multiplier 16'")
    parser.add_argument("--poison", action="store_true",
                        help="jobs of a type no task handles (the poison storm's backlog)")
    parser.add_argument("--ojs-priority", action="store_true",
                        help="ojs_kombu on the benchmarks' priority job queues "
                             "(sides.BENCH_MAX_PRIORITY); default: its own defaults, a "
                             "classic job queue as plain Celery's")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--profile-dir", type=Path,
                        help="keep the cProfile files there (pstats), not in a temporary directory")
    args = parser.parse_args(argv)
    if args.profile_dir:  # the worker writes its profile there: it must exist first
        args.profile_dir.mkdir(parents=True, exist_ok=True)
    broker = Broker(args.broker)
    pid = os.getpid()
    plain = make_plain_side(args.broker, pid)
    # plaindef: plain Celery on its own defaults (acks on receipt), on the plain side's queue
    # ojs_kombu on its defaults (no x-max-priority unless the app asks), unless
    # --ojs-priority asks for the priority queues the other parts' figures were measured on
    ojs_conf = None if args.ojs_priority else {"ojs_max_priority": None}
    ojs = make_ojs_side(args.broker, pid, conf=ojs_conf)
    sides = {"ojs": ojs, "unchecked": ojs, "plain": plain, "plaindef": plain, "raw": plain}
    sides = {k: v for k, v in sides.items() if k in args.sides.split(",")}
    declared = list({id(side): side for side in sides.values()}.values())  # plain once
    results: dict[str, Any] = {"load": os.getloadavg()[0]}
    try:
        for side in declared:
            side.declare()
        with tempfile.TemporaryDirectory(prefix="ojs-profile-") as tmp:
            workdir = Path(tmp)
            for spec in args.pools.split(","):
                pool, _, concurrency = spec.partition(":")
                for round_ in range(args.rounds):  # the sides alternated: reversed on odd rounds
                    order = list(sides.items())
                    for key, side in order[::-1] if round_ % 2 else order:
                        label = f"{key} {pool} c{concurrency}"
                        reading = (measure_raw(side, broker, int(concurrency), args.jobs)
                                   if key == "raw" else
                                   measure(side, broker, pool, int(concurrency), args.jobs,
                                           workdir, f"{key}-{pool}-{round_}", None,
                                           args.poison, tuple(args.worker_args.split()),
                                           **_worker_options(key, args)))
                        results.setdefault(label, {"rounds": []})["rounds"].append(reading)
                        print(f"{label}: {reading} (load {os.getloadavg()[0]:.2f})",
                              flush=True)
                _print_medians(results, pool, concurrency, list(sides))
                if args.stages:
                    results[f"stages {pool} c{concurrency}"] = _stages(
                        sides, broker, pool, int(concurrency), args, workdir)
                for key, side in sides.items() if args.cprofile else ():
                    if key != "raw":
                        label = f"{key} {pool} c{concurrency}"
                        results[label]["profile"] = _profile(
                            side, broker, pool, int(concurrency), args, workdir, key)
    finally:
        for side in declared:
            broker.delete_side(side)
        broker.close()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
