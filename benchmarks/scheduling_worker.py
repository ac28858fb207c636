"""The scheduling part's sides and their worker subprocess: the names each side owns
(:class:`SchedSide`) and ``python -m celery -A scheduling_app worker`` for one side
(:class:`Worker`), with the waits the measurement needs (``scheduling.py``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from celery import Celery
from scheduling_app import make_app
from workers import rss_bytes, spawn, stop, tail

from ojs_kombu import TopologyNames
from ojs_kombu.spec.delays import SCHEDULE_LEVELS

POOL = "threads"
CONCURRENCY = 4
WORKER_READY_TIMEOUT = 60.0
WORKER_STOP_TIMEOUT = 20.0
MB = 1024 * 1024


@dataclass
class SchedSide:
    """Names of one side; every entity it creates contains ``marker``, unique to the run."""

    key: str  # "plain" | "ojs"
    label: str
    marker: str
    broker_url: str
    queue: str  # the Celery queue name (``-Q``)
    ojs_prefix: str | None = None

    @property
    def control_exchange(self) -> str:
        return f"{self.marker}-ctl"

    @property
    def nodename(self) -> str:
        return f"{self.marker}@localhost"

    def owns_queue(self, name: str) -> bool:
        """A queue of this side's job topology (pidbox queues are Celery's, on both sides)."""
        if self.ojs_prefix is None:
            return name == self.queue
        return name.startswith(f"{self.ojs_prefix}.")

    def known_entities(self) -> tuple[list[str], list[str]]:
        """Every queue and exchange this side may create, listed without the broker's help."""
        ctl = self.control_exchange
        queues = [f"{self.nodename}.{ctl}.pidbox"]
        exchanges = [f"{ctl}.pidbox", f"reply.{ctl}.pidbox"]
        if self.ojs_prefix is None:
            return [self.queue, *queues], [self.queue, *exchanges]
        names = TopologyNames(prefix=self.ojs_prefix)
        queues += [names.job_queue(self.queue), names.dead_letter_queue(self.queue),
                   names.schedule_unroutable_queue,
                   *(names.schedule_queue(k) for k in range(SCHEDULE_LEVELS))]
        exchanges += [names.direct_exchange, names.dlx_exchange, names.retry_exchange,
                      names.delayed_exchange, names.schedule_ready_exchange,
                      names.schedule_unroutable_exchange,
                      *(names.schedule_exchange(k) for k in range(SCHEDULE_LEVELS))]
        return queues, exchanges

    def make_app(self, *, confirm: bool = True) -> Celery:
        return make_app(self.broker_url, self.queue, self.control_exchange,
                        ojs_prefix=self.ojs_prefix, confirm=confirm)


class Worker:
    """``python -m celery -A scheduling_app worker`` for one side, logging into ``workdir``."""

    def __init__(self, side: SchedSide, workdir: Path) -> None:
        self.side = side
        self.record = workdir / f"{side.key}.record"
        self.log = workdir / f"{side.key}.log"
        self.record.touch()
        self.process = spawn(
            ["-m", "celery", "-A", "scheduling_app", "worker",
             "--pool", POOL, "-c", str(CONCURRENCY), "-Q", side.queue,
             "--without-mingle", "--without-gossip", "--loglevel", "WARNING",
             "-n", side.nodename],
            {"BENCH_SCHED_BROKER": side.broker_url,
             "BENCH_SCHED_QUEUE": side.queue,
             "BENCH_SCHED_CONTROL": side.control_exchange,
             "BENCH_SCHED_OJS_PREFIX": side.ojs_prefix or "",
             "BENCH_SCHED_RECORD": str(self.record)}, self.log)

    def check_alive(self) -> None:
        code = self.process.poll()
        if code is not None:
            raise RuntimeError(f"{self.side.label} worker exited with status {code}:\n"
                               f"{self.log_tail()}")

    def log_tail(self) -> str:
        return tail(self.log)

    def rss_mb(self) -> float:
        self.check_alive()
        return rss_bytes(self.process.pid) / MB

    def recorded(self, tag: str) -> list[float]:
        """Lateness in seconds of every ``tag`` job the worker ran so far."""
        values = []
        for line in self.record.read_text().splitlines():
            got, _, value = line.partition(" ")
            if got == tag:
                values.append(float(value))
        return values

    def stop(self) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL: the run must not leave a worker behind."""
        stop(self.process, WORKER_STOP_TIMEOUT)


def wait_ready(app: Celery, worker: Worker) -> None:
    """Until the worker answers ``ping`` (remote control is on for this reason only)."""
    deadline = time.monotonic() + WORKER_READY_TIMEOUT
    while time.monotonic() < deadline:
        worker.check_alive()
        if app.control.ping(destination=[worker.side.nodename], timeout=1.0):
            return
    raise RuntimeError(f"{worker.side.label} worker did not answer ping within "
                       f"{WORKER_READY_TIMEOUT:.0f}s:\n{worker.log_tail()}")


def wait_recorded(worker: Worker, tag: str, n: int, timeout: float) -> list[float]:
    """Poll the record file until ``n`` ``tag`` jobs ran or ``timeout`` passed."""
    deadline = time.monotonic() + timeout
    while True:
        worker.check_alive()
        values = worker.recorded(tag)
        if len(values) >= n or time.monotonic() >= deadline:
            return values
        time.sleep(0.5)
