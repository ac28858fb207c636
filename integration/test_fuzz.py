"""Hostile input in bulk: a seeded fuzzer publishes malformed deliveries between valid
jobs into a queue a real ``celery worker`` consumes.

Counts asserted: every malformed delivery dead-lettered with an error code, every
valid job run exactly once, no worker exit, no stall, nothing left behind.  The
default run (CI) is 2,000 malformed deliveries on the prefork pool; the longer
run is documented in faults/README.rst::

    OJS_FUZZ_DELIVERIES=10000 OJS_FUZZ_SEEDS=1,2,3 OJS_FUZZ_POOLS=prefork,threads,solo \\
        .venv/bin/python -m pytest integration/test_fuzz.py -s
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import amqp
import pytest
import redis

from .conftest import WorkerLauncher, queue_depth, rabbitmqctl, unacked
from .fuzz_messages import deliveries

BACKEND = "redis://127.0.0.1:6379/12"
DELIVERIES = int(os.environ.get("OJS_FUZZ_DELIVERIES", "2000"))
SEEDS = [int(s) for s in os.environ.get("OJS_FUZZ_SEEDS", "20261125").split(",")]
POOLS = os.environ.get("OJS_FUZZ_POOLS", "prefork").split(",")
#: No dead letter for this long while malformed deliveries wait: a stall.
STALL_S = 30.0

APP = f'''
import os
import redis
from celery import Celery
import ojs_kombu

app = Celery("fuzz", broker=os.environ["OJS_TEST_BROKER_URL"])
ojs_kombu.install(app)
app.conf.worker_prefetch_multiplier = 16
runs = redis.Redis.from_url("{BACKEND}")

@app.task(name="fuzz.count", bind=True)
def count(self, *args):
    runs.incr("fuzz:" + self.request.id)
'''


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fuzz")
    (folder / "fuzzapp.py").write_text(APP)
    return folder


def settled(store: redis.Redis, valid: list[str], channel: amqp.Channel, vhost: str,
            queue: str) -> tuple[list[int], int]:
    """How often each valid job ran, and the deliveries left in the job queue (ready or
    unacked: a job is acked after it ran)."""
    job_queue = f"ojs.queue.{queue}"
    return ([int(store.get(f"fuzz:{job_id}") or 0) for job_id in valid],
            queue_depth(channel, job_queue) + unacked(vhost, job_queue))


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("seed", SEEDS)
def test_fuzzed_deliveries_are_dead_lettered_and_valid_jobs_run_once(
        vhost: str, workdir: Path, amqp_channel: amqp.Channel,
        worker_launcher: WorkerLauncher, pool: str, seed: int) -> None:
    channel = amqp_channel
    queue = f"fuzz-{pool}-{seed}"
    # consuming: a publish before the job queue is bound would be confirmed and dropped
    worker = worker_launcher("fuzzapp", queue, pool=pool, concurrency=2, cwd=workdir,
                             env={"PYTHONPATH": str(workdir)}, loglevel="WARNING",
                             log=workdir / f"{queue}.log")
    store = redis.Redis.from_url(BACKEND)
    try:
        kinds: Counter[str] = Counter()
        valid: list[str] = []
        sent: dict[str, str] = {}
        for delivery in deliveries(queue, DELIVERIES, valid_every=20, seed=seed):
            # each one confirmed by the broker and mandatory: what is counted below was
            # routed to the job queue (unroutable, py-amqp raises the Basic.Return)
            channel.basic_publish_confirm(delivery.message, exchange="ojs.exchange.direct",
                                          routing_key=queue, mandatory=True)
            if delivery.valid:
                valid.append(delivery.job_id)
            else:
                kinds[delivery.kind] += 1
                message_id = delivery.message.properties.get("message_id")
                if isinstance(message_id, str):  # its dead letter keeps it
                    sent[message_id] = delivery.kind
        dlq = f"ojs.queue.dlx.{queue}"
        seen, last_change, stalls = 0, time.monotonic(), 0
        while (dead := queue_depth(channel, dlq)) < DELIVERIES:
            assert worker.alive(), f"the worker exited ({worker.returncode})"
            if dead != seen:
                seen, last_change = dead, time.monotonic()
            elif time.monotonic() - last_change > STALL_S:
                stalls += 1
                break
            time.sleep(0.2)
        # the last delivery is a valid job, which may still run when the DLQ is full
        ran, left = settled(store, valid, channel, vhost, queue)
        deadline = time.monotonic() + STALL_S
        while (0 in ran or left) and time.monotonic() < deadline:
            time.sleep(0.5)
            ran, left = settled(store, valid, channel, vhost, queue)
        codes: Counter[str] = Counter()
        for _ in range(min(dead, DELIVERIES)):
            message = channel.basic_get(dlq, no_ack=True)
            if message is None:
                break
            codes[(message.properties.get("application_headers") or {}).get(
                "x-ojs-error-code", "(none)")] += 1
            sent.pop(message.properties.get("message_id"), None)
        report = (f"seed {seed}, pool {pool}: published and confirmed {DELIVERIES} malformed "
                  f"({dict(kinds)}) and {len(valid)} valid; dead-lettered {dead}, codes "
                  f"{dict(codes)}; valid ran {sum(ran)} (lost {ran.count(0)}, duplicates "
                  f"{sum(r - 1 for r in ran if r > 1)}); left in the queue (ready or "
                  f"unacked) {left}; stalls {stalls}")
        if stalls or dead != DELIVERIES:  # which are missing, and where the broker has what
            report += (f"\nnot in the DLQ (message id: kind): {dict(list(sent.items())[:10])}"
                       "\nqueues of the vhost (ready, unacked):\n") + rabbitmqctl(
                "list_queues", "-p", vhost, "name", "messages_ready", "messages_unacknowledged")
        print(report)
        assert stalls == 0, report
        assert dead == DELIVERIES and "(none)" not in codes, report
        assert ran == [1] * len(valid), report
        assert left == 0, report
        assert worker.alive(), report
    finally:
        code = worker.stop()
    assert code == 0, f"the worker exited with {code} after SIGTERM"
