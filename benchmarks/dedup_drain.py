"""Drain with idempotency keys on and off: ojs_kombu's dedup store cost, plain Celery beside.

Per round and side, the queue is filled with N jobs of ``bench.dedup`` (a no-op,
``dedup_app.py``) with no worker running; then ``python -m celery -A dedup_app
worker --pool prefork -c 2`` drains it and is stopped once the record file
holds one line per job.  Three sides: plain Celery, ojs_kombu without keys and
ojs_kombu with a key on every job (each delivery claims its key in Redis and
marks it completed: two Lua calls).  The drain time runs from the earliest job
start to the latest job end; over the same span, per job, the CPU (user +
system from ``/proc``) of the worker's process group (main process and pool),
of RabbitMQ's ``beam.smp`` and of ``redis-server``.  Sides rotate which goes
first per round; the table shows medians, keys on / keys off (target >= 0.9)
and each ojs_kombu side / plain Celery.  After the keys-on drains, Redis
``MEMORY USAGE`` of retained keys gives the store's bytes per key.

Then the store alone (:func:`store_loop`): N keys claimed and completed in a
loop by ojs_kombu's own :class:`DedupStore`, the two calls a keyed job makes
in the pool, its completion deferred the same way; the loop's own CPU and
Redis's, per key.  On shared cores throughput follows the total CPU per job,
so keys off's worker + broker CPU per job over that plus the loop's client +
Redis CPU per key is the best keys on / keys off one store round trip allows
(the "ceiling" line).  ``work_ms`` (``--dedup-work-ms``) makes every side's
task spin that much CPU, to show the ratio for a job that does work.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import redis

from ojs_kombu.celery.dedup_store import DedupStore

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the worker subprocess imports dedup_app the same way
import prefork_drain  # noqa: E402
import workers  # noqa: E402
from cluster_drain import cpu_seconds, process_tree  # noqa: E402
from dedup_app import make_app  # noqa: E402
from report import grid  # noqa: E402
from worker_side import Admin, WorkerSide  # noqa: E402

SIDES = ("plain", "ojs", "ojs_keys")
LABELS = {"plain": "plain Celery", "ojs": "ojs_kombu, keys off", "ojs_keys": "ojs_kombu, keys on"}
QUEUE = "bench-dedup"
DEDUP_URL = os.environ.get("BENCH_DEDUP_URL", "redis://127.0.0.1:6379/4")


@dataclass
class Settings:
    """What ``run.py`` asks for (``--dedup-jobs``, ``--rounds``, ``--timeout``,
    ``--dedup-work-ms``)."""

    jobs: int = 5000
    rounds: int = 3
    timeout_s: float = 300.0
    work_ms: float = 0.0


@dataclass
class DedupDrain:
    jobs_per_s: float
    seconds: float
    cpu_ms_per_job: float  # the worker's process group
    broker_cpu_ms_per_job: float | None
    redis_cpu_ms_per_job: float | None


@dataclass
class Servers:
    """The pids of the broker and of the dedup store's server, for their CPU."""

    broker: int | None
    redis: int | None

    def cpu_s(self) -> tuple[float | None, float | None]:
        broker, redis_ = (None if pid is None else cpu_seconds([pid])
                          for pid in (self.broker, self.redis))
        return broker, redis_


def broker_pid(port: int) -> int | None:
    """RabbitMQ's ``beam.smp``: the only one running, else the one listening on ``port``."""
    found = subprocess.run(["pgrep", "-f", "beam.smp"], capture_output=True, text=True)
    pids = [int(pid) for pid in found.stdout.split()]
    if len(pids) <= 1:
        return pids[0] if pids else None
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with suppress(OSError):
            for row in Path(table).read_text().splitlines()[1:]:
                fields = row.split()
                if int(fields[1].rpartition(":")[2], 16) == port and fields[3] == "0A":
                    listening.add(f"socket:[{fields[9]}]")
    for pid in pids:
        with suppress(OSError):
            if any(os.readlink(fd) in listening for fd in Path(f"/proc/{pid}/fd").iterdir()):
                return pid
    return None


