"""Celery app of the dedup drain, for ``python -m celery -A dedup_app worker``.

``dedup_drain.py`` fills the queue, then starts a worker from this module with the
``BENCH_DEDUP_*`` environment variables read at the bottom.  Every side shares
``sides.common_conf`` and one task, ``bench.dedup``, which appends
``"<start> <end>\\n"`` to the record file in one ``O_APPEND`` write; with
``BENCH_DEDUP_WORK_MS`` it first spins that many milliseconds of the pool
process's CPU (``time.process_time``), a job that does work instead of none.
The ojs_kombu sides have ``ojs_dedup_url`` set; only the jobs of the keys-on
side carry an idempotency key.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery
from sides import celery_app, common_conf, open_record

TASK_NAME = "bench.dedup"


def make_app(broker: str, queue: str, record_path: str | None, ojs_prefix: str | None,
             dedup_url: str | None, *, work_ms: float = 0.0,
             set_as_current: bool = False) -> Celery:
    app = celery_app("bench_dedup", broker, ojs_prefix=ojs_prefix or None,
                     set_as_current=set_as_current)
    if ojs_prefix:
        app.conf.update(ojs_dedup_url=dedup_url,
                        ojs_dedup_retention=900.0)
    common_conf(app, queue)
    work_s = work_ms / 1000
    record = open_record(record_path)

    @app.task(name=TASK_NAME, ignore_result=True, shared=False)
    def noop(*_args: Any) -> None:
        started = time.time()
        if work_s:
            spent = time.process_time() + work_s
            while time.process_time() < spent:
                pass
        if record is not None:
            os.write(record, f"{started:.6f} {time.time():.6f}\n".encode())

    return app


app = (make_app(os.environ["BENCH_DEDUP_BROKER"], os.environ["BENCH_DEDUP_QUEUE"],
                os.environ["BENCH_DEDUP_RECORD"], os.environ.get("BENCH_DEDUP_OJS_PREFIX"),
                os.environ.get("BENCH_DEDUP_URL"),
                work_ms=float(os.environ.get("BENCH_DEDUP_WORK_MS") or 0), set_as_current=True)
       if "BENCH_DEDUP_BROKER" in os.environ else None)
