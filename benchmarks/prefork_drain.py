"""Drain with the prefork pool: one ``celery worker`` subprocess per side and round.

The throughput part (``measure.py``) fills the queue first; then :func:`drain` starts
``python -m celery -A drain_app worker --pool prefork -c 2`` on it, waits until
the record file holds one line per job, and stops the worker (SIGTERM, then
SIGKILL of its whole process group).  The drain time runs from the earliest
task start to the latest task end the jobs recorded, so the worker's start-up
and shut-down are not part of it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from workers import WorkerProcess, elapsed

POOL = "prefork"
CONCURRENCY = 2


def drain(*, label: str, broker_url: str, queue: str, ojs_prefix: str | None, n: int,
          timeout: float, workdir: Path, name: str, max_priority: int | None = None,
          ojs_acks: str | None = None, quorum: bool = False, acks_early: bool = False,
          work_ms: float = 0.0, started: Callable[[int], None] | None = None,
          when_done: Callable[[], None] | None = None) -> float:
    """Seconds from the first task start to the last task end of ``n`` queued jobs.

    ``acks_early``: plain Celery on its default (acks on receipt); ``work_ms``: each
    job sleeps that long.  ``quorum``: the worker's queue is a quorum queue (plain Celery's
    ``x-queue-type``, ojs_kombu's ``ojs_queue_defaults``).  ``started`` gets the
    worker's pid once it runs, ``when_done`` is called after the last job, the
    worker still running (the cluster drain reads CPU and QoS there).
    """
    env = {
        "BENCH_DRAIN_BROKER": broker_url,
        "BENCH_DRAIN_QUEUE": queue,
        "BENCH_DRAIN_OJS_PREFIX": ojs_prefix or "",
        "BENCH_DRAIN_MAX_PRIORITY": str(max_priority or ""),
        "BENCH_DRAIN_OJS_ACKS": ojs_acks or "",
        "BENCH_DRAIN_QUORUM": "1" if quorum else "",
        "BENCH_DRAIN_ACKS_EARLY": "1" if acks_early else "",
        "BENCH_DRAIN_WORK_MS": str(work_ms or ""),
    }
    with WorkerProcess(app_module="drain_app", pool=POOL, concurrency=CONCURRENCY,
                       queue=queue, workdir=workdir, name=name,
                       record_var="BENCH_DRAIN_RECORD", env=env) as worker:
        if started is not None:
            started(worker.pid)
        spans = worker.spans(n, timeout, f"{label} prefork", poll_s=0.2)
        if when_done is not None:
            when_done()
    return elapsed(spans)
