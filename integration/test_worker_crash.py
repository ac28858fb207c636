"""kill -9 of a worker while a job runs: the job is redelivered and completes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from celery import Celery

from .apps import make_app
from .conftest import wait_until

ROOT = Path(__file__).resolve().parents[1]


def start_worker(broker_url: str, name: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OJS_TEST_BROKER_URL": broker_url}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "integration.cliapp", "worker", "-Q",
             "crash", "-n", f"{name}@%h", "--pool", "prefork", "-c", "1", "--loglevel", "INFO",
             "--without-mingle", "--without-gossip"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def active_on(client: Celery, job_id: str) -> bool:
    active = client.control.inspect(timeout=1).active() or {}
    return any(task["id"] == job_id for tasks in active.values() for task in tasks)


def test_kill_9_mid_job_redelivers_and_completes(broker_url: str, tmp_path: Path) -> None:
    client = make_app("crash-client", broker_url, "rpc://")
    log = tmp_path / "workers.log"
    first = start_worker(broker_url, "first", log)
    second: subprocess.Popen[bytes] | None = None
    try:
        wait_until(lambda: client.control.inspect(timeout=1).ping(), timeout=60,
                   what="the first worker")
        result = client.tasks["sleep.for"].apply_async((4,), queue="crash")
        wait_until(lambda: active_on(client, result.id), timeout=30, what="the job running")
        os.killpg(first.pid, signal.SIGKILL)  # the worker and its pool, mid-job
        first.wait(10)

        second = start_worker(broker_url, "second", log)
        assert result.get(timeout=60) == 4, log.read_text()
        # The worker logs after it replied: wait for the line.
        wait_until(lambda: f"Task sleep.for[{result.id}] succeeded" in log.read_text(),
                   timeout=20, what="the second worker's success log line")
        assert log.read_text().count(f"Task sleep.for[{result.id}] received") == 2
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)


