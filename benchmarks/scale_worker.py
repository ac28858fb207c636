"""The scale part's worker subprocess: ``celery -A scale_app worker -Q q0,...`` for one
side, timed to its ready line (``scale.py``, and ``scale_recovery.py`` after a node
restart)."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from scale_app import queue_names
from workers import rss_bytes, spawn, stop, tail

POOL, CONCURRENCY = "threads", 4
READY_TIMEOUT_S = 300.0
MB = 1024 * 1024


class Worker:
    """``celery -A scale_app worker -Q q0,...`` for one side, timed to its ready line."""

    def __init__(self, side: str, broker_url: str, n: int, workdir: Path,
                 quorum: bool, tag: str = "") -> None:
        self.log = workdir / f"{side}-{n}{tag}.log"
        self.record = workdir / f"{side}-{n}{tag}.record"
        self.record.touch()
        self.started = time.perf_counter()
        self.process = spawn(
            ["-m", "celery", "-A", "scale_app", "worker", "--pool", POOL,
             "-c", str(CONCURRENCY), "-Q", ",".join(queue_names(n)),
             "--without-mingle", "--without-gossip", "--loglevel", "INFO",
             "-n", f"scale-{side}-{n}-{os.getpid()}@{socket.gethostname()}"],
            {"BENCH_SCALE_BROKER": broker_url, "BENCH_SCALE_SIDE": side,
             "BENCH_SCALE_RECORD": str(self.record),
             "BENCH_SCALE_QUORUM": "1" if quorum else "0"}, self.log)

    def wait_ready(self) -> float:
        """Seconds from the start to the worker's ``ready.`` line."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"worker exited ({self.process.returncode}):\n"
                                   f"{self.tail()}")
            if " ready." in self.log.read_text(errors="replace"):
                return time.perf_counter() - self.started
            time.sleep(0.02)
        raise RuntimeError(f"worker not ready within {READY_TIMEOUT_S:.0f}s:\n{self.tail()}")

    def tail(self) -> str:
        return tail(self.log)

    def done(self) -> int:
        return len(self.record.read_text().splitlines())

    def rss_mb(self) -> float:
        return rss_bytes(self.process.pid) / MB

    def stop(self) -> None:
        stop(self.process, 60)
