"""``ojs_publish_confirms="deferred"`` on the real broker: ``apply_async`` returns before
the confirm, and still every job is confirmed by the time the process exits (a job a
full ``reject-publish`` queue refused is written again until it is taken), and a job
the broker returned is reported (AMQP-014, AMQP-016)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import amqp
import pytest

import ojs_kombu
from ojs_kombu import DeferredPublishError, UnroutableJobError
from ojs_kombu.spec.errors import JobPublishError

from .conftest import wait_until
from .deferredapp import BOUND, make_app
from .workers import launch_worker

ROOT = Path(__file__).resolve().parent.parent
JOBS = 6 * BOUND


def drain_ids(channel: amqp.Channel, queue: str, ids: list[str]) -> None:
    """Take what ``queue`` holds now, a few jobs at a time (so it stays full for a while)."""
    for _ in range(3):
        message = channel.basic_get(queue, no_ack=True)
        if message is None:
            return
        ids.append(message.properties["message_id"])


def test_every_job_refused_by_a_full_queue_is_confirmed_before_the_process_exits(
        broker_url: str, amqp_channel: amqp.Channel) -> None:
    queue = f"dfr-{uuid.uuid4().hex[:8]}"
    app = make_app(queue, broker_url)
    ojs_kombu.declare_topology(app, [queue])  # the same arguments as the producer's
    job_queue = app.amqp.binding.names.job_queue(queue)
    producer = subprocess.Popen(
        [sys.executable, "-m", "integration.deferredapp", queue, str(JOBS)], cwd=ROOT,
        env={**os.environ, "OJS_TEST_BROKER_URL": broker_url}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    consumed: list[str] = []
    # the queue takes BOUND jobs: the rest are refused until the test makes room
    while producer.poll() is None:
        drain_ids(amqp_channel, job_queue, consumed)
        time.sleep(0.05)
    out, err = producer.communicate()
    assert producer.returncode == 0, err
    published = json.loads(out)
    while len(consumed) < len(published):
        before = len(consumed)
        drain_ids(amqp_channel, job_queue, consumed)
        if len(consumed) == before:
            break
    assert len(published) == JOBS
    assert sorted(consumed) == sorted(published)  # nothing lost, nothing twice
    assert "refused" not in err and "not accepted" not in err


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_jobs_a_job_published_are_confirmed_before_the_worker_exits(
        broker_url: str, amqp_channel: amqp.Channel, tmp_path: Path, pool: str) -> None:
    """A job publishes into a full queue and returns at once; the worker is told to stop
    (SIGTERM, warm shutdown): it exits only once every refused job was taken (the
    prefork pool's process too, which exits without the interpreter's atexit)."""
    queue = f"dfr-worker-{uuid.uuid4().hex[:8]}"
    app = make_app(queue, broker_url)
    ojs_kombu.declare_topology(app, [queue, f"{queue}-fan"])
    job_queue = app.amqp.binding.names.job_queue(queue)
    ids_file, log = tmp_path / "ids.json", tmp_path / "worker.log"
    worker = launch_worker(broker_url, "integration.deferredapp", f"{queue}-fan", pool=pool,
                           concurrency=1, log=log, env={"OJS_TEST_DEFERRED_QUEUE": queue})
    consumed: list[str] = []
    try:
        app.tasks["deferred.fan_out"].apply_async((JOBS, str(ids_file)), queue=f"{queue}-fan")
        ojs_kombu.flush_confirms()
        wait_until(ids_file.exists, 60, "the fan-out job's ids")
        wait_until(lambda: "succeeded" in log.read_text(), 30, "the fan-out job's end")
        worker.process.send_signal(signal.SIGTERM)
        while worker.alive():  # room for BOUND more, a few at a time
            drain_ids(amqp_channel, job_queue, consumed)
            time.sleep(0.05)
        while (before := len(consumed)) < JOBS:
            drain_ids(amqp_channel, job_queue, consumed)
            if len(consumed) == before:
                break
    finally:
        worker.stop()
        app.close()
    published = json.loads(ids_file.read_text())
    assert worker.returncode == 0, worker.log_text()
    assert len(published) == JOBS
    lost, twice = set(published) - set(consumed), len(consumed) - len(set(consumed))
    assert (len(lost), twice) == (0, 0), f"lost {len(lost)}, duplicates {twice}"


@pytest.fixture
def gone_queue(broker_url: str, amqp_channel: amqp.Channel) -> tuple[str, str]:
    """A queue whose OJS topology the app declared, and then the job queue deleted: a
    publish to it is returned by the broker."""
    queue = f"dfr-gone-{uuid.uuid4().hex[:8]}"
    return queue, f"ojs.queue.{queue}"


def test_a_returned_job_is_reported_to_the_apps_callback(
        broker_url: str, amqp_channel: amqp.Channel, gone_queue: tuple[str, str]) -> None:
    queue, job_queue = gone_queue
    seen: list[JobPublishError] = []
    app = make_app(queue, broker_url)
    app.conf.ojs_on_publish_error = seen.append
    echo = app.tasks["deferred.echo"]
    try:
        echo.apply_async((0,), queue=queue)  # declares the topology
        ojs_kombu.flush_confirms()
        amqp_channel.queue_delete(job_queue)
        lost = echo.apply_async((1,), queue=queue).id  # returns: no wait for the confirm
        ojs_kombu.flush_confirms()
        assert [(type(e), e.job_id) for e in seen] == [(UnroutableJobError, lost)]
    finally:
        app.close()


def test_a_returned_job_is_raised_by_the_flush_without_a_callback(
        broker_url: str, amqp_channel: amqp.Channel, gone_queue: tuple[str, str]) -> None:
    queue, job_queue = gone_queue
    app = make_app(queue, broker_url)
    echo = app.tasks["deferred.echo"]
    try:
        echo.apply_async((0,), queue=queue)
        ojs_kombu.flush_confirms()
        amqp_channel.queue_delete(job_queue)
        lost = echo.apply_async((1,), queue=queue).id
        with pytest.raises(DeferredPublishError) as caught:
            ojs_kombu.flush_confirms()
        assert list(caught.value.rejected) == [lost]
        assert "was returned by the broker" in str(caught.value)
        # The next publish declares the queue again and is taken.
        echo.apply_async((2,), queue=queue)
        ojs_kombu.flush_confirms()
        assert amqp_channel.queue_declare(job_queue, passive=True).message_count == 1
    finally:
        app.close()