def redis_pid(client: Any) -> int | None:
    """``redis-server``'s pid (``INFO server``), if it runs on this machine."""
    pid = client.info("server").get("process_id")
    return pid if pid and Path(f"/proc/{pid}/stat").exists() else None


class _Side(WorkerSide):
    """The dedup part's side: ``bench.dedup`` of ``dedup_app``; the keyed side fills
    with an idempotency key per job, new in every round."""

    def __init__(self, key: str, broker_url: str, tag: str) -> None:
        prefix = f"bench{tag}d" if key != "plain" else None
        queue = QUEUE if prefix else f"{QUEUE}-{tag}"
        super().__init__(key, make_app(broker_url, queue, None, prefix,
                                       DEDUP_URL if prefix else None),
                         "bench.dedup", queue, prefix)
        self.round = 0

    def fill(self, n: int, signature: Callable[[int], Any] | None = None) -> None:
        self.round += 1
        if self.key == "ojs_keys" and signature is None:
            def signature(i: int) -> Any:
                return self.task.s(i).set(ojs_idempotency_key=f"{self.round}:{i}")
        super().fill(n, signature)


def drain(side: _Side, broker: Admin, n: int, timeout: float, workdir: Path,
          name: str, servers: Servers, work_ms: float = 0.0) -> DedupDrain:
    broker.purge(side.amqp_queue)
    side.fill(n)
    deadline = time.monotonic() + 10
    while (queued := broker.depth(side.amqp_queue)) != n and time.monotonic() < deadline:
        time.sleep(0.05)
    if queued != n:
        raise RuntimeError(f"{LABELS[side.key]}: expected {n} jobs, found {queued}")
    env = {"BENCH_DEDUP_BROKER": side.app.conf.broker_url, "BENCH_DEDUP_QUEUE": side.queue,
           "BENCH_DEDUP_OJS_PREFIX": side.prefix or "", "BENCH_DEDUP_URL": DEDUP_URL,
           "BENCH_DEDUP_WORK_MS": str(work_ms)}
    with workers.WorkerProcess(app_module="dedup_app", pool="prefork",
                                     concurrency=prefork_drain.CONCURRENCY, queue=side.queue,
                                     workdir=workdir, name=name,
                                     record_var="BENCH_DEDUP_RECORD", env=env) as worker:
        started: dict[str, Any] = {"cpu": 0.0, "servers": servers.cpu_s()}

        def first_job() -> None:
            started.update(cpu=cpu_seconds(process_tree(worker.pid)), servers=servers.cpu_s())

        spans = worker.spans(n, timeout, LABELS[side.key], poll_s=0.05, on_first=first_job)
        cpu, servers_end = cpu_seconds(process_tree(worker.pid)) - started["cpu"], servers.cpu_s()
    servers_start = started["servers"]
    seconds = workers.elapsed(spans)
    broker_ms, redis_ms = (None if end is None or start is None else (end - start) * 1000 / n
                           for start, end in zip(servers_start, servers_end, strict=True))
    return DedupDrain(n / seconds, seconds, cpu * 1000 / n, broker_ms, redis_ms)


def store_loop(n: int, namespace: str, pid: int | None) -> dict[str, Any]:
    """What the pool does for ``n`` keyed jobs, alone: ``claim_key`` then ``finish_key``
    (its reply read with the next claim) per key, on one :class:`DedupStore`; this
    process's CPU and Redis's per key."""
    store = DedupStore(DEDUP_URL, 900.0, namespace)
    work = [(f"{i}", str(uuid.uuid4())) for i in range(n)]
    store.claim_key("warm", job_id="warm", attempt=1, redelivered=False)  # connect, load
    servers = Servers(None, pid)
    try:
        redis_start, cpu_start, began = servers.cpu_s()[1], time.process_time(), time.perf_counter()
        for key, job_id in work:
            store.claim_key(key, job_id=job_id, attempt=1, redelivered=False)
            store.finish_key(key, job_id=job_id, attempt=1, completed=True)
        cpu, seconds = time.process_time() - cpu_start, time.perf_counter() - began
        redis_end = servers.cpu_s()[1]
    finally:
        store.close()  # reads the last completion's reply
    redis_ms = (None if redis_start is None or redis_end is None
                else (redis_end - redis_start) * 1000 / n)
    return {"keys": n, "keys_per_s": n / seconds, "client_cpu_ms_per_key": cpu * 1000 / n,
            "redis_cpu_ms_per_key": redis_ms}


