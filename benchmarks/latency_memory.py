"""Publish-to-start latency on an idle worker, and a worker's memory idle and after many jobs.

Per side (ojs_kombu, plain Celery on its defaults with ``task_acks_late=True``), one
``celery worker --pool prefork -c 2`` subprocess (``drain_app``) on an empty queue
(Dramatiq: the latency and the idle RSS only, ``confirm_delivery`` sends to a
``dramatiq --processes 2 --threads 1`` worker, ``dramatiq_worker_app``):

* idle RSS: once the worker ran one warm-up job, the resident memory of its main process
  and of the main process plus its pool processes (``/proc``);
* latency: ``--latency-jobs`` single confirmed ``apply_async`` calls, one at a time with
  ``--gap-ms`` between them, each carrying its ``time.time()``; the job records when it
  started, and the latency is start minus publish (same clock, same machine): p50, p99 and
  the distribution (``--json`` keeps every value, for the charts);
* RSS after ``--memory-jobs`` no-op jobs (queued in the worker's absence, drained by it).

Run from the repository root::

    .venv/bin/python benchmarks/latency_memory.py --latency-jobs 2000 --memory-jobs 100000
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workers
from admin import Broker
from dramatiq_side import queues_of as dramatiq_queues
from measure import publish_batches
from sides import BATCH_SIZE, DEFAULT_BROKER, TASK_ARGS, Side, make_ojs_side, make_plain_side


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.extend(int(child) for child in text)
    return found


def memory(pid: int) -> dict[str, float]:
    """RSS in MiB of the worker's main process, and with its pool processes."""
    main = rss_kib(pid)
    total = main + sum(rss_kib(child) for child in _children(pid))
    return {"main_mib": round(main / 1024, 1), "with_pool_mib": round(total / 1024, 1)}


def _started_after_publish(record: Path) -> list[float]:
    """Seconds from publish to start of every recorded job that carried its publish time."""
    values = []
    for line in record.read_text().splitlines():
        fields = line.split()
        if len(fields) == 3:
            values.append(float(fields[0]) - float(fields[2]))
    return values


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def measure_side(side: Side, broker: Broker, args: argparse.Namespace,
                 workdir: Path, name: str) -> dict[str, Any]:
    broker.purge(side.amqp_queue)
    env = {"BENCH_DRAIN_BROKER": side.app.conf.broker_url,
           "BENCH_DRAIN_QUEUE": side.celery_queue,
           "BENCH_DRAIN_OJS_PREFIX": side.app.conf.get("ojs_prefix") or ""}
    result: dict[str, Any] = {}
    with workers.WorkerProcess(
            app_module="drain_app", pool="prefork", concurrency=2, queue=side.celery_queue,
            workdir=workdir, name=name, record_var="BENCH_DRAIN_RECORD", env=env) as worker:
        side.task.apply_async(TASK_ARGS)  # warm-up: the worker consumes
        worker.spans(1, 120, name)
        time.sleep(1.0)
        result["idle"] = memory(worker.pid)
        apply_async, gap = side.task.apply_async, args.gap_ms / 1000
        for _ in range(args.latency_jobs):
            apply_async((time.time(),))
            time.sleep(gap)
        worker.spans(1 + args.latency_jobs, 300, name)
        result["latency_ms"] = _latency_summary(_started_after_publish(worker.record))
        if args.memory_jobs:
            worker.stop()  # queue the jobs with no worker, then drain them with a new one
    if args.memory_jobs:
        _fill(side, args.memory_jobs)
        with workers.WorkerProcess(
                app_module="drain_app", pool="prefork", concurrency=2,
                queue=side.celery_queue, workdir=workdir, name=f"{name}-mem",
                record_var="BENCH_DRAIN_RECORD", env=env) as worker:
            worker.spans(args.memory_jobs, 1800, name, poll_s=0.5)
            time.sleep(1.0)
            result["after_jobs"] = {"jobs": args.memory_jobs, **memory(worker.pid)}
    return result


def measure_dramatiq(broker_url: str, broker: Broker, latency_jobs: int, gap_ms: float,
                     workdir: Path, queue: str) -> dict[str, Any]:
    """The same latency (and idle RSS) with Dramatiq: ``confirm_delivery`` sends to a
    ``dramatiq --processes 2 --threads 1`` worker (two execution slots, as ``-c 2``)."""
    from dramatiq_side import DramatiqPublisher

    record, log = workdir / "dramatiq.record", workdir / "dramatiq.log"
    record.write_bytes(b"")
    publisher = DramatiqPublisher(broker_url, queue, confirm=True)
    worker = workers.spawn(
        ["-m", "dramatiq", "dramatiq_worker_app", "--processes", "2", "--threads", "1"],
        {"BENCH_DQ_URL": broker_url, "BENCH_DQ_QUEUE": queue, "BENCH_DQ_RECORD": str(record)},
        log, session=True)
    try:
        def recorded() -> int:
            return len(record.read_text().splitlines())

        publisher.send(1, (time.time(),))
        deadline = time.monotonic() + 120
        while recorded() < 1:
            if time.monotonic() > deadline or worker.poll() is not None:
                raise RuntimeError(f"the Dramatiq worker ran nothing:\n{log.read_text()}")
            time.sleep(0.1)
        time.sleep(1.0)
        idle = memory(worker.pid)
        send, gap = publisher.actor.send, gap_ms / 1000
        for _ in range(latency_jobs):
            send(time.time())
            time.sleep(gap)
        deadline = time.monotonic() + 300
        while recorded() < 1 + latency_jobs and time.monotonic() < deadline:
            time.sleep(0.1)
        latencies = _started_after_publish(record)[1:]
    finally:
        publisher.close()
        workers.kill_group(worker)
        worker.wait()
        broker.delete(dramatiq_queues(queue), [])
    return {"idle": idle, "latency_ms": _latency_summary(latencies)}


