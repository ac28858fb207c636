"""gevent and eventlet pools, with a real ``celery worker -P <pool> -c 10`` per pool.

Under a green pool Celery runs no event loop: the consumer's greenlet reads the
connection (``drain_events``), jobs and their failure paths run in greenlets of
their own, and so do timers.  Retries, dead letters and reschedules are
published from there without waiting (:mod:`ojs_kombu.amqp.consuming.outcomes`); these tests
check on the wire that nothing is lost or doubled: runs are counted in Redis by
the worker, dead letters by draining the dead-letter queue.  The worker app is
:mod:`integration.greenapp`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import amqp
import pytest
import redis
from celery import Celery
from celery.exceptions import TaskRevokedError

import ojs_kombu
from ojs_kombu.amqp.broker.control import ControlClient

from .conftest import HOST, PORT, get_message, queue_depth, unacked, wait_until
from .greenapp import make_app, runs_key
from .workers import launch_worker

POOLS = ("gevent", "eventlet")
CONCURRENCY = 10
REDIS_URL = os.environ.get("OJS_TEST_REDIS_URL", "redis://127.0.0.1:6379/11")
#: Log lines that mean a second greenlet read the worker's connection, or a control
#: command failed: none may appear under a green pool.
LOG_ERRORS = ("ConcurrentObjectUseError", "Second simultaneous read",
              "pidbox command error", "could not publish the heartbeat")
STORM_POISON = 1000  # valid OJS jobs of an unknown type; as many bodies that are not JSON
STORM_VALID = 100
STOP_LIMIT_S = 30.0


@dataclass
class GreenWorker:
    """A ``celery worker -P <pool>`` subprocess and what the tests see of it."""

    pool: str
    queue: str
    hostname: str
    prefix: str
    log: Path
    process: subprocess.Popen[bytes]
    app: Celery
    store: redis.Redis

    def runs(self, job_id: str) -> int:
        return int(self.store.get(runs_key(self.prefix, job_id)) or 0)

    def info(self, job_id: str) -> dict[str, str]:
        raw = self.store.hgetall(f"{self.prefix}:info:{job_id}")
        return {k.decode(): v.decode() for k, v in raw.items()}

    def ping(self, timeout: float = 5.0) -> list[dict[str, Any]]:
        return self.app.control.ping(timeout=timeout, destination=[self.hostname]) or []

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def log_errors(self) -> list[str]:
        return [line for line in self.log_text().splitlines()
                if any(error in line for error in LOG_ERRORS)]


def _redis() -> redis.Redis:
    store = redis.Redis.from_url(REDIS_URL)
    try:
        store.ping()
    except redis.ConnectionError as exc:
        pytest.fail(f"Redis is not reachable at {REDIS_URL} ({exc}); the green-pool tests "
                    "keep results and run counts there (OJS_TEST_REDIS_URL)")
    return store


@pytest.fixture(scope="module", params=POOLS)
def green(request: pytest.FixtureRequest, broker_url: str, vhost: str,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[GreenWorker]:
    """One worker per pool for the module, on a queue and control exchange of its own.

    ``--without-heartbeat --without-gossip``: with worker heartbeat events or gossip on,
    Celery 5.7's loop for green pools (``synloop``) waits up to 100 ms on the event
    connection after every message it reads from the broker, which caps any green
    worker (plain Celery too) at about 10 deliveries a second (docs/getting-started.rst, "Worker
    pools").
    """
    pool: str = request.param
    token = uuid.uuid4().hex[:6]
    queue, prefix = f"green-{pool}", f"ojs-green-{pool}-{token}"
    control, hostname = f"green-{pool}-{token}", f"green-{pool}-{token}@localhost"
    store = _redis()
    log = tmp_path_factory.mktemp(f"green-{pool}") / "worker.log"
    env = {"OJS_GREEN_BROKER_URL": broker_url, "OJS_GREEN_BACKEND": REDIS_URL,
           "OJS_GREEN_REDIS": REDIS_URL, "OJS_GREEN_PREFIX": prefix,
           "OJS_GREEN_CONTROL": control}
    launched = launch_worker(broker_url, "integration.greenapp", queue, pool=pool,
                             concurrency=CONCURRENCY, hostname=hostname, log=log, env=env,
                             without=("mingle", "gossip", "heartbeat"))
    worker = GreenWorker(pool, queue, hostname, prefix, log, launched.process,
                         make_app(broker_url, REDIS_URL, REDIS_URL, prefix, control), store)
    try:
        wait_until(lambda: not launched.alive() or worker.ping(timeout=1), timeout=60,
                   what=f"the {pool} worker to answer ping")
        assert launched.alive(), f"the {pool} worker exited:\n{worker.log_text()}"
        yield worker
    finally:
        launched.stop(STOP_LIMIT_S)
        worker.app.close()
        _delete_exchanges(vhost, [f"{control}.pidbox", f"reply.{control}.pidbox"])
        keys = list(store.scan_iter(f"{prefix}:*"))
        if keys:
            store.delete(*keys)


def _delete_exchanges(vhost: str, names: list[str]) -> None:
    """The remote-control exchanges of the worker's own ``control_exchange``: the
    session vhost holds only OJS and Celery's default names (test_topology checks)."""
    connection = amqp.Connection(f"{HOST}:{PORT}", virtual_host=vhost)
    connection.connect()
    try:
        for name in names:
            connection.channel().exchange_delete(name)
    finally:
        connection.close()


def _no_more_runs(worker: GreenWorker, job_id: str, expected: int, settle_s: float = 1.0
                  ) -> int:
    """The run count once a duplicate would have shown up (``settle_s`` later)."""
    wait_until(lambda: worker.runs(job_id) >= expected, timeout=20, what=f"{expected} runs")
    time.sleep(settle_s)
    return worker.runs(job_id)


@pytest.mark.parametrize("task", ["green.flaky", "green.flaky_celery"])
def test_a_retry_runs_twice_and_succeeds(green: GreenWorker, task: str) -> None:
    """``green.flaky`` has an OJS retry policy; ``green.flaky_celery`` Celery's autoretry_for."""
    result = green.app.tasks[task].apply_async(queue=green.queue)
    assert result.get(timeout=30) == "done on attempt 2"
    assert result.state == "SUCCESS"
    runs = _no_more_runs(green, result.id, 2)
    assert runs == 2, f"{green.pool}: published 1 job, ran {runs} times (expected 2)"


def test_a_dead_letter_lands_once(green: GreenWorker, amqp_channel: amqp.Channel) -> None:
    dlq = f"ojs.queue.dlx.{green.queue}"
    result = green.app.tasks["green.fail"].apply_async(queue=green.queue)
    with pytest.raises(RuntimeError, match="always fails"):
        result.get(timeout=30)
    dead = get_message(amqp_channel, dlq, timeout=20)
    runs = _no_more_runs(green, result.id, 2)
    left = queue_depth(amqp_channel, dlq)
    assert dead.properties["message_id"] == result.id
    death = dead.properties["application_headers"]["x-death"][0]
    assert death["reason"] == "rejected" and death["queue"] == f"ojs.queue.{green.queue}"
    assert (runs, left) == (2, 0), (f"{green.pool}: published 1, ran {runs} (expected 2), "
                                    f"dead-lettered 1 + {left} duplicates")


def test_a_scheduled_job_runs_once_when_due(green: GreenWorker) -> None:
    before = time.time()
    result = green.app.tasks["green.record"].apply_async((7,), queue=green.queue, countdown=2)
    assert result.get(timeout=30) == 7
    started = float(green.info(result.id)["started"])
    runs = _no_more_runs(green, result.id, 1)
    # The worker sends back a job more than 50 ms early (EARLY_TOLERANCE_S).
    assert started >= before + 2 - 0.05, f"started {started - before:.3f}s after publish"
    assert runs == 1, f"{green.pool}: published 1 scheduled job, ran {runs} times"


def test_a_running_job_is_cancelled_cooperatively(green: GreenWorker) -> None:
    """``ojs_job_heartbeat=1``: BEATs go out while the job runs, from a timer greenlet."""
    result = green.app.tasks["green.loop"].apply_async((30,), queue=green.queue)
    started = time.monotonic()
    with ControlClient(green.app) as client:
        wait_until(lambda: client.info(result.id, green.queue)["state"] == "active",
                   timeout=20, what="the job running")
        time.sleep(2.5)  # two BEATs
        client.cancel(result.id, green.queue, reason="test", cancelled_by="green")
    with pytest.raises(TaskRevokedError):  # stopped on the cancel: cancelled, not done
        result.get(timeout=20)
    elapsed = time.monotonic() - started
    state, runs = green.info(result.id).get("state"), green.runs(result.id)
    assert (state, runs) == ("cancelled", 1), f"{green.pool}: state {state}, ran {runs} times"
    assert elapsed < 20, f"{green.pool}: the cancelled job ran {elapsed:.1f}s of its 30 s"
    assert green.log_errors() == []


def _job(job_id: str, job_type: str, queue: str, args: list[Any]) -> tuple[bytes, dict[str, Any]]:
    """A raw OJS job as any OJS producer publishes it (body, properties)."""
    body = {"specversion": "1.0", "id": job_id, "type": job_type, "queue": queue, "args": args}
    return json.dumps(body).encode(), {
        "message_id": job_id, "type": job_type, "content_type": ojs_kombu.CONTENT_TYPE,
        "content_encoding": "utf-8", "delivery_mode": 2,
        "application_headers": {"x-ojs-queue": queue, "x-ojs-attempt": 1}}


def _storm(queue: str) -> tuple[list[tuple[str, str, bytes, dict[str, Any]]], list[str]]:
    """(kind, id, body, properties) of every storm message, interleaved; the valid ids."""
    messages, valid = [], []
    every = (2 * STORM_POISON) // STORM_VALID
    for i in range(STORM_POISON):
        job_id = ojs_kombu.new_job_id()
        messages.append(("unknown", job_id, *_job(job_id, "green.unknown_type", queue, [i])))
        bad_id = ojs_kombu.new_job_id()
        _, properties = _job(bad_id, "green.record", queue, [])
        messages.append(("not json", bad_id, b"storm: not JSON {", properties))
        if (2 * i + 2) % every == 0:
            job_id = ojs_kombu.new_job_id()
            valid.append(job_id)
            messages.append(("valid", job_id, *_job(job_id, "green.record", queue, [i, 0.05])))
    return messages, valid


class _Publisher(threading.Thread):
    """Publishes the storm with publisher confirms, on a connection of its own; after a
    third of it, waits for :attr:`go` (the test pings the worker then: a fast machine
    published the whole storm between two polls of the test's wait)."""

    def __init__(self, vhost: str, messages: list[tuple[str, str, bytes, dict[str, Any]]],
                 queue: str) -> None:
        super().__init__(daemon=True)
        self.vhost, self.messages, self.queue = vhost, messages, queue
        self.published = 0
        self.confirmed = 0
        self.error: BaseException | None = None
        self.third = threading.Event()
        self.go = threading.Event()

    def run(self) -> None:
        try:
            connection = amqp.Connection(f"{HOST}:{PORT}", virtual_host=self.vhost)
            connection.connect()
            try:
                channel = connection.channel()
                channel.confirm_select()
                channel.events["basic_ack"].add(self._acked)
                for _kind, _id, body, properties in self.messages:
                    if self.published == len(self.messages) // 3:
                        self.third.set()
                        self.go.wait(30)
                    channel.basic_publish(amqp.Message(body, **properties),
                                          exchange="ojs.exchange.direct",
                                          routing_key=self.queue, mandatory=True)
                    self.published += 1
                deadline = time.monotonic() + 60
                while self.confirmed < self.published and time.monotonic() < deadline:
                    connection.drain_events(timeout=1)
            finally:
                connection.close()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def _acked(self, delivery_tag: int, multiple: bool) -> None:
        self.confirmed = delivery_tag


def _drain(channel: amqp.Channel, queue: str, count: int) -> list[amqp.Message]:
    """Take ``count`` messages off ``queue`` (and any extra that are already there)."""
    taken: list[amqp.Message] = []
    while True:
        message = channel.basic_get(queue, no_ack=True)
        if message is None:
            if len(taken) >= count:
                return taken
            wait_until(lambda: queue_depth(channel, queue) > 0, timeout=20,
                       what=f"{count - len(taken)} more messages on {queue}")
            continue
        taken.append(message)


def test_a_poison_storm_is_dead_lettered_while_the_worker_stays_responsive(
        green: GreenWorker, vhost: str, amqp_channel: amqp.Channel) -> None:
    """The last test of each pool: it stops the worker (SIGTERM) at the end."""
    queue, dlq = f"ojs.queue.{green.queue}", f"ojs.queue.dlx.{green.queue}"
    amqp_channel.queue_purge(dlq)
    messages, valid = _storm(green.queue)
    kinds = {job_id: kind for kind, job_id, _, _ in messages}
    publisher = _Publisher(vhost, messages, green.queue)
    publisher.start()
    wait_until(lambda: publisher.third.is_set() or publisher.error,
               timeout=30, what="a third of the storm published")
    sent_at = publisher.published
    publisher.go.set()  # the rest is published while the ping waits for its answer
    ping_started = time.monotonic()
    pong = green.ping(timeout=5)
    ping_s = time.monotonic() - ping_started
    dead_at_reply = queue_depth(amqp_channel, dlq)
    publisher.join(90)
    assert publisher.error is None and not publisher.is_alive(), publisher.error
    assert publisher.confirmed == len(messages), (
        f"published {publisher.published}, confirmed {publisher.confirmed}")
    assert sent_at < len(messages) and pong, (
        f"{green.pool}: ping sent with {sent_at}/{len(messages)} published got {pong!r} in "
        f"{ping_s:.2f}s")

    dead = _drain(amqp_channel, dlq, 2 * STORM_POISON)
    wait_until(lambda: all(green.runs(job_id) for job_id in valid), timeout=60,
               what="the valid jobs to run")
    time.sleep(1.0)  # duplicates would show by now
    ids = Counter(message.properties["message_id"] for message in dead)
    codes = Counter((kinds.get(message.properties["message_id"]),
                     message.properties["application_headers"].get("x-ojs-error-code"))
                    for message in dead)
    runs = Counter(green.runs(job_id) for job_id in valid)
    duplicates = sum(n - 1 for n in ids.values())
    summary = (f"{green.pool}: published {len(messages)} ({2 * STORM_POISON} poison, "
               f"{len(valid)} valid); dead-lettered {len(dead)} ({dict(codes)}), duplicates "
               f"{duplicates}; valid jobs by run count {dict(runs)}; ping sent with "
               f"{sent_at}/{len(messages)} published, answered in {ping_s:.2f}s, "
               f"{dead_at_reply} in the DLQ then")
    assert len(dead) == 2 * STORM_POISON and duplicates == 0, summary
    assert codes == {("unknown", "UNKNOWN_JOB_TYPE"): STORM_POISON,
                     ("not json", "INVALID_PAYLOAD"): STORM_POISON}, summary
    assert runs == {1: STORM_VALID}, summary
    assert queue_depth(amqp_channel, queue) == 0, summary
    # The last confirms of dead letters may still be on their way: then the acks.
    wait_until(lambda: unacked(vhost, queue) == 0, timeout=10, what=f"no unacked: {summary}")

    os.kill(green.process.pid, signal.SIGTERM)
    stop_started = time.monotonic()
    try:
        code = green.process.wait(STOP_LIMIT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{green.pool}: the worker did not exit within {STOP_LIMIT_S:.0f}s of "
                    f"SIGTERM:\n{green.log_text()[-3000:]}")
    stop_s = time.monotonic() - stop_started
    assert code == 0, f"{green.pool}: exit code {code} after SIGTERM ({stop_s:.1f}s)"
    assert green.log_errors() == [], summary
    print(f"{summary}; exit 0 {stop_s:.1f}s after SIGTERM")  # shown with -rP