def key_memory(prefix: str, samples: int = 200) -> dict[str, Any]:
    """Redis ``MEMORY USAGE`` of retained idempotency keys of the run, and their count."""
    client = redis.Redis.from_url(DEDUP_URL)
    keys = list(client.scan_iter(match=f"{prefix}:ojs:key:*", count=1000))
    sizes = [client.memory_usage(key, samples=0) or 0 for key in keys[:samples]]
    client.close()
    return {"retained_keys": len(keys), "sampled": len(sizes),
            "bytes_per_key": statistics.mean(sizes) if sizes else None}


def _forget_keys(prefix: str) -> None:
    if not prefix:
        return
    client = redis.Redis.from_url(DEDUP_URL)
    for key in client.scan_iter(match=f"{prefix}:ojs:key:*", count=1000):
        client.delete(key)
    client.close()


def run(broker: Admin, broker_url: str, ojs_url: str, settings: Settings,
        log: Callable[[str], None] = print) -> dict[str, Any]:
    tag = f"{os.getpid()}"
    sides = {"plain": _Side("plain", broker_url, tag), "ojs": _Side("ojs", ojs_url, tag),
             "ojs_keys": _Side("ojs_keys", ojs_url, tag + "k")}
    rounds: dict[str, list[dict[str, Any]]] = {key: [] for key in SIDES}
    workdir = Path(tempfile.mkdtemp(prefix="ojs-bench-dedup-"))
    memory: dict[str, Any] = {}
    keyed_prefix = sides["ojs_keys"].prefix or ""
    loop_prefix = f"bench{tag}c"
    client = redis.Redis.from_url(DEDUP_URL)
    servers = Servers(broker_pid(urlparse(broker_url).port or 5672), redis_pid(client))
    client.close()
    loop: dict[str, Any] = {}
    try:
        for side in sides.values():
            side.declare()
        for i in range(settings.rounds):
            order = SIDES[i % 3:] + SIDES[:i % 3]  # each side first once in three rounds
            for key in order:
                log(f"dedup: round {i + 1}/{settings.rounds}, {LABELS[key]}, "
                    f"{settings.jobs} jobs")
                result = drain(sides[key], broker, settings.jobs, settings.timeout_s,
                               workdir, f"bench-dedup-{key}-{tag}-{i}", servers,
                               settings.work_ms)
                rounds[key].append(asdict(result))
        memory = key_memory(keyed_prefix)
        log(f"dedup: the store alone, {settings.jobs} keys")
        loop = store_loop(settings.jobs, loop_prefix, servers.redis)
    finally:
        for side in sides.values():
            side.cleanup(broker)
        _forget_keys(keyed_prefix)
        _forget_keys(loop_prefix)
        shutil.rmtree(workdir, ignore_errors=True)
    medians = {key: {field: _median([r[field] for r in runs]) for field in FIELDS}
               for key, runs in rounds.items()}
    plain = medians["plain"]["jobs_per_s"]
    return {"jobs": settings.jobs, "work_ms": settings.work_ms, "rounds": rounds,
            "medians": medians,
            "keys_on_vs_off": medians["ojs_keys"]["jobs_per_s"] / medians["ojs"]["jobs_per_s"],
            "vs_plain": {key: medians[key]["jobs_per_s"] / plain for key in ("ojs", "ojs_keys")},
            "store": memory, "store_loop": loop, "ceiling": ceiling(medians, loop),
            "settings": {"pool": "prefork", "concurrency": prefork_drain.CONCURRENCY,
                         "dedup_url": DEDUP_URL, "work_ms": settings.work_ms,
                         "broker_pid": servers.broker, "redis_pid": servers.redis}}