def _latency_summary(latencies: list[float]) -> dict[str, Any]:
    return {"p50": round(percentile(latencies, 50) * 1000, 2),
            "p99": round(percentile(latencies, 99) * 1000, 2),
            "mean": round(statistics.fmean(latencies) * 1000, 2),
            "values": [round(v * 1000, 3) for v in latencies]}


def _fill(side: Side, n: int) -> None:
    """``n`` no-op jobs: ``enqueue_many`` batches (ojs_kombu), unconfirmed ``apply_async``
    (plain Celery): the fill is not measured."""
    if side.sweep_prefix:
        publish_batches(side, n, BATCH_SIZE)
        return
    unconfirmed = make_plain_side(side.app.conf.broker_url, os.getpid(), confirm=False)
    assert unconfirmed.celery_queue == side.celery_queue  # the same queue, no confirms
    with unconfirmed.app.producer_or_acquire() as producer:
        for _ in range(n):
            unconfirmed.task.apply_async(TASK_ARGS, producer=producer)


def run_part(broker_url: str, latency_jobs: int, memory_jobs: int, gap_ms: float = 2.0,
             sides: str = "ojs,plain,dramatiq", log: Any = print) -> dict[str, Any]:
    """Both sides in turn (``run.py --only latency_memory`` calls this too)."""
    args = argparse.Namespace(latency_jobs=latency_jobs, memory_jobs=memory_jobs, gap_ms=gap_ms)
    broker = Broker(broker_url)
    pid = os.getpid()
    made = {"ojs": ("ojs_kombu", make_ojs_side),
            "plain": ("plain Celery", make_plain_side)}
    chosen = {made[key][0]: made[key][1](broker_url, pid) for key in sides.split(",")
              if key in made}
    document: dict[str, Any] = {
        "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "settings": {"latency_jobs": latency_jobs, "gap_ms": gap_ms,
                     "memory_jobs": memory_jobs, "pool": "prefork", "concurrency": 2},
        "load_before": os.getloadavg()[0], "sides": {}}
    try:
        for side in chosen.values():
            side.declare()
        with tempfile.TemporaryDirectory(prefix="ojs-latency-") as tmp:
            for label, side in chosen.items():
                log(f"latency_memory: {label}")
                reading = measure_side(side, broker, args, Path(tmp), label.split()[0])
                reading["load"] = os.getloadavg()[0]
                document["sides"][label] = reading
            if "dramatiq" in sides.split(","):
                log("latency_memory: Dramatiq")
                reading = measure_dramatiq(broker_url, broker, latency_jobs, gap_ms, Path(tmp),
                                           f"bench{pid}-dramatiq-latency")
                reading["load"] = os.getloadavg()[0]
                document["sides"]["Dramatiq"] = reading
    finally:
        for side in chosen.values():
            broker.delete_side(side)
        broker.close()
    document["load_after"] = os.getloadavg()[0]
    return document


def render(document: dict[str, Any]) -> list[str]:
    """The table: latency p50/p99 and RSS per side."""
    settings = document["settings"]
    lines = [f"Idle worker (Celery prefork -c 2; Dramatiq --processes 2 --threads 1): "
             f"publish-to-start latency of {settings['latency_jobs']} "
             f"jobs ({settings['gap_ms']} ms apart), RSS idle and after "
             f"{settings['memory_jobs']:,} jobs",
             f"{'side':<14} {'p50 ms':>8} {'p99 ms':>8} {'idle MiB':>16} {'after MiB':>16} load",
             ]
    for label, side in document["sides"].items():
        latency, idle = side["latency_ms"], side["idle"]
        after = side.get("after_jobs", {})
        lines.append(f"{label:<14} {latency['p50']:>8} {latency['p99']:>8} "
                     f"{idle['main_mib']:>7}/{idle['with_pool_mib']:<8} "
                     f"{after.get('main_mib', '-'):>7}/{after.get('with_pool_mib', '-'):<8} "
                     f"{side['load']:.2f}")
    lines.append("(MiB: main process / with its pool processes)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default=DEFAULT_BROKER)
    parser.add_argument("--latency-jobs", type=int, default=2000)
    parser.add_argument("--gap-ms", type=float, default=2.0)
    parser.add_argument("--memory-jobs", type=int, default=100_000)
    parser.add_argument("--sides", default="ojs,plain,dramatiq")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    document = run_part(args.broker, args.latency_jobs, args.memory_jobs, args.gap_ms,
                        args.sides)
    print("\n".join(render(document)))
    if args.json:
        args.json.write_text(json.dumps(document) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
