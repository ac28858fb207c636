"""Drain with idempotency keys on and off: ojs_kombu's dedup store cost, plain Celery beside.

Per round and side, the queue is filled with N jobs of ``bench.dedup`` (a no-op,
``dedup_app.py``) with no worker running; then ``python -m celery -A dedup_app
worker --pool prefork -c 2`` drains it and is stopped once the record file
holds one line per job.  Three sides: plain Celery, ojs_kombu without keys and
ojs_kombu with a key on every job (each delivery claims its key in Redis and
marks it completed: two Lua calls).  The drain time runs from the earliest job
start to the latest job end; CPU is the worker's process group (main process
and pool, user + system from ``/proc``) over the same span, per job.  Sides
rotate which goes first per round; the table shows medians, keys on / keys off
(target >= 0.9) and each ojs_kombu side / plain Celery.  After the keys-on
drains, Redis ``MEMORY USAGE`` of retained keys gives the store's bytes per key.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis

import ojs_kombu

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the worker subprocess imports dedup_app the same way
import prefork_drain  # noqa: E402
from dedup_app import make_app  # noqa: E402
from green_drain import Admin  # noqa: E402
from report import grid  # noqa: E402
from scheduling import list_broker  # noqa: E402

SIDES = ("plain", "ojs", "ojs_keys")
LABELS = {"plain": "plain Celery", "ojs": "ojs_kombu, keys off", "ojs_keys": "ojs_kombu, keys on"}
QUEUE = "bench-dedup"
FILL_BATCH = 1000
DEDUP_URL = os.environ.get("BENCH_DEDUP_URL", "redis://127.0.0.1:6379/4")
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Settings:
    """What ``run.py`` asks for (``--dedup-jobs``, ``--rounds``, ``--timeout``)."""

    jobs: int = 5000
    rounds: int = 3
    timeout_s: float = 300.0


@dataclass
class DedupDrain:
    jobs_per_s: float
    seconds: float
    cpu_ms_per_job: float


class _Side:
    def __init__(self, key: str, broker_url: str, tag: str) -> None:
        self.key = key
        self.broker_url = broker_url
        self.prefix = f"bench{tag}d" if key != "plain" else None
        self.queue = QUEUE if self.prefix else f"{QUEUE}-{tag}"
        self.app = make_app(broker_url, self.queue, None, self.prefix,
                            DEDUP_URL if self.prefix else None)
        self.task = self.app.tasks["bench.dedup"]
        self.amqp_queue = (self.app.amqp.binding.names.job_queue(self.queue) if self.prefix
                           else self.queue)
        self.round = 0

    def declare(self) -> None:
        if self.prefix:
            ojs_kombu.declare_topology(self.app, [self.queue])
            return
        with self.app.connection_for_write() as connection:
            self.app.amqp.queues[self.queue](connection.default_channel).declare()

    def fill(self, n: int) -> None:
        self.round += 1
        if not self.prefix:
            with self.app.producer_or_acquire() as producer:
                for i in range(n):
                    self.task.apply_async((i,), producer=producer)
            return
        keyed = self.key == "ojs_keys"
        for done in range(0, n, FILL_BATCH):
            ojs_kombu.enqueue_many(self.app, [
                self.task.s(i).set(ojs_idempotency_key=f"{self.round}:{i}") if keyed
                else self.task.s(i) for i in range(done, min(done + FILL_BATCH, n))])

    def cleanup(self, broker: Admin) -> None:
        self.app.close()
        if not self.prefix:
            broker.delete([self.queue], [self.queue])
            return
        queues, exchanges = [self.amqp_queue], []
        for kind, names in (("queues", queues), ("exchanges", exchanges)):
            rows = list_broker(kind, ["name"], broker.vhost) or []
            names += [row[0] for row in rows if row[0].startswith(f"{self.prefix}.")
                      and row[0] not in names]
        broker.delete(queues, exchanges)


def _group_cpu_s(pgid: int) -> float:
    """User + system seconds of every live process in the group (worker and pool)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid:  # pgrp
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / _TICK