FIELDS = ("jobs_per_s", "seconds", "cpu_ms_per_job", "broker_cpu_ms_per_job",
          "redis_cpu_ms_per_job")


def _median(values: list[float | None]) -> float | None:
    return None if None in values else statistics.median(values)  # type: ignore[type-var]


def ceiling(medians: dict[str, dict[str, Any]], loop: dict[str, Any]) -> dict[str, Any]:
    """Keys on / keys off if a keyed job cost keys off's worker + broker CPU plus the store
    loop's per key (client + Redis); and the drains' own CPU ratio, keys off's worker +
    broker over keys on's worker + broker + Redis."""
    def total(key: str, fields: tuple[str, ...]) -> float | None:
        parts = [medians[key][field] for field in fields]
        return None if None in parts else sum(parts)

    off = total("ojs", ("cpu_ms_per_job", "broker_cpu_ms_per_job"))
    on = total("ojs_keys", ("cpu_ms_per_job", "broker_cpu_ms_per_job", "redis_cpu_ms_per_job"))
    store = (None if loop.get("redis_cpu_ms_per_key") is None
             else loop["client_cpu_ms_per_key"] + loop["redis_cpu_ms_per_key"])
    return {"off_cpu_ms_per_job": off, "store_cpu_ms_per_key": store,
            "ratio": None if off is None or store is None else off / (off + store),
            "measured_cpu_ratio": None if off is None or on is None else off / on}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def render(result: dict[str, Any]) -> list[str]:
    work = result.get("work_ms") or 0
    jobs = f"{work:g} ms CPU" if work else "no-op"
    rows: list[tuple[str, ...]] = [
        (f"dedup drain ({result['jobs']} {jobs} jobs, prefork -c 2)", "jobs/s",
         "worker CPU ms/job", "broker CPU ms/job", "Redis CPU ms/job", "ratio (/plain)")]
    for key in SIDES:
        measured = result["medians"][key]
        ratio = result["vs_plain"].get(key, 1.0)
        rows.append((LABELS[key], f"{measured['jobs_per_s']:.0f}",
                     _ms(measured["cpu_ms_per_job"]), _ms(measured["broker_cpu_ms_per_job"]),
                     _ms(measured["redis_cpu_ms_per_job"]), f"{ratio:.2f}"))
    lines = grid(rows)
    store = result["store"]
    per_key = store.get("bytes_per_key")
    lines.append(f"  keys on / keys off: {result['keys_on_vs_off']:.2f} (target >= 0.9); "
                 f"store: {store.get('retained_keys')} keys retained, "
                 f"{'-' if per_key is None else f'{per_key:.0f}'} bytes per key "
                 "(Redis MEMORY USAGE)")
    loop, top = result["store_loop"], result["ceiling"]
    lines.append(f"  store alone ({loop['keys']} keys, claim + deferred completion, one "
                 f"process): client {_ms(loop['client_cpu_ms_per_key'])} + Redis "
                 f"{_ms(loop['redis_cpu_ms_per_key'])} CPU ms/key, "
                 f"{loop['keys_per_s']:.0f} keys/s")
    ratio = "-" if top["ratio"] is None else f"{top['ratio']:.2f}"
    cpu_ratio = ("-" if top["measured_cpu_ratio"] is None
                 else f"{top['measured_cpu_ratio']:.2f}")
    lines.append(f"  ceiling: keys off worker + broker {_ms(top['off_cpu_ms_per_job'])} / "
                 f"({_ms(top['off_cpu_ms_per_job'])} + store "
                 f"{_ms(top['store_cpu_ms_per_key'])}) CPU ms = {ratio}; measured keys on / "
                 f"keys off {result['keys_on_vs_off']:.2f} (total CPU per job, off / on: "
                 f"{cpu_ratio})")
    return lines
