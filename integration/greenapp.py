"""The app ``celery -A integration.greenapp worker -P gevent|eventlet`` runs in the
green-pool tests (``test_green_pools.py``).

Settings come from the environment (``OJS_GREEN_*``), so one module serves both
pools.  Every task counts its runs in Redis (``<prefix>:runs:<job id>``): the
worker is another process, and the tests assert exact counts, so the record must
survive the worker and be shared by its greenlets.  Sleeps are ``time.sleep``,
which ``celery worker -P gevent|eventlet`` monkeypatches into a green sleep.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery

import ojs_kombu

#: The OJS retry policy of ``green.flaky``: attempt 2 comes 0.1 s after attempt 1.
FLAKY_RETRY = {"max_attempts": 3, "initial_interval": "PT0.1S", "jitter": False}
#: ``green.fail`` gets two attempts, then its dead letter.
FAIL_RETRY = {"max_attempts": 2, "initial_interval": "PT0.1S", "jitter": False}


def runs_key(prefix: str, job_id: str) -> str:
    return f"{prefix}:runs:{job_id}"


def make_app(broker: str, backend: str, redis_url: str, prefix: str, control: str) -> Celery:
    """The green-pool test app; ``control`` names its remote-control exchange, so a
    ``ping`` reaches this worker only (other workers share the test vhost)."""
    app = Celery("green", broker=broker, backend=backend, set_as_current=False)
    ojs_kombu.install(app)
    app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
                    control_exchange=control, result_expires=600,
                    ojs_worker_heartbeat=1, ojs_job_heartbeat=1)
    store = redis.Redis.from_url(redis_url)

    def ran(job_id: str | None, **fields: Any) -> int:
        """Count one run of ``job_id`` (and note ``fields``); the run's number."""
        assert job_id is not None
        if fields:
            store.hset(f"{prefix}:info:{job_id}", mapping=fields)
        return int(store.incr(runs_key(prefix, job_id)))

    @app.task(name="green.flaky", bind=True, shared=False, ojs_retry=FLAKY_RETRY)
    def flaky(self: Any) -> str:
        attempt = getattr(self.request, "x-ojs-attempt", None)
        if ran(self.request.id) == 1:
            raise ConnectionError(f"attempt {attempt} failed")
        return f"done on attempt {attempt}"

    @app.task(name="green.flaky_celery", bind=True, shared=False,
              autoretry_for=(ConnectionError,), max_retries=2, default_retry_delay=0.1)
    def flaky_celery(self: Any) -> str:
        """The Celery way: ``autoretry_for`` (Celery's retry semantics, the default)."""
        if ran(self.request.id) == 1:
            raise ConnectionError("attempt 1 failed")
        return f"done on attempt {getattr(self.request, 'x-ojs-attempt', None)}"

    @app.task(name="green.fail", bind=True, shared=False, ojs_retry=FAIL_RETRY)
    def fail(self: Any) -> None:
        ran(self.request.id)
        raise RuntimeError("always fails")

    @app.task(name="green.record", bind=True, shared=False)
    def record(self: Any, value: int = 0, sleep: float = 0.0) -> int:
        ran(self.request.id, started=time.time())
        if sleep:
            time.sleep(sleep)
        return value

    @app.task(name="green.loop", bind=True, shared=False)
    def loop(self: Any, seconds: float) -> str:
        """Cooperative: checks ``self.ojs.cancelled`` between green sleeps."""
        ran(self.request.id, state="running")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.ojs.cancelled:
                store.hset(f"{prefix}:info:{self.request.id}", "state", "cancelled")
                return "stopped early"
            time.sleep(0.05)
        store.hset(f"{prefix}:info:{self.request.id}", "state", "completed")
        return "ran to the end"

    return app


def _from_environment() -> Celery | None:
    broker = os.environ.get("OJS_GREEN_BROKER_URL")
    if broker is None:  # imported by the test process
        return None
    return make_app(broker, os.environ["OJS_GREEN_BACKEND"], os.environ["OJS_GREEN_REDIS"],
                    os.environ["OJS_GREEN_PREFIX"], os.environ["OJS_GREEN_CONTROL"])


app = _from_environment()
