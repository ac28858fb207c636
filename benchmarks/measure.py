"""The measurements every in-process part makes on a :class:`sides.Side`: timed
publishes (single ``apply_async``, deferred confirms, ``enqueue_many`` batches),
publish blocks interleaved across scenarios, and drains with an in-process
``threads`` worker or a ``prefork`` worker subprocess (``prefork_drain.py``).

The throughput part (``throughput.py``) runs them all; the typed publish, events,
cluster drain, latency and publish phase parts reuse them, so a number means the
same thing in every table.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import prefork_drain
import report
from admin import Broker
from celery.contrib.testing.worker import start_worker
from sides import CONCURRENCY, DRAIN_WORK_S, POOL, TASK_ARGS, WARMUP, Side

import ojs_kombu


def progress(message: str) -> None:
    """A progress line on stderr (the tables go to stdout)."""
    print(message, file=sys.stderr, flush=True)


@dataclass
class PublishResult:
    jobs_per_s: float
    seconds: float
    p50_ms: float
    p99_ms: float


@dataclass
class DrainResult:
    jobs_per_s: float
    seconds: float
    left_in_queue: int | None
    dead_lettered: int | None
    #: In-process drains: CPU time of the whole benchmark process (every thread) from
    #: just before the worker starts until the last job ran, per job, in µs (worker
    #: start-up included).  Steadier than jobs/s on a machine whose speed drifts.
    cpu_us_per_job: float | None = None


Result = PublishResult | DrainResult


def publish(side: Side, n: int) -> list[float]:
    """``n`` sequential ``apply_async`` calls; returns each call's latency in seconds."""
    apply_async, clock = side.task.apply_async, time.perf_counter
    latencies: list[float] = []
    for _ in range(n):
        started = clock()
        apply_async(TASK_ARGS)
        latencies.append(clock() - started)
    return latencies


def publish_deferred(side: Side, n: int) -> list[float]:
    """:func:`publish` on a side with :data:`DEFERRED_CONF`, then
    ``ojs_kombu.flush_confirms()``: the block's time includes every confirm (the calls'
    latencies do not; the flush is the last call's)."""
    latencies = publish(side, n)
    started = time.perf_counter()
    ojs_kombu.flush_confirms()
    latencies[-1] += time.perf_counter() - started
    return latencies


def publish_batches(side: Side, n: int, size: int) -> list[float]:
    """``n`` jobs as ``enqueue_many`` calls of ``size`` signatures; each call's latency.

    Building the signatures is inside the loop (so in jobs/s) but outside the
    per-call latency.
    """
    app, signature, clock = side.app, side.task.s, time.perf_counter
    latencies: list[float] = []
    for done in range(0, n, size):
        jobs = [signature(*TASK_ARGS) for _ in range(min(size, n - done))]
        started = clock()
        ojs_kombu.enqueue_many(app, jobs)
        latencies.append(clock() - started)
    return latencies


def warm_up(side: Side, broker: Broker) -> None:
    """Declare the queue, open the producer connection and fill caches, then purge."""
    side.declare()
    publish(side, WARMUP)
    broker.purge(side.amqp_queue)


def measure_publish(side: Side, broker: Broker, n: int) -> PublishResult:
    """Jobs/s over the whole loop (client CPU and broker confirm round trip alike).

    The queue is purged before and after so both sides publish into an empty queue.
    """
    return measure_calls(lambda k: publish(side, k), side.amqp_queue, broker, n)


def measure_calls(send: Callable[[int], list[float]], queue: str, broker: Broker,
                  n: int) -> PublishResult:
    """Time ``send(n)`` (which returns per-call latencies) into the purged ``queue``."""
    seconds, latencies = time_block(send, queue, broker, n)
    return publish_result(n, seconds, latencies)


def time_block(send: Callable[[int], list[float]], queue: str, broker: Broker,
               n: int) -> tuple[float, list[float]]:
    """Seconds ``send(n)`` took into the purged ``queue``, and its per-call latencies."""
    broker.purge(queue)
    started = time.perf_counter()
    latencies = send(n)
    seconds = time.perf_counter() - started
    broker.purge(queue)
    return seconds, latencies


def publish_result(n: int, seconds: float, latencies: list[float]) -> PublishResult:
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return PublishResult(n / seconds, seconds, cuts[49] * 1e3, cuts[98] * 1e3)


