"""Poison storm: how fast a worker gets rid of messages it cannot run, and whether it stays
responsive and stops on time while it does.

Per pool (solo, prefork, threads) and side, one after the other: a worker
subprocess (``storm_app``) consumes a queue into which the run publishes N
poison jobs and N deliveries that are not jobs at all, with pipelined
publisher confirms.  ojs_kombu must dead-letter all 2N (``UNKNOWN_JOB_TYPE``,
``INVALID_PAYLOAD``, ``INVALID_ENVELOPE``); plain Celery, set up to keep
failures (acks late, a dead-letter exchange on its queue), dead-letters its N
unregistered tasks and acks its N undecodable messages.  The run times the
storm until the dead-letter queue holds what it should, pings the worker during
it, then times the worker's exit after SIGTERM.  ``storm_report.py`` holds the
rules and the table; see benchmarks/README.rst.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import amqp
from celery import Celery
from kombu import Exchange, Queue

import ojs_kombu

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the worker subprocess imports storm_app the same way
import storm_report  # noqa: E402
import workers  # noqa: E402
from admin import delete_swept  # noqa: E402
from storm_app import make_app, plain_dead_letter_names  # noqa: E402
from storm_messages import (  # noqa: E402
    UNKNOWN_TYPE,
    UNREGISTERED_TASK,
    PipelinedPublisher,
    count_kinds,
    ojs_poison,
    plain_poison,
    read_out,
)

POOLS = ("solo", "prefork", "threads")
CONCURRENCY = 2
QUEUE = "storm"  # the Celery queue of the ojs side (OJS queue "storm" under the run's prefix)
POLL_S = 0.1
PING_TIMEOUT_S = 5.0
#: A second ping goes out this long after the first answered, if the storm is still on.
PING_GAP_S = 3.0
STOP_CAP_S = 60.0
READY_TIMEOUT_S = 60.0


@dataclass
class Settings:
    """What the storm loads each side with (``run.py`` flags)."""

    jobs: int = 5000
    pools: tuple[str, ...] = POOLS
    timeout_s: float = 120.0


class Admin(Protocol):
    """The part of ``admin.Broker`` used here."""

    vhost: str

    def depth(self, queue: str) -> int | None: ...

    def delete(self, queues: list[str], exchanges: list[str]) -> None: ...


# -- one side ---------------------------------------------------------------


@dataclass
class StormSide:
    """Names of one side and pool; every entity it creates contains ``marker``."""

    key: str  # "plain" | "ojs"
    pool: str
    marker: str
    broker_url: str

    @property
    def queue(self) -> str:
        """The Celery queue (``-Q``)."""
        return QUEUE if self.key == "ojs" else self.marker

    @property
    def control_exchange(self) -> str:
        return f"{self.marker}-ctl"

    @property
    def nodename(self) -> str:
        return f"{self.marker}@localhost"

    def make_app(self) -> Celery:
        return make_app(self.broker_url, self.queue, self.control_exchange,
                        ojs_prefix=self.marker if self.key == "ojs" else None)


@dataclass
class Route:
    """Where a side's storm goes and where its dead letters land."""

    exchange: str
    routing_key: str
    job_queue: str
    dead_letter_queue: str
    queues: list[str] = field(default_factory=list)
    exchanges: list[str] = field(default_factory=list)


def route_of(side: StormSide, app: Celery) -> Route:
    """The side's names, known before anything is declared (so cleanup has them)."""
    if side.key == "ojs":
        names = app.amqp.binding.names
        ojs_queue = names.ojs_queue(side.queue)
        job, dead = names.job_queue(ojs_queue), names.dead_letter_queue(ojs_queue)
        return Route(names.direct_exchange, ojs_queue, job, dead, [job, dead],
                     [names.direct_exchange, names.dlx_exchange])
    dlx, dlq = plain_dead_letter_names(side.queue)
    return Route(side.queue, side.queue, side.queue, dlq, [side.queue, dlq], [side.queue, dlx])


def declare(side: StormSide, app: Celery, route: Route) -> None:
    """Declare the side's queues before its worker starts, as a user's deployment would:
    ojs_kombu's topology, or plain Celery's queue with its dead-letter exchange and queue."""
    if side.key == "ojs":
        ojs_kombu.declare_topology(app, [side.queue])
        return
    dlx, _dlq = plain_dead_letter_names(side.queue)
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        app.amqp.queues[side.queue](channel).declare()
        Queue(route.dead_letter_queue, Exchange(dlx, "direct"),
              routing_key=side.queue)(channel).declare()


