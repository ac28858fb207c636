"""Celery app of the prefork drain, for ``python -m celery -A drain_app worker``.

An in-process worker cannot run the prefork pool reliably, so the throughput part
drains with prefork through a worker subprocess built from this module.  It
takes its settings from the environment (``BENCH_DRAIN_*``, set by
``prefork_drain.py``) and builds the in-process sides' app (``sides.py``): the
same task name, ``task_acks_late``, no results, no remote control; the ojs side is
``ojs_kombu.install``-ed with the run's prefix.  Every job appends
``"<start> <end>\\n"`` (``time.time()``, seconds; ``"<start> <end> <published>\\n"`` for a
job whose first argument is its publish time) to the record file, one
``O_APPEND`` write, so lines from the pool processes never interleave.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery
from sides import TASK_NAME, celery_app, common_conf, open_record


def make_app(broker: str, queue: str, record_path: str, ojs_prefix: str | None,
             max_priority: int | None = None, ojs_acks: str | None = None,
             quorum: bool = False, acks_early: bool = False) -> Celery:
    app = celery_app("bench_drain", broker, ojs_prefix=ojs_prefix or None, set_as_current=True)
    if ojs_prefix:
        if ojs_acks:
            app.conf.ojs_acks = ojs_acks
        if quorum:
            app.conf.ojs_queue_defaults = {"type": "quorum"}
        if os.environ.get("BENCH_DRAIN_OJS_NO_PRIORITY") == "1":  # classic, no x-max-priority
            app.conf.ojs_max_priority = None
        if os.environ.get("BENCH_DRAIN_UNCHECKED") == "1":  # the ceiling: no envelope check
            import unchecked
            unchecked.install()
    common_conf(app, queue, max_priority, quorum=quorum and not ojs_prefix)
    if acks_early and not ojs_prefix:  # plain Celery on its own default: ack on receipt
        app.conf.task_acks_late = False
    record = open_record(record_path)
    # BENCH_DRAIN_WORK_MS: each job waits that long (a call to another service), not a no-op
    work_s = float(os.environ.get("BENCH_DRAIN_WORK_MS") or 0) / 1000

    @app.task(name=TASK_NAME, ignore_result=True, shared=False)
    def noop(*args: Any) -> None:
        started = time.time()
        if work_s:
            time.sleep(work_s)
        # A float first argument is its publish time (latency_memory.py): a third field.
        sent = f" {args[0]:.6f}" if args and isinstance(args[0], float) else ""
        os.write(record, f"{started:.6f} {time.time():.6f}{sent}\n".encode())

    return app


app = (make_app(os.environ["BENCH_DRAIN_BROKER"], os.environ["BENCH_DRAIN_QUEUE"],
                os.environ["BENCH_DRAIN_RECORD"], os.environ.get("BENCH_DRAIN_OJS_PREFIX"),
                int(os.environ.get("BENCH_DRAIN_MAX_PRIORITY") or 0) or None,
                os.environ.get("BENCH_DRAIN_OJS_ACKS") or None,
                os.environ.get("BENCH_DRAIN_QUORUM") == "1",
                os.environ.get("BENCH_DRAIN_ACKS_EARLY") == "1")
       if "BENCH_DRAIN_BROKER" in os.environ else None)
