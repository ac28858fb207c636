"""A worker started with ``celery -A ... worker``; Celery's own traffic passes through.

Remote control (pidbox), monitoring events (``celeryev``) and the ``rpc://``
result backend are not jobs: the transport must leave them untouched.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import amqp
import pytest
from celery import Celery
from celery.exceptions import TaskRevokedError

from ojs_kombu.spec.job_ids import new_job_id

from .apps import make_app
from .conftest import publish_raw, wait_until
from .workers import launch_worker

ROOT = Path(__file__).resolve().parents[1]
#: Minutes of this module on one xdist worker: it goes out before the other modules
#: (integration/conftest.py), not last and alone at the end of the run.
XDIST_LONG = True


def celery_cli(broker_url: str, *args: str, timeout: float = 60
               ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OJS_TEST_BROKER_URL": broker_url}
    return subprocess.run([sys.executable, "-m", "celery", "-A", "integration.cliapp", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


@pytest.fixture(scope="module")
def client(broker_url: str) -> Celery:
    return make_app("cli-client", broker_url, "rpc://")


@pytest.fixture(scope="module")
def cli_worker(broker_url: str, tmp_path_factory: Any) -> Iterator[Path]:
    log = tmp_path_factory.mktemp("cli") / "worker.log"
    with launch_worker(broker_url, "integration.cliapp", "cli", hostname="cli@%h", log=log,
                       without=(), options=("-E",)):
        yield log


def test_rpc_result_backend(client: Celery, cli_worker: Path) -> None:
    assert client.tasks["math.add"].apply_async((19, 23), queue="cli").get(timeout=20) == 42


def test_remote_control_from_the_command_line(broker_url: str, cli_worker: Path) -> None:
    ping = celery_cli(broker_url, "inspect", "ping", "--timeout", "5")
    assert ping.returncode == 0 and "pong" in ping.stdout, ping.stdout + ping.stderr
    status = celery_cli(broker_url, "status", "--timeout", "5")
    assert status.returncode == 0 and "cli@" in status.stdout, status.stdout
    assert "online" in status.stdout
    queues = celery_cli(broker_url, "inspect", "active_queues", "--timeout", "5")
    assert "ojs.queue.cli" in queues.stdout


def test_revoke(client: Celery, cli_worker: Path) -> None:
    result = client.tasks["sleep.for"].apply_async((0.1,), queue="cli", countdown=3)
    client.control.revoke(result.id)
    with pytest.raises(TaskRevokedError):
        result.get(timeout=20)


def test_monitoring_events(client: Celery, broker_url: str, cli_worker: Path,
                           amqp_channel: amqp.Channel) -> None:
    seen: list[dict[str, Any]] = []
    ready = threading.Event()
    receivers: list[Any] = []

    def capture() -> None:
        with client.connection_for_read() as connection:
            receiver = client.events.Receiver(connection, handlers={"*": seen.append})
            receivers.append(receiver)
            ready.set()
            with contextlib.suppress(TimeoutError):
                receiver.capture(limit=None, timeout=30, wakeup=False)

    def heartbeat() -> bool:
        return any(e.get("type") == "worker-heartbeat" for e in list(seen))

    thread = threading.Thread(target=capture, daemon=True)
    thread.start()
    ready.wait(10)
    # the receiver's queue is bound once it has an event: the worker's heartbeat
    wait_until(heartbeat, timeout=30, what="a worker-heartbeat event")
    result = client.tasks["math.add"].apply_async((1, 1), queue="cli")
    assert result.get(timeout=20) == 2

    # A job from a foreign producer runs too: its task-succeeded event proves it.
    job_id = new_job_id()
    body = {"specversion": "1.0", "id": job_id, "type": "email.send", "queue": "cli",
            "args": ["ops@example.com", "digest"]}
    publish_raw(amqp_channel,
                amqp.Message(json.dumps(body), content_type="application/openjobspec+json",
                             message_id=job_id, type="email.send", delivery_mode=2,
                             application_headers={"x-ojs-queue": "cli", "x-ojs-attempt": 1}),
                "cli")

    def succeeded(task_id: str) -> bool:
        return any(e.get("type") == "task-succeeded" and e.get("uuid") == task_id
                   for e in list(seen))

    try:
        wait_until(lambda: succeeded(result.id) and succeeded(job_id), timeout=20,
                   what=f"task-succeeded events (saw {[e.get('type') for e in seen]})")
    finally:
        receivers[0].should_stop = True
        thread.join(35)


def test_worker_refuses_to_start_with_an_unmappable_task(broker_url: str) -> None:
    env = {**os.environ, "OJS_TEST_BROKER_URL": broker_url}
    run = subprocess.run([sys.executable, "-m", "celery", "-A", "integration.badapp", "worker",
                          "--pool", "solo"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert run.returncode != 0
    assert "JobTypeError" in run.stderr and "proj.tasks.SendEmail" in run.stderr


@pytest.mark.parametrize("queues", ["clash", "spread1,spread2,clash,spread3,spread4,spread5"])
def test_worker_with_a_conflicting_queue_stops_with_one_clear_error(
        broker_url: str, amqp_channel: amqp.Channel, queues: str) -> None:
    amqp_channel.queue_declare("ojs.queue.clash", durable=True, auto_delete=False,
                               arguments={"x-message-ttl": 1000})
    env = {**os.environ, "OJS_TEST_BROKER_URL": broker_url}
    run = subprocess.run([sys.executable, "-m", "celery", "-A", "integration.cliapp", "worker",
                          "-Q", queues, "--pool", "solo"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode != 0
    assert "TopologyConflictError" in run.stderr and "ojs.queue.clash" in run.stderr
    assert run.stderr.count("TopologyConflictError:") == 1  # no redeclare loop