def drain(side: _Side, broker: Admin, n: int, timeout: float, workdir: Path,
          name: str) -> DedupDrain:
    broker.purge(side.amqp_queue)
    side.fill(n)
    deadline = time.monotonic() + 10
    while (queued := broker.depth(side.amqp_queue)) != n and time.monotonic() < deadline:
        time.sleep(0.05)
    if queued != n:
        raise RuntimeError(f"{LABELS[side.key]}: expected {n} jobs, found {queued}")
    record, log = workdir / f"{name}.record", workdir / f"{name}.log"
    record.write_bytes(b"")
    env = dict(os.environ)
    env.update({
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")])),
        "BENCH_DEDUP_BROKER": side.app.conf.broker_url, "BENCH_DEDUP_QUEUE": side.queue,
        "BENCH_DEDUP_RECORD": str(record), "BENCH_DEDUP_OJS_PREFIX": side.prefix or "",
        "BENCH_DEDUP_URL": DEDUP_URL,
    })
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "dedup_app", "worker", "--pool", "prefork",
             "-c", str(prefork_drain.CONCURRENCY), "-Q", side.queue, "--without-mingle",
             "--without-gossip", "--without-heartbeat", "--loglevel", "WARNING",
             "-n", f"{name}@localhost"],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        cpu_start = None
        while len(spans := prefork_drain.read_record(record)) < n:
            if cpu_start is None and spans:
                cpu_start = _group_cpu_s(process.pid)
            if process.poll() is not None:
                raise RuntimeError(f"{LABELS[side.key]} worker exited with status "
                                   f"{process.returncode}:\n{prefork_drain._tail(log)}")
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{LABELS[side.key]}: only {len(spans)}/{n} jobs ran "
                                   f"within {timeout:.0f}s:\n{prefork_drain._tail(log)}")
            time.sleep(0.05)
        cpu = _group_cpu_s(process.pid) - (cpu_start or 0.0)
    finally:
        prefork_drain._stop(process)
    seconds = max(end for _, end in spans) - min(start for start, _ in spans)
    return DedupDrain(n / seconds, seconds, cpu * 1000 / n)


def key_memory(prefix: str, samples: int = 200) -> dict[str, Any]:
    """Redis ``MEMORY USAGE`` of retained idempotency keys of the run, and their count."""
    client = redis.Redis.from_url(DEDUP_URL)
    keys = list(client.scan_iter(match=f"{prefix}:ojs:key:*", count=1000))
    sizes = [client.memory_usage(key, samples=0) or 0 for key in keys[:samples]]
    client.close()
    return {"retained_keys": len(keys), "sampled": len(sizes),
            "bytes_per_key": statistics.mean(sizes) if sizes else None}


def _forget_keys(prefix: str) -> None:
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
    try:
        for side in sides.values():
            side.declare()
        for i in range(settings.rounds):
            order = SIDES[i % 3:] + SIDES[:i % 3]  # each side first once in three rounds
            for key in order:
                log(f"dedup: round {i + 1}/{settings.rounds}, {LABELS[key]}, "
                    f"{settings.jobs} jobs")
                result = drain(sides[key], broker, settings.jobs, settings.timeout_s,
                               workdir, f"bench-dedup-{key}-{tag}-{i}")
                rounds[key].append(asdict(result))
        memory = key_memory(keyed_prefix)
    finally:
        for side in sides.values():
            side.cleanup(broker)
        _forget_keys(keyed_prefix)
        shutil.rmtree(workdir, ignore_errors=True)
    medians = {key: {field: statistics.median(r[field] for r in runs)
                     for field in ("jobs_per_s", "seconds", "cpu_ms_per_job")}
               for key, runs in rounds.items()}
    plain = medians["plain"]["jobs_per_s"]
    return {"jobs": settings.jobs, "rounds": rounds, "medians": medians,
            "keys_on_vs_off": medians["ojs_keys"]["jobs_per_s"] / medians["ojs"]["jobs_per_s"],
            "vs_plain": {key: medians[key]["jobs_per_s"] / plain for key in ("ojs", "ojs_keys")},
            "store": memory, "settings": {"pool": "prefork", "concurrency":
                                          prefork_drain.CONCURRENCY, "dedup_url": DEDUP_URL}}


def render(result: dict[str, Any]) -> list[str]:
    rows: list[tuple[str, ...]] = [(f"dedup drain ({result['jobs']} no-op jobs, prefork -c 2)",
                                    "jobs/s", "CPU ms/job", "ratio (/plain)")]
    for key in SIDES:
        measured = result["medians"][key]
        ratio = result["vs_plain"].get(key, 1.0)
        rows.append((LABELS[key], f"{measured['jobs_per_s']:.0f}",
                     f"{measured['cpu_ms_per_job']:.3f}", f"{ratio:.2f}"))
    lines = grid(rows)
    store = result["store"]
    per_key = store.get("bytes_per_key")
    lines.append(f"  keys on / keys off: {result['keys_on_vs_off']:.2f} (target >= 0.9); "
                 f"store: {store.get('retained_keys')} keys retained, "
                 f"{'-' if per_key is None else f'{per_key:.0f}'} bytes per key "
                 "(Redis MEMORY USAGE)")
    return lines
