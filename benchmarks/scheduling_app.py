"""Celery app of the scheduling benchmark, for the worker subprocess and the publisher.

The worker runs as ``python -m celery -A scheduling_app worker ...`` in its own
process, so its memory can be measured apart from the publisher's; it takes
its settings from the environment (``BENCH_SCHED_*``, set by
``benchmarks/scheduling.py``).  The publisher builds the same app in-process
with :func:`make_app`.  Settings follow the drains' sides (``sides.common_conf``),
except that remote control stays on so the worker can
answer ``ping``; its exchanges carry the run's own name, so cleanup finds them.
"""

from __future__ import annotations

import os
import time

from celery import Celery
from celery.app.task import Task
from sides import celery_app, open_record

TASK_NAME = "bench.sched"  # fits the OJS job type grammar
#: First task argument: ``IDLE`` jobs only wait (the memory part); others
#: append ``"<tag> <lateness seconds>"`` to the record file.
IDLE = "idle"


def make_app(broker: str, queue: str, control_exchange: str, *, ojs_prefix: str | None = None,
             record_path: str | None = None, set_as_current: bool = False,
             confirm: bool = True) -> Celery:
    """Plain Celery app, or an ojs_kombu one when ``ojs_prefix`` is given (broker ``ojs://``);
    ``confirm=False`` gives plain Celery its default publish (no confirms)."""
    app = celery_app("bench_sched", broker, ojs_prefix=ojs_prefix,
                     set_as_current=set_as_current)
    if ojs_prefix is None:
        app.conf.broker_transport_options = {"confirm_publish": confirm}
    app.conf.update(
        task_default_queue=queue,
        task_acks_late=True,
        task_ignore_result=True,
        result_backend=None,
        control_exchange=control_exchange,
        broker_connection_retry_on_startup=True,
    )
    _register(app, record_path)
    return app


def _register(app: Celery, record_path: str | None) -> Task:
    """The no-op that reports lateness: ``shared=False`` keeps it off the other side's app."""
    record = open_record(record_path)

    @app.task(name=TASK_NAME, ignore_result=True, shared=False)
    def sched(tag: str, due_ts: float) -> None:
        lateness = time.time() - due_ts
        if record is not None and tag != IDLE:
            # One short O_APPEND write per job: lines from the pool threads never interleave.
            os.write(record, f"{tag} {lateness:.6f}\n".encode())

    return sched


def _from_environment() -> Celery | None:
    broker = os.environ.get("BENCH_SCHED_BROKER")
    if broker is None:  # imported by the publisher, not by a worker
        return None
    return make_app(broker, os.environ["BENCH_SCHED_QUEUE"], os.environ["BENCH_SCHED_CONTROL"],
                    ojs_prefix=os.environ.get("BENCH_SCHED_OJS_PREFIX") or None,
                    record_path=os.environ.get("BENCH_SCHED_RECORD"), set_as_current=True)


app = _from_environment()
