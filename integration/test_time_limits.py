"""A hard time limit under a prefork worker: retried by the broker, and reported as
``RETRY`` (not ``FAILURE``) to the result backend until the last attempt."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import amqp
import pytest
import redis
from celery import Celery

import ojs_kombu

from .conftest import get_message
from .workers import launch_worker

BACKEND = "redis://127.0.0.1:6379/11"
QUEUE = "limits"

APP = f'''
import os, time
import redis
from celery import Celery
import ojs_kombu

app = Celery("limits", broker=os.environ["OJS_TEST_BROKER_URL"], backend="{BACKEND}")
ojs_kombu.install(app)
runs = redis.Redis.from_url("{BACKEND}")

@app.task(name="slow.limited", bind=True, time_limit=1,
          ojs_retry={{"max_attempts": 2, "initial_interval": "PT0.5S", "jitter": False}})
def limited(self, seconds):
    runs.incr("runs:" + self.request.id)
    time.sleep(seconds)
    return "finished"
'''


def client_app(broker_url: str) -> Celery:
    app = Celery("limits-client", broker=broker_url, backend=BACKEND)
    ojs_kombu.install(app)
    app.conf.task_routes = {"slow.limited": {"queue": QUEUE}}
    return app


@pytest.fixture(scope="module")
def prefork_worker(broker_url: str, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("limits")
    (folder / "limitsapp.py").write_text(APP)
    log = folder / "worker.log"
    with launch_worker(broker_url, "limitsapp", QUEUE, pool="prefork", concurrency=1,
                       log=log, cwd=folder, env={"PYTHONPATH": str(folder)}):
        yield log


def test_a_retried_hard_time_limit_is_not_a_failure_before_the_last_attempt(
        broker_url: str, prefork_worker: Path, amqp_channel: amqp.Channel) -> None:
    app = client_app(broker_url)
    result = app.send_task("slow.limited", (5,), queue=QUEUE)
    states = []
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        state = result.state
        if not states or states[-1] != state:
            states.append(state)
        if state == "FAILURE":
            break
        time.sleep(0.05)
    runs = int(redis.Redis.from_url(BACKEND).get(f"runs:{result.id}") or 0)
    log = prefork_worker.read_text()
    assert states[-1] == "FAILURE", (states, log[-3000:])
    assert "RETRY" in states, f"states seen: {states}"
    assert "FAILURE" not in states[:-1], f"FAILURE before the last attempt: {states}"
    assert runs == 2, f"ran {runs} times; the policy allows 2 attempts"
    dead = get_message(amqp_channel, f"ojs.queue.dlx.{QUEUE}", timeout=20)
    assert dead.properties["message_id"] == result.id
    assert dead.properties["application_headers"]["x-ojs-attempt"] == 2