def interleaved_publishes(
    publishers: dict[str, tuple[Callable[[int], list[float]], str, int]], broker: Broker,
    blocks: int, forward: bool, round_label: str,
) -> tuple[dict[str, PublishResult], list[list[str]]]:
    """Every publish scenario, each cut into ``blocks`` blocks run in turns.

    Block ``b`` runs every scenario once, in an order rotated by one per block
    (and reversed on odd rounds), so a slow patch of the shared machine (the
    broker's disk flushes dominate confirmed publishes) lands on every
    contender alike instead of on whichever ran during it.  A scenario's rate
    is its jobs over the sum of its blocks' times.
    """
    keys = list(publishers)
    sizes = {key: report.block_sizes(publishers[key][2], blocks) for key in keys}
    spent = dict.fromkeys(keys, 0.0)
    latencies: dict[str, list[float]] = {key: [] for key in keys}
    orders = report.block_orders(keys, blocks, forward)
    for b, order in enumerate(orders):
        for key in order:
            if b >= len(sizes[key]):
                continue
            progress(f"throughput: {round_label}, block {b + 1}/{len(orders)}, "
                      f"{report.BY_KEY[key].label}")
            send, queue, _n = publishers[key]
            seconds, lat = time_block(send, queue, broker, sizes[key][b])
            spent[key] += seconds
            latencies[key] += lat
    results = {key: publish_result(publishers[key][2], spent[key], latencies[key])
               for key in orders[0]}
    return results, orders


def filler(side: Side) -> Callable[[int], None]:
    """A ``fill`` that queues with ``side``'s confirmed ``apply_async`` (a side that
    publishes without confirms fills through another on the same queue)."""
    def fill(n: int) -> None:
        publish(side, n)
    return fill


def measure_drain(side: Side, broker: Broker, n: int, timeout: float, *,
                  job_ids: list[str] | None = None,
                  before_start: Callable[[], None] | None = None,
                  when_done: Callable[[], None] | None = None,
                  fill: Callable[[int], None] | None = None) -> DrainResult:
    """Fill the queue with no worker, then time one worker from first start to last end.

    The events part passes ``job_ids`` (filled with the prefilled jobs' ids),
    ``before_start`` (called before the worker starts, the recorder reset) and
    ``when_done`` (called after the last job ran, the worker still running); none
    of them is timed.  ``fill`` replaces the confirmed ``apply_async`` calls that
    fill the queue (the cluster drain fills in batches).
    """
    broker.purge(side.amqp_queue)
    if fill is not None:
        fill(n)
    elif job_ids is None:
        publish(side, n)
    else:
        job_ids.extend(side.task.apply_async(TASK_ARGS).id for _ in range(n))
    queued = broker.depth(side.amqp_queue)
    if queued != n:
        raise RuntimeError(f"{side.label}: expected {n} messages in {side.amqp_queue}, "
                           f"found {queued}")
    side.recorder.reset(n)
    if before_start is not None:
        before_start()
    cpu_started = time.process_time()
    with start_worker(side.app, pool=POOL, concurrency=CONCURRENCY, perform_ping_check=False,
                      queues=[side.celery_queue], shutdown_timeout=30):
        if not side.recorder.done.wait(timeout):
            raise RuntimeError(f"{side.label}: only {side.recorder.count}/{n} jobs ran "
                               f"within {timeout:.0f}s")
        cpu = time.process_time() - cpu_started
        if when_done is not None:
            when_done()
    seconds = side.recorder.elapsed()
    dead = broker.depth(side.dead_letter_queue) if side.dead_letter_queue else None
    return DrainResult(n / seconds, seconds, broker.depth(side.amqp_queue), dead,
                       cpu * 1e6 / n)


def measure_prefork_drain(side: Side, broker: Broker, n: int, timeout: float, workdir: Path,
                          name: str, *, fill: Callable[[int], None] | None = None,
                          started: Callable[[int], None] | None = None,
                          when_done: Callable[[], None] | None = None) -> DrainResult:
    """As :func:`measure_drain`, with a ``prefork`` worker subprocess (``prefork_drain``);
    ``started`` gets the worker's pid."""
    broker.purge(side.amqp_queue)
    if fill is not None:
        fill(n)
    else:
        publish(side, n)
    queued = broker.depth(side.amqp_queue)
    if queued != n:
        raise RuntimeError(f"{side.label}: expected {n} messages in {side.amqp_queue}, "
                           f"found {queued}")
    seconds = prefork_drain.drain(
        label=side.label, broker_url=side.app.conf.broker_url, queue=side.celery_queue,
        ojs_prefix=side.app.conf.get("ojs_prefix"), n=n, timeout=timeout, workdir=workdir,
        name=name, max_priority=side.max_priority, ojs_acks=side.app.conf.get("ojs_acks"),
        quorum=side.quorum, acks_early=side.acks_early, work_ms=DRAIN_WORK_S[0] * 1000,
        started=started, when_done=when_done)
    dead = broker.depth(side.dead_letter_queue) if side.dead_letter_queue else None
    return DrainResult(n / seconds, seconds, broker.depth(side.amqp_queue), dead)


# -- reporting ------------------------------------------------------------


def summarize(results: list[Result] | list[dict[str, Any]]) -> dict[str, float]:
    """Median of every float field over the rounds (counters stay in the per-round data)."""
    rows = [r if isinstance(r, dict) else asdict(r) for r in results]
    return {k: statistics.median(row[k] for row in rows)
            for k, v in rows[0].items() if isinstance(v, float)}


def plain(value: Any) -> Any:
    """Results (dataclasses inside dicts) as JSON-ready dicts; ``summarize`` takes these."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return asdict(value) if isinstance(value, (PublishResult, DrainResult)) else value
