"""The command line of ``run.py``: every option benchmarks/README.rst documents, checked
before anything runs."""

from __future__ import annotations

import argparse
from pathlib import Path

import cluster_drain
import dlq_scale
import poison_storm
import scale
import scheduling
from sides import BATCH_SIZE, DEFAULT_BROKER, DRAIN_WORK_S

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "latest.json"
PARTS = ("throughput", "typed_publish", "traced_publish", "publish_phases", "events",
         "schedule", "storm",
         "storm_backlog", "green", "dedup", "scale", "dlq_scale", "latency_memory")
#: Parts that run only when ``--only`` names them (they start brokers of their own).
EXTRA_PARTS = ("cluster_drain", "scale_cluster")


def parse_args(argv: list[str] | None, description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
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