class Worker:
    """``python -m celery -A storm_app worker -P <pool> -c 2`` in its own process group."""

    def __init__(self, side: StormSide, workdir: Path) -> None:
        self.side = side
        self.log = workdir / f"{side.key}-{side.pool}.log"
        self.process = workers.spawn(
            ["-m", "celery", "-A", "storm_app", "worker", "-P", side.pool,
             "-c", str(CONCURRENCY), "-Q", side.queue, "--without-heartbeat",
             "--without-gossip", "--without-mingle", "-l", "warning", "-n", side.nodename],
            {"BENCH_STORM_BROKER": side.broker_url, "BENCH_STORM_QUEUE": side.queue,
             "BENCH_STORM_CONTROL": side.control_exchange,
             "BENCH_STORM_OJS_PREFIX": side.marker if side.key == "ojs" else ""},
            self.log, session=True, cwd=workdir)

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"{self.side.key} {self.side.pool} worker exited with status "
                               f"{self.process.returncode}:\n{self.log_tail()}")

    def log_tail(self) -> str:
        return workers.tail(self.log)

    def wait_ready(self, app: Celery) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            self.check_alive()
            if app.control.ping(destination=[self.side.nodename], timeout=1.0):
                return
        raise RuntimeError(f"{self.side.key} {self.side.pool} worker did not answer ping "
                           f"within {READY_TIMEOUT_S:.0f}s:\n{self.log_tail()}")

    def terminate(self) -> tuple[float | None, bool]:
        """SIGTERM, as a deployment stops a worker; seconds until it exited, or
        ``(None, True)`` when it was SIGKILLed after ``STOP_CAP_S``."""
        started = time.perf_counter()
        with suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(STOP_CAP_S)
        except subprocess.TimeoutExpired:
            self.kill()
            return None, True
        return time.perf_counter() - started, False

    def kill(self) -> None:
        """SIGKILL of the whole group: no worker or pool process outlives the run."""
        workers.kill_group(self.process)
        with suppress(subprocess.TimeoutExpired):
            self.process.wait(10)


class Pinger(threading.Thread):
    """Pings the worker when the storm is queued and once more ``PING_GAP_S`` later if the
    storm is still on; each ping's answer and round trip, from the benchmark process."""

    def __init__(self, app: Celery, nodename: str, started: float, done: threading.Event
                 ) -> None:
        super().__init__(daemon=True)
        self.app, self.nodename, self.started, self.done = app, nodename, started, done
        self.pings: list[dict[str, Any]] = []

    def ping(self) -> None:
        sent = time.perf_counter()
        replies = self.app.control.ping(destination=[self.nodename], timeout=PING_TIMEOUT_S)
        elapsed = time.perf_counter() - sent
        self.pings.append({"at_s": sent - self.started, "answered": bool(replies),
                           "ms": elapsed * 1e3 if replies else None})

    def run(self) -> None:
        self.ping()
        if not self.done.wait(PING_GAP_S):
            self.ping()


def measure_side(side: StormSide, app: Celery, route: Route, admin: Admin,
                 connect: Callable[[], amqp.Connection], settings: Settings, workdir: Path
                 ) -> dict[str, Any]:
    """Declare, start the worker, publish the storm, time it, ping, SIGTERM; then count
    where every message ended up.  The worker is SIGKILLed on the way out, also after
    an error."""
    connection = connect()
    worker: Worker | None = None
    try:
        declare(side, app, route)
        poison = (ojs_poison(settings.jobs, route.routing_key) if side.key == "ojs"
                  else plain_poison(app, settings.jobs))
        expected = len(poison) if side.key == "ojs" else settings.jobs
        worker = Worker(side, workdir)
        worker.wait_ready(app)
        publisher, done = PipelinedPublisher(connection), threading.Event()
        started = time.perf_counter()
        publisher.publish(poison, route.exchange, route.routing_key)
        publish_s = time.perf_counter() - started
        pinger = Pinger(app, side.nodename, started, done)
        pinger.start()
        timed_out, dead, left = wait_storm(admin, route, expected, started + settings.timeout_s,
                                           worker)
        seconds = time.perf_counter() - started
        done.set()
        pinger.join()
        exit_s, killed = worker.terminate()
        returncode = worker.process.returncode
        dead_letters, kinds = where_each_ended(worker, connection, route, poison)
    finally:
        if worker is not None:
            worker.kill()
        with suppress(Exception):
            connection.close()
    codes = Counter(str((m.properties.get("application_headers") or {})
                        .get("x-ojs-error-code") or "none") for m in dead_letters)
    published = len(poison)
    return {
        "side": side.key, "pool": side.pool, "published": published,
        "expected_dead_letters": expected, "dead_lettered": dead, "left_in_queue": left,
        "seconds": seconds, "timed_out": timed_out, "publish_s": publish_s,
        "settled": storm_report.settled(side.key, published, dead, left),
        "rate": storm_report.rate(side.key, published, dead, left, seconds),
        "dead_letters_per_s": dead / seconds,
        "pings": [{**p, "during_storm": p["at_s"] < seconds} for p in pinger.pings],
        "exit_s": exit_s, "killed": killed, "exit_status": returncode,
        "kinds": kinds, "lost": sum(k["lost"] for k in kinds.values()),
        "duplicated": sum(k["duplicated"] for k in kinds.values()),
        "dead_letter_codes": dict(codes) if side.key == "ojs" else {},
    }


