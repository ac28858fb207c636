"""The throughput part of ``run.py``: every publish scenario of the table (plain
Celery, ojs_kombu, raw py-amqp, Dramatiq), interleaved in blocks, then the drains
(in-process ``threads`` and ``prefork`` subprocess), per round; medians, ratios and
targets (``report.py``); and the typed publish part's sides.

The contenders come from ``sides.py``; the publishers of the two sides that are not
Celery from ``dramatiq_side.py`` and ``raw_side.py``.  The cluster drain
(``--only cluster_drain``) runs the same drains on a cluster of its own
(``cluster_drain.py``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

import cluster_drain
import prefork_drain
import report
import typed_publish
import workers
from admin import Broker
from dramatiq_side import dramatiq_publishers
from measure import (
    DrainResult,
    filler,
    interleaved_publishes,
    measure_drain,
    measure_prefork_drain,
    progress,
    publish,
    publish_batches,
    publish_deferred,
    summarize,
    time_block,
    warm_up,
)
from raw_side import raw_publisher
from sides import (
    CONCURRENCY,
    DEFERRED_CONF,
    POOL,
    TASK_ARGS,
    WARMUP,
    Side,
    make_ojs_side,
    make_plain_side,
)


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
        # The same x-max-priority as the ojs_kombu job queue (BENCH_MAX_PRIORITY).
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
            raw_publisher(broker, args.broker, ojs) as raw, workers.workdir("drain") as workdir, \
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
                progress(f"throughput: {label}, {report.BY_KEY[key].label}")
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
                                 log=progress)
    finally:
        for side in made:
            side.app.close()
            broker.delete_side(side)


def run_cluster_drain(args: argparse.Namespace) -> dict[str, Any]:
    """Both sides' drains on a three-node cluster of the run's own (``cluster_drain``),
    with the in-process and prefork drains of the throughput part."""
    settings = cluster_drain.Settings(jobs=args.cluster_jobs, rounds=args.rounds,
                                      timeout_s=args.timeout, ports=args.cluster_ports,
                                      dist_ports=args.cluster_dist_ports)
    pid, n = os.getpid(), settings.jobs
    with cluster_drain.started(settings, log=progress) as cluster, \
            workers.workdir("drain") as workdir:
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

            result = cluster_drain.run(settings, measure, log=progress)
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
