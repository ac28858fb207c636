"""Celery app of the scale part (``scale.py``): one app with N job queues, plain Celery or
ojs_kombu, for the worker subprocess and the publisher.

The worker runs as ``python -m celery -A scale_app worker -Q q0,...`` and takes its
settings from the environment (``BENCH_SCALE_*``); the publisher builds the same app
with :func:`make_app`.  ``scale.retry_once`` fails its first attempt and retries itself
with a countdown (a retry queue under ojs_kombu, an ETA held by the worker under plain
Celery); every finished job appends a line to the record file.
"""

from __future__ import annotations

import os

from celery import Celery
from celery.app.task import Task
from sides import celery_app, open_record

RETRY_COUNTDOWN_S = 2


def queue_names(n: int) -> list[str]:
    return [f"q{i}" for i in range(n)]


def make_app(broker: str, side: str, *, record_path: str | None = None,
             quorum: bool = False, set_as_current: bool = False) -> Celery:
    """``side`` ``"plain"`` (``broker`` ``amqp://``) or ``"ojs"`` (``ojs://``)."""
    app = celery_app("bench_scale", broker, ojs_prefix="" if side == "ojs" else None,
                     set_as_current=set_as_current)
    if side == "ojs":
        if quorum:
            app.conf.ojs_queue_defaults = {"type": "quorum"}
    else:
        app.conf.broker_transport_options = {"confirm_publish": True}
        if quorum:
            # Celery's own settings (the -Q queues are created as missing ones)
            app.conf.task_default_queue_type = "quorum"
            app.conf.task_create_missing_queue_type = "quorum"
    app.conf.update(task_acks_late=True, task_ignore_result=True, result_backend=None,
                    broker_connection_retry_on_startup=True, worker_prefetch_multiplier=4)
    _register(app, record_path)
    return app


def _register(app: Celery, record_path: str | None) -> None:
    record = open_record(record_path)

    def done(tag: str) -> None:
        if record is not None:
            os.write(record, f"{tag}\n".encode())

    @app.task(name="scale.noop", ignore_result=True, shared=False)
    def noop(tag: str) -> None:
        done(tag)

    @app.task(name="scale.retry_once", bind=True, ignore_result=True, shared=False,
              max_retries=1)
    def retry_once(self: Task, tag: str) -> None:
        if not self.request.retries:
            raise self.retry(countdown=RETRY_COUNTDOWN_S)
        done(tag)


def _from_environment() -> Celery | None:
    broker = os.environ.get("BENCH_SCALE_BROKER")
    if broker is None:  # imported by the publisher
        return None
    return make_app(broker, os.environ["BENCH_SCALE_SIDE"],
                    record_path=os.environ.get("BENCH_SCALE_RECORD"),
                    quorum=os.environ.get("BENCH_SCALE_QUORUM") == "1", set_as_current=True)


app = _from_environment()
