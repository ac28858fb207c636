"""Jobs a worker cannot decode, in bulk, beside good jobs, against a real prefork
``celery worker`` (gossip, mingle, heartbeats and events on).

Each hostile kind lands in the dead-letter queue with its own error code (never
acked and dropped: a compression named in ``x_celery`` used to be logged "Can't
decode message body" and acked), every good job runs exactly once.  The storm's
size is ``OJS_STORM_DELIVERIES`` (default 2,000 hostile jobs, a good one after
every 10); the counts are printed (``-s``).

Memory: a storm of hostile jobs with the largest type map a worker reads, and
of larger ones, leaves the worker's main process within the bound
docs/differences.rst states (``RSS_BOUND_MB``).
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import amqp
import pytest
import redis

from ojs_kombu.spec.job_ids import new_job_id

from .conftest import HOST, PORT, WorkerLauncher, queue_depth, unacked, wait_until
from .workers import WorkerProcess

ROOT = Path(__file__).resolve().parents[1]
#: Minutes of this module on one xdist worker: it goes out before the other modules
#: (integration/conftest.py), not last and alone at the end of the run.
XDIST_LONG = True
OJS = "application/openjobspec+json"
DELIVERIES = int(os.environ.get("OJS_STORM_DELIVERIES", "2000"))
GOOD_EVERY = 10
#: Where integration/hostileapp.py's ``hostile.count`` counts its runs.
RUNS_URL = "redis://127.0.0.1:6379/13"
#: ``ojs_max_type_map_entries`` of the storm's worker (small: the storm stays quick).
STORM_TYPE_MAP_LIMIT = 100


def envelope(queue: str, job_type: str = "hostile.count", **changes: Any) -> dict[str, Any]:
    return {"specversion": "1.0", "id": new_job_id(), "type": job_type, "queue": queue,
            "args": [], **changes}


def message(job: dict[str, Any], body: bytes | None = None, **properties: Any) -> amqp.Message:
    properties = {"content_type": OJS, "content_encoding": "utf-8", "delivery_mode": 2,
                  "message_id": job["id"], **properties}
    return amqp.Message(body if body is not None else json.dumps(job).encode(), **properties)


def type_map(count: int, values: int) -> dict[str, Any]:
    """``args`` of ``values`` dates and a type map of ``count`` entries over them (and
    past them, when ``count`` is larger)."""
    return {"args": ["2026-01-01"] * values,
            "meta": {"x_celery_types": {f"/args/{i}": "date" for i in range(count)}}}


#: kind -> (what a producer publishes, the x-ojs-error-code of its dead letter)
KINDS: dict[str, tuple[Callable[[str, int], amqp.Message], str]] = {
    "compression named in x_celery": (lambda q, n: message(envelope(
        q, x_celery={"compression": ("gzip", "zlib", "bzip2")[n % 3]})), "INVALID_ENVELOPE"),
    "unknown content encoding": (lambda q, n: message(
        envelope(q), content_encoding=("gzip", "binary", "x-unknown", "utf-16")[n % 4]),
        "UNSUPPORTED_CONTENT_TYPE"),
    "compressed body": (lambda q, n: message(envelope(q), body=b"\x1f\x8b\x08\x00" + bytes(
        range(n % 200))), "INVALID_PAYLOAD"),
    "type map over the limit": (lambda q, n: message(envelope(
        q, **type_map(STORM_TYPE_MAP_LIMIT + 1, STORM_TYPE_MAP_LIMIT + 1))),
        "TYPE_MAP_TOO_LARGE"),
    "type map larger than its values": (lambda q, n: message(envelope(
        q, **type_map(STORM_TYPE_MAP_LIMIT, 3))), "TYPE_MAP_TOO_LARGE"),
    "celery built-in without x_celery": (lambda q, n: message(envelope(
        q, job_type=("celery.chord_unlock", "celery.group", "celery.chord")[n % 3],
        args=["g", {"task": "hostile.count"}])), "UNKNOWN_JOB_TYPE"),
}


def hostile_worker(launcher: WorkerLauncher, queue: str, log: Path, **env: str
                   ) -> WorkerProcess:
    """A prefork worker started as users start one: gossip, mingle, heartbeats, events."""
    return launcher("integration.hostileapp", queue, pool="prefork", concurrency=2,
                    without=(), options=("-E",), log=log, loglevel="WARNING",
                    env={"OJS_TEST_RESULT_BACKEND": "none", **env})


class Runs:
    """``hostile.count``'s runs of the jobs a test asks about."""

    def __init__(self) -> None:
        self.store = redis.Redis.from_url(RUNS_URL)
        self.asked: set[str] = set()

    def of(self, job_ids: list[str]) -> list[int]:
        self.asked.update(job_ids)
        return [int(value or 0) for value in self.store.mget(
            [f"hostile:{j}" for j in job_ids])] if job_ids else []


