"""A producer with ``ojs_publish_confirms="deferred"`` (integration/test_deferred_confirms.py).

``python -m integration.deferredapp QUEUE N`` publishes ``N`` jobs to ``QUEUE`` (bounded:
``reject-publish`` at :data:`BOUND` jobs), prints their ids as one JSON line and ends
without any flush of its own: the process's exit waits for every confirm.

``celery -A integration.deferredapp worker`` (``OJS_TEST_BROKER_URL`` and
``OJS_TEST_DEFERRED_QUEUE`` set) runs ``deferred.fan_out``, which publishes the same
way from inside a job: the worker's shutdown waits for every confirm.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from celery import Celery

import ojs_kombu

#: Jobs the bounded queue holds before the broker refuses publishes (Basic.Nack).
BOUND = 10


def make_app(queue: str, broker_url: str) -> Celery:
    app = Celery("deferred", broker=broker_url, set_as_current=False)
    ojs_kombu.install(app)
    app.conf.update(
        ojs_publish_confirms="deferred",
        ojs_queue_arguments={queue: {"x-max-length": BOUND, "x-overflow": "reject-publish"}})

    @app.task(name="deferred.echo", shared=False)
    def echo(n: int) -> Any:
        return n

    @app.task(name="deferred.fan_out", shared=False)
    def fan_out(jobs: int, ids_file: str) -> None:
        """Publish ``jobs`` echo jobs to the bounded queue, write their ids, return
        without any flush of its own."""
        ids = [echo.apply_async((n,), queue=queue).id for n in range(jobs)]
        with open(ids_file, "w") as out:
            json.dump(ids, out)

    return app


if os.environ.get("OJS_TEST_DEFERRED_QUEUE"):
    app = make_app(os.environ["OJS_TEST_DEFERRED_QUEUE"], os.environ["OJS_TEST_BROKER_URL"])


if __name__ == "__main__":
    queue, jobs = sys.argv[1], int(sys.argv[2])
    app = make_app(queue, os.environ["OJS_TEST_BROKER_URL"])
    echo = app.tasks["deferred.echo"]
    ids = [echo.apply_async((n,), queue=queue).id for n in range(jobs)]
    print(json.dumps(ids), flush=True)
