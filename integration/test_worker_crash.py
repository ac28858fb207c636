"""kill -9 of a worker while a job runs: the job is redelivered and completes, and no
job another one's ack covered is lost."""

from __future__ import annotations

from pathlib import Path

import amqp
import pytest
from celery import Celery

import ojs_kombu

from .apps import make_app
from .conftest import body_of, queue_depth, unacked, wait_until
from .workers import WorkerProcess, launch_worker


def crash_worker(broker_url: str, name: str, log: Path, pool: str = "prefork",
                 concurrency: int = 1, acks: str = "batched") -> WorkerProcess:
    """A worker of :mod:`integration.cliapp` on ``crash``, consuming."""
    return launch_worker(broker_url, "integration.cliapp", "crash", hostname=f"{name}@%h",
                         pool=pool, concurrency=concurrency, log=log,
                         env={"OJS_TEST_ACKS": acks})


def active_on(client: Celery, job_id: str) -> bool:
    active = client.control.inspect(timeout=1).active() or {}
    return any(task["id"] == job_id for tasks in active.values() for task in tasks)


def test_kill_9_mid_job_redelivers_and_completes(broker_url: str, tmp_path: Path) -> None:
    client = make_app("crash-client", broker_url, "rpc://")
    log = tmp_path / "workers.log"
    first = crash_worker(broker_url, "first", log)
    second: WorkerProcess | None = None
    try:
        gate = tmp_path / "gate"
        result = client.tasks["sleep.for"].apply_async((60, str(gate)), queue="crash")
        wait_until(lambda: active_on(client, result.id), timeout=30, what="the job running")
        first.kill()  # the worker and its pool, mid-job
        gate.touch()  # the redelivered run may end
        second = crash_worker(broker_url, "second", log)
        assert result.get(timeout=60) == 60, log.read_text()
        # The worker logs after it replied: wait for the line.
        wait_until(lambda: f"Task sleep.for[{result.id}] succeeded" in log.read_text(),
                   timeout=20, what="the second worker's success log line")
        assert log.read_text().count(f"Task sleep.for[{result.id}] received") == 2
    finally:
        for process in (first, second):
            if process is not None:
                process.stop(30)




# Not the solo pool: there Celery hands a job's ack to the event loop (call_soon),
# and a delivery read in the same socket read runs its job inline first, so the ack
# of the job before it can wait for it with or without ojs_kombu (tests/test_ack_loop.py
# checks that acks already collected go out before each delivery).
@pytest.mark.parametrize("acks", ["batched", "multiple"])
def test_kill_9_after_later_jobs_were_acked_redelivers_only_the_running_job(
        broker_url: str, vhost: str, tmp_path: Path, amqp_channel: amqp.Channel,
        acks: str) -> None:
    """The worker writes the acks of jobs that end together in one go (with
    ``ojs_acks="multiple"`` as one ``Basic.Ack(multiple=true)`` where it can):
    that must never settle a job that was delivered earlier and is still running."""
    client = make_app("crash-acks-client", broker_url, "rpc://")
    log = tmp_path / "worker.log"
    worker = crash_worker(broker_url, f"acks-{acks}", log, pool="threads", concurrency=4,
                          acks=acks)
    try:
        sleep_for, add = client.tasks["sleep.for"], client.tasks["math.add"]
        # Quick jobs before the long one (acks that may go as one multiple ack) and after.
        quick = ojs_kombu.enqueue_many(client, [add.s(i, 1).set(queue="crash")
                                                for i in range(20)])
        long_job = sleep_for.apply_async((600,), queue="crash")  # running when killed
        quick += ojs_kombu.enqueue_many(client, [add.s(i, 1).set(queue="crash")
                                                 for i in range(20, 60)])
        assert [r.get(timeout=60) for r in quick] == [i + 1 for i in range(60)]
        wait_until(lambda: active_on(client, long_job.id), timeout=30, what="the long job running")
        # The rpc:// replies come before the acks: wait until the broker holds only
        # the long job as unacknowledged (everything else settled).
        wait_until(lambda: unacked(vhost, "ojs.queue.crash") == 1, timeout=20,
                   what="the quick jobs' acks", interval=1.0)
        worker.kill()
        queue = "ojs.queue.crash"
        wait_until(lambda: queue_depth(amqp_channel, queue) >= 1, timeout=20,
                   what="the long job back in its queue")
        assert queue_depth(amqp_channel, queue) == 1
        message = amqp_channel.basic_get(queue)
        amqp_channel.basic_ack(message.delivery_tag)
        assert body_of(message)["id"] == long_job.id
        assert message.delivery_info["redelivered"] is True
    finally:
        worker.kill()
