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

This module is the command only: its options are ``options.py``, the throughput,
typed publish and cluster drain parts ``throughput.py``, the events part
``events_part.py``; every contender is built in ``sides.py`` (Dramatiq's broker in
``dramatiq_side.py``) and every worker subprocess starts in ``workers.py``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when imported, not run
import amqp
import celery
import cluster_drain
import dedup_drain
import dlq_scale
import dramatiq
import events_part
import events_scenario
import green_drain
import kombu
import latency_memory
import pika
import poison_storm
import publish_phases
import report
import scale
import scheduling
import storm_backlog
import throughput
import traced_publish
import typed_publish
from admin import Broker
from measure import progress
from options import parse_args
from sides import CONCURRENCY, POOL, WARMUP, connect, host, ojs_url

import ojs_kombu


def run(broker: Broker, args: argparse.Namespace) -> dict[str, Any]:
    """The selected parts in ``PARTS`` order, throughput first, green drains last; the
    results keyed by part."""
    results: dict[str, Any] = {}
    if "throughput" in args.parts:
        results["throughput"] = throughput.run_throughput(broker, args)
    if "typed_publish" in args.parts:
        results["typed_publish"] = throughput.run_typed_publish(broker, args)
    if "traced_publish" in args.parts:
        traced = traced_publish.Settings(jobs=args.jobs, rounds=args.rounds, blocks=args.blocks,
                                         timeout_s=args.timeout)
        results["traced_publish"] = traced_publish.run(broker, args.broker, traced,
                                                       log=progress)
    if "publish_phases" in args.parts:
        results["publish_phases"] = publish_phases.run_part(
            args.broker, args.jobs, max(args.rounds, 3), log=progress)
    if "events" in args.parts:
        results["events"] = events_part.run_events(broker, args)
    if "schedule" in args.parts:
        settings = scheduling.Settings(
            memory_jobs=args.schedule_jobs, settle_s=args.settle,
            countdown_range=args.schedule_range,
            lateness_jobs=args.lateness_jobs, grace_s=args.lateness_grace,
            batch=args.schedule_batch)
        results["schedule"] = scheduling.run(broker, args.broker, ojs_url(args.broker),
                                             settings, log=progress)
    if "storm" in args.parts:
        storm = poison_storm.Settings(jobs=args.storm_jobs, pools=args.storm_pools,
                                      timeout_s=args.storm_timeout)
        results["storm"] = poison_storm.run(broker, lambda: connect(args.broker), args.broker,
                                            ojs_url(args.broker), storm, log=progress)
    if "storm_backlog" in args.parts:
        results["storm_backlog"] = storm_backlog.run(
            broker, lambda: connect(args.broker), args.broker, ojs_url(args.broker),
            jobs=args.storm_jobs, timeout_s=args.storm_timeout, rounds=max(args.rounds, 3),
            log=progress)
    if "green" in args.parts:
        green = green_drain.Settings(jobs=args.green_jobs, rounds=args.rounds,
                                     timeout_s=args.timeout)
        results["green"] = green_drain.run(broker, args.broker, ojs_url(args.broker), green,
                                           log=progress)
    if "dedup" in args.parts:
        dedup = dedup_drain.Settings(jobs=args.dedup_jobs, rounds=max(args.rounds, 3),
                                     timeout_s=args.timeout, work_ms=args.dedup_work_ms)
        results["dedup"] = dedup_drain.run(broker, args.broker, ojs_url(args.broker), dedup,
                                           log=progress)
    if "scale" in args.parts:
        results["scale"] = scale.run(args.broker, scale.Settings(counts=args.scale_queues),
                                     log=progress)
    if "dlq_scale" in args.parts:
        results["dlq_scale"] = dlq_scale.run(args.broker, args.dlq_sizes, log=progress)
    if "latency_memory" in args.parts:
        results["latency_memory"] = latency_memory.run_part(
            args.broker, args.latency_jobs, args.memory_jobs, log=progress)
    if "cluster_drain" in args.parts:
        results["cluster_drain"] = throughput.run_cluster_drain(args)
    if "scale_cluster" in args.parts:
        results["scale_cluster"] = scale.run_cluster(scale.Settings(counts=args.scale_queues),
                                                     log=progress)
    return results


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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__.split("\n\n")[0])
    # SIGTERM -> SystemExit, so the finally blocks still delete what the run declared.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        broker = Broker(args.broker)
    except (OSError, amqp.exceptions.AMQPError) as exc:
        print(f"RabbitMQ is not reachable at {host(args.broker)} ({exc}); start it with "
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
