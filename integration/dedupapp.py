"""The app of the unique-job and idempotency tests (``-A integration.dedupapp``).

Every run of ``dedup.count`` adds one to ``ojs-test:runs:{tag}`` in Redis under
the job's idempotency key (else its id): the ground truth for "ran N times".
Results go to Redis too, so a duplicate's caller can read the first run's result.
A run given a ``gate`` holds until the test creates that file (:func:`hold`).
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery

import ojs_kombu
from integration.apps import hold

REDIS = os.environ.get("OJS_TEST_REDIS_URL", "redis://127.0.0.1:6379")


def runs_key(tag: str) -> str:
    return f"ojs-test:runs:{tag}"


def make_dedup_app(broker_url: str, dedup_url: str | None = f"{REDIS}/2",
                   **conf: Any) -> Celery:
    app = Celery("dedup", broker=broker_url, backend=f"{REDIS}/1", set_as_current=False)
    ojs_kombu.install(app)
    app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
                    ojs_dedup_url=dedup_url, result_expires=3600, **conf)
    counter = redis.Redis.from_url(f"{REDIS}/2")

    @app.task(name="dedup.count", bind=True, shared=False)
    def count(self: Any, tag: str, n: int = 0, seconds: float = 0.0, gate: str = "") -> int:
        hold(seconds, gate)
        key = getattr(self.request, "x-ojs-idempotency-key", None) or self.request.id
        counter.hincrby(runs_key(tag), key, 1)
        return n * 2

    @app.task(name="dedup.keyed", bind=True, shared=False, ojs_idempotency_key=True)
    def keyed(self: Any, tag: str, seconds: float = 0.0) -> str:
        if seconds:
            time.sleep(seconds)
        counter.hincrby(runs_key(tag), self.request.id, 1)
        return self.request.id

    return app


app = make_dedup_app(os.environ.get("OJS_TEST_BROKER_URL", "ojs://guest:guest@127.0.0.1//"),
                     os.environ.get("OJS_TEST_DEDUP_URL", f"{REDIS}/2"),
                     ojs_dedup_when_down=os.environ.get("OJS_TEST_DEDUP_WHEN_DOWN", "run"))