def where_each_ended(worker: Worker, connection: amqp.Connection, route: Route,
                     published: list[Any]) -> tuple[list[amqp.Message], dict[str, Any]]:
    """Once the worker was told to stop: kill what is left of it (pool processes), read
    both queues out, and count per kind where each published message ended."""
    worker.kill()
    dead_letters = read_out(connection, route.dead_letter_queue)
    return dead_letters, count_kinds(published, dead_letters,
                                     read_out(connection, route.job_queue))


def wait_storm(admin: Admin, route: Route, expected: int, deadline: float, worker: Worker
               ) -> tuple[bool, int, int | None]:
    """Poll until the DLQ holds ``expected`` and the job queue has nothing ready, or the
    deadline; ``(timed out, dead-lettered, left in the job queue)``."""
    while True:
        dead = admin.depth(route.dead_letter_queue) or 0
        left = admin.depth(route.job_queue)
        if dead >= expected and not left:
            return False, dead, left
        if time.perf_counter() >= deadline:
            return True, dead, left
        worker.check_alive()
        time.sleep(POLL_S)


def delete_side(side: StormSide, route: Route, admin: Admin) -> None:
    """The names the side knows, plus every queue and exchange ``rabbitmqctl`` lists with
    its marker (pidbox, reply queues, whatever its worker declared)."""
    ctl = side.control_exchange
    delete_swept(admin, admin.vhost, [*route.queues, f"{side.nodename}.{ctl}.pidbox"],
                 [*route.exchanges, f"{ctl}.pidbox", f"reply.{ctl}.pidbox"],
                 lambda name: side.marker in name)


def run(admin: Admin, connect: Callable[[], amqp.Connection], broker_url: str, ojs_url: str,
        settings: Settings, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Per pool, plain Celery then ojs_kombu, each with fresh names; then the targets."""
    tag = f"{os.getpid()}-{secrets.token_hex(3)}"
    plain_url = "pyamqp://" + broker_url.partition("://")[2]
    pools: dict[str, dict[str, Any]] = {}
    with workers.workdir("storm") as workdir:
        for pool in settings.pools:
            pools[pool] = {}
            for key, url in (("plain", plain_url), ("ojs", ojs_url)):
                side = StormSide(key, pool, f"bench-storm-{key}-{tag}-{pool}", url)
                log(f"storm: {pool}, {storm_report.LABELS[key]} ...")
                app = side.make_app()
                route = route_of(side, app)
                try:
                    pools[pool][key] = measure_side(side, app, route, admin, connect,
                                                    settings, workdir)
                finally:
                    app.close()
                    delete_side(side, route, admin)
            pools[pool]["target"] = storm_report.assess(pools[pool])
    return {"pools": pools, "settings": {
        **asdict(settings), "pools": list(settings.pools), "concurrency": CONCURRENCY,
        "queue": QUEUE, "unknown_type": UNKNOWN_TYPE, "unregistered_task": UNREGISTERED_TASK,
        "poll_s": POLL_S, "ping_timeout_s": PING_TIMEOUT_S, "ping_gap_s": PING_GAP_S,
        "stop_cap_s": STOP_CAP_S, "exit_tolerance_s": storm_report.EXIT_TOLERANCE_S,
        "order": ["plain", "ojs"]}}


def render(result: dict[str, Any]) -> list[str]:
    return storm_report.render(result)