@pytest.fixture
def runs() -> Iterator[Runs]:
    """The run counts; after the test, the keys of its own jobs deleted, no others: two
    suites on one machine (CI runs them side by side) count in this database at once."""
    counts = Runs()
    yield counts
    asked = sorted(counts.asked)
    for start in range(0, len(asked), 1000):
        counts.store.delete(*(f"hostile:{j}" for j in asked[start:start + 1000]))


def settled(channel: amqp.Channel, vhost: str, queue: str, runs: Runs, good: list[str]
            ) -> bool:
    """Whether ``queue`` is empty with nothing unacked and each good job has run.  A
    delivery is acked once its dead letter is confirmed: then every dead letter is in
    the DLQ.  ``rabbitmqctl`` (the unacked count: a CLI run of its own, ~0.7 s of CPU)
    is asked only once the queue is empty."""
    return (queue_depth(channel, queue) == 0 and 0 not in runs.of(good)
            and unacked(vhost, queue) == 0)


def connect(vhost: str) -> amqp.Connection:
    connection = amqp.Connection(f"{HOST}:{PORT}", userid="guest", password="guest",
                                 virtual_host=vhost)
    connection.connect()
    return connection


def test_undecodable_jobs_in_bulk_are_dead_lettered_with_their_code_and_good_jobs_run_once(
        vhost: str, amqp_channel: amqp.Channel, worker_launcher: WorkerLauncher,
        runs: Runs, tmp_path: Path) -> None:
    queue = f"storm-{new_job_id()[-6:]}"
    worker = hostile_worker(worker_launcher, queue, tmp_path / "worker.log",
                            OJS_TEST_MAX_TYPE_MAP_ENTRIES=str(STORM_TYPE_MAP_LIMIT))
    expected: dict[str, str] = {}  # hostile job id -> its code
    kinds: Counter[str] = Counter()
    good: list[str] = []

    def publish_good() -> None:  # good jobs from a producer of their own, meanwhile
        with connect(vhost) as connection:
            channel = connection.channel()
            channel.confirm_select()
            for _ in range(DELIVERIES // GOOD_EVERY):
                job = envelope(queue)
                channel.basic_publish_confirm(message(job), exchange="ojs.exchange.direct",
                                              routing_key=queue, mandatory=True)
                good.append(job["id"])

    producer = threading.Thread(target=publish_good)
    producer.start()
    names = sorted(KINDS)
    amqp_channel.confirm_select()
    for n in range(DELIVERIES):
        kind = names[n % len(names)]
        build, code = KINDS[kind]
        hostile = build(queue, n)
        amqp_channel.basic_publish_confirm(hostile, exchange="ojs.exchange.direct",
                                           routing_key=queue, mandatory=True)
        expected[hostile.properties["message_id"]] = code
        kinds[kind] += 1
    producer.join()

    dlq = f"ojs.queue.dlx.{queue}"
    job_queue = f"ojs.queue.{queue}"
    wait_until(lambda: settled(amqp_channel, vhost, job_queue, runs, good) or not worker.alive(),
               300, "every job to be settled")
    counts = runs.of(good)
    codes: Counter[str] = Counter()
    wrong: list[tuple[str, str, str]] = []
    dead = 0
    while (dead_letter := amqp_channel.basic_get(dlq, no_ack=True)) is not None:
        dead += 1
        job_id = dead_letter.properties.get("message_id")
        code = (dead_letter.properties.get("application_headers") or {}).get(
            "x-ojs-error-code", "(none)")
        codes[code] += 1
        if expected.pop(job_id, None) != code:
            wrong.append((str(job_id), code, "good" if job_id in good else "?"))
    report = (f"published {DELIVERIES} hostile ({dict(kinds)}) and {len(good)} good jobs; "
              f"dead-lettered {dead} (codes {dict(codes)}); good ran {sum(counts)} "
              f"(lost {counts.count(0)}, duplicates {sum(c - 1 for c in counts if c > 1)}); "
              f"hostile lost {len(expected)}; wrong code {len(wrong)}")
    print(report)
    assert worker.alive(), report + worker.log_text()[-3000:]
    assert wrong == [] and expected == {}, (report, wrong[:5], list(expected.items())[:5])
    assert dead == DELIVERIES, report
    assert counts == [1] * len(good), report
    assert "Can't decode message body" not in worker.log_text(), report
    assert worker.stop() == 0


#: ``ojs_max_job_bytes`` of the memory storm's worker: 1 MiB unless
#: ``OJS_STORM_MAX_JOB_BYTES`` says otherwise (16 MiB reads the 10.7 MB jobs too).
MAX_JOB_BYTES = int(os.environ.get("OJS_STORM_MAX_JOB_BYTES", str(2**20)))
#: Bound on the growth of a worker's main-process RSS under any number of hostile jobs
#: (docs/differences.rst, "Limits"): 32 times ``ojs_max_job_bytes`` (a job is parsed
#: one at a time, at about twenty times its body), with the default
#: ``ojs_max_type_map_entries``.
RSS_BOUND_MB = 32 * MAX_JOB_BYTES / 2**20
#: Jobs of each type-map kind in the memory storm.
MEMORY_STORM = int(os.environ.get("OJS_STORM_MEMORY_JOBS", "40"))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def test_a_storm_of_the_largest_type_maps_keeps_the_worker_within_its_memory_bound(
        vhost: str, amqp_channel: amqp.Channel, worker_launcher: WorkerLauncher,
        runs: Runs, tmp_path: Path) -> None:
    queue = f"typemaps-{new_job_id()[-6:]}"
    worker = hostile_worker(worker_launcher, queue, tmp_path / "worker.log",
                            OJS_TEST_MAX_JOB_BYTES=str(MAX_JOB_BYTES))
    limit = 10_000  # ojs_max_type_map_entries' default
    kinds = {  # kind -> (type map entries, values, runs)
        "at the limit": (limit, limit, True),
        "over the limit": (limit + 1, limit + 1, False),
        "more entries than values": (limit, 3, False),
        "450,000 pointers (10.7 MB)": (450_000, 3, False),
    }
    job_queue = f"ojs.queue.{queue}"
    amqp_channel.confirm_select()

    def storm(jobs: int) -> list[str]:
        good = []
        for _ in range(jobs):
            for entries, values, runs_it in kinds.values():
                job = envelope(queue, **type_map(entries, values))
                amqp_channel.basic_publish_confirm(
                    message(job), exchange="ojs.exchange.direct", routing_key=queue,
                    mandatory=True)
                if runs_it:
                    good.append(job["id"])
        wait_until(lambda: settled(amqp_channel, vhost, job_queue, runs, good)
                   or not worker.alive(), 600, "the storm to be settled")
        return good

    storm(2)  # the worker has read each kind once: what it keeps for good is there
    amqp_channel.queue_purge(f"ojs.queue.dlx.{queue}")
    before = rss_mb(worker.pid)
    good = storm(MEMORY_STORM)
    after = rss_mb(worker.pid)
    dead = queue_depth(amqp_channel, f"ojs.queue.dlx.{queue}")
    report = (f"{MEMORY_STORM} jobs of each kind ({', '.join(kinds)}): main process RSS "
              f"{before:.0f} MB -> {after:.0f} MB (+{after - before:.0f} MB, bound "
              f"{RSS_BOUND_MB} MB); ran {sum(runs.of(good))} of {len(good)}; "
              f"dead-lettered {dead}")
    print(report)
    assert worker.alive(), report
    assert runs.of(good) == [1] * len(good), report
    assert dead == 3 * MEMORY_STORM, report
    # what was read and refused, and what was refused unread
    codes = Counter((m.properties.get("application_headers") or {}).get("x-ojs-error-code")
                    for m in iter(lambda: amqp_channel.basic_get(
                        f"ojs.queue.dlx.{queue}", no_ack=True), None))
    expected = Counter({"TYPE_MAP_TOO_LARGE": 2 * MEMORY_STORM})
    largest = len(json.dumps(envelope(queue, **type_map(450_000, 3))))
    expected["JOB_TOO_LARGE" if largest > MAX_JOB_BYTES else "TYPE_MAP_TOO_LARGE"] += \
        MEMORY_STORM
    assert codes == expected, (report, codes)
    assert after - before <= RSS_BOUND_MB, report
    assert worker.stop() == 0
