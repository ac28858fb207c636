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
        start, _, rest = line.partition(" ")
        with suppress(ValueError):
            spans.append((float(start), float(rest.split(" ", 1)[0])))
    return spans


class WorkerProcess:
    """``python -m celery -A APP worker`` as a subprocess of its own session (its pool
    too), its jobs recording ``start end`` lines to a file (``record_var`` in its
    environment names it), its output in a log next to it.

    The drains of this part, of the green part, of the dedup part and the worker
    profile (``profile_worker.py``) start their workers this way: :meth:`spans` waits
    until ``n`` jobs ran, :meth:`stop` (or leaving the ``with``) stops it and every pool
    process.  ``profile``: the main thread's CPU profile into that file (``cpu_profile.py``);
    ``extra_args``: more ``celery worker`` options."""

    def __init__(self, *, app_module: str, pool: str, concurrency: int, queue: str,
                 workdir: Path, name: str, record_var: str, env: dict[str, str],
                 profile: Path | None = None, extra_args: tuple[str, ...] = ()) -> None:
        self.record, self.log = workdir / f"{name}.record", workdir / f"{name}.log"
        self.record.write_bytes(b"")
        environment = dict(os.environ)
        environment.update(env)
        environment[record_var] = str(self.record)
        environment["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(HERE), environment.get("PYTHONPATH")]))
        with self.log.open("wb") as out:
            # ``profile``: a CPU-time cProfile of the main process's main thread into that file.
            profiler = ([str(HERE / "cpu_profile.py"), str(profile)] if profile is not None
                        else [])
            self.process = subprocess.Popen(
                [sys.executable, *profiler, "-m", "celery", "-A", app_module, "worker",
                 "--pool", pool, "-c", str(concurrency), "-Q", queue, "--without-mingle",
                 "--without-gossip", "--without-heartbeat", "--loglevel", "WARNING",
                 "-n", f"{name}@localhost", *extra_args],
                env=environment, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def spans(self, n: int, timeout: float, label: str, *, poll_s: float = 0.1,
              on_first: Callable[[], None] | None = None) -> list[tuple[float, float]]:
        """``(start, end)`` of the first ``n`` jobs, once they ran; ``on_first`` is called
        when the first job is recorded.  A worker that exits or a timeout raises."""
        deadline = time.monotonic() + timeout
        while len(spans := read_record(self.record)) < n:
            if on_first is not None and spans:
                on_first()
                on_first = None
            if self.process.poll() is not None:
                raise RuntimeError(f"{label} worker exited with status "
                                   f"{self.process.returncode}:\n{_tail(self.log)}")
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{label}: only {len(spans)}/{n} jobs ran within "
                                   f"{timeout:.0f}s:\n{_tail(self.log)}")
            time.sleep(poll_s)
        return spans

    def stop(self) -> None:
        _stop(self.process)

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def elapsed(spans: list[tuple[float, float]]) -> float:
    """Seconds from the earliest job start to the latest job end."""
    return max(end for _, end in spans) - min(start for start, _ in spans)


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
