"""Drain with the prefork pool: one ``celery worker`` subprocess per side and round.

``run.py`` fills the queue first; then :func:`drain` starts
``python -m celery -A drain_app worker --pool prefork -c 2`` on it, waits until
the record file holds one line per job, and stops the worker (SIGTERM, then
SIGKILL of its whole process group).  The drain time runs from the earliest
task start to the latest task end the jobs recorded, so the worker's start-up
and shut-down are not part of it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

HERE = Path(__file__).resolve().parent
POOL = "prefork"
CONCURRENCY = 2
STOP_TIMEOUT = 20.0


def _tail(path: Path, lines: int = 20) -> str:
    with suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Warm shutdown, then SIGKILL of the group: no pool process may outlive the run."""
    if process.poll() is None:
        with suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            process.wait(STOP_TIMEOUT)
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def read_record(path: Path) -> list[tuple[float, float]]:
    """``(start, end)`` of every job recorded so far (a partial last line is skipped)."""
    spans = []
    for line in path.read_text().splitlines():
        start, _, end = line.partition(" ")
        with suppress(ValueError):
            spans.append((float(start), float(end)))
    return spans


def drain(*, label: str, broker_url: str, queue: str, ojs_prefix: str | None, n: int,
          timeout: float, workdir: Path, name: str, max_priority: int | None = None,
          ojs_acks: str | None = None, quorum: bool = False,
          started: Callable[[int], None] | None = None,
          when_done: Callable[[], None] | None = None) -> float:
    """Seconds from the first task start to the last task end of ``n`` queued jobs.

    ``quorum``: the worker's queue is a quorum queue (plain Celery's
    ``x-queue-type``, ojs_kombu's ``ojs_queue_defaults``).  ``started`` gets the
    worker's pid once it runs, ``when_done`` is called after the last job, the
    worker still running (the cluster drain reads CPU and QoS there).
    """
    record, log = workdir / f"{name}.record", workdir / f"{name}.log"
    record.write_bytes(b"")
    env = dict(os.environ)
    env.update({
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")])),
        "BENCH_DRAIN_BROKER": broker_url,
        "BENCH_DRAIN_QUEUE": queue,
        "BENCH_DRAIN_RECORD": str(record),
        "BENCH_DRAIN_OJS_PREFIX": ojs_prefix or "",
        "BENCH_DRAIN_MAX_PRIORITY": str(max_priority or ""),
        "BENCH_DRAIN_OJS_ACKS": ojs_acks or "",
        "BENCH_DRAIN_QUORUM": "1" if quorum else "",
    })
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "drain_app", "worker", "--pool", POOL,
             "-c", str(CONCURRENCY), "-Q", queue, "--without-mingle", "--without-gossip",
             "--without-heartbeat", "--loglevel", "WARNING", "-n", f"{name}@localhost"],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        if started is not None:
            started(process.pid)
        deadline = time.monotonic() + timeout
        while True:
            spans = read_record(record)
            if len(spans) >= n:
                break
            if process.poll() is not None:
                raise RuntimeError(f"{label} prefork worker exited with status "
                                   f"{process.returncode}:\n{_tail(log)}")
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{label} prefork: only {len(spans)}/{n} jobs ran within "
                                   f"{timeout:.0f}s:\n{_tail(log)}")
            time.sleep(0.2)
        if when_done is not None:
            when_done()
    finally:
        _stop(process)
    return max(end for _, end in spans) - min(start for start, _ in spans)
