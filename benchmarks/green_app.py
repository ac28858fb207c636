"""Celery app of the green-pool drain, for ``python -m celery -A green_app worker -P gevent``.

``green_drain.py`` fills the queue, then starts a worker from this module with the
``BENCH_GREEN_*`` environment variables read at the bottom.  Both sides share
``sides.common_conf`` (acks late, no results, no remote control) and one
I/O-bound task, ``bench.io``: ``time.sleep(0.01)``, which ``celery worker -P
gevent|eventlet`` monkeypatches into a green sleep, so 100 greenlets overlap
their waits.  Every job appends ``"<start> <end>\\n"`` (``time.time()``) to the
record file in one ``O_APPEND`` write.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery
from sides import celery_app, common_conf, open_record

TASK_NAME = "bench.io"
#: What each job waits, in seconds (a green sleep in the worker).
SLEEP_S = 0.01


def make_app(broker: str, queue: str, record_path: str | None, ojs_prefix: str | None,
             *, set_as_current: bool = False) -> Celery:
    """Plain Celery, or with ``ojs_prefix`` the README's ``ojs://`` + ``install(app)``;
    ``record_path`` ``None`` for the publishing side (nothing runs there)."""
    app = celery_app("bench_green", broker, ojs_prefix=ojs_prefix or None,
                     set_as_current=set_as_current)
    common_conf(app, queue)
    record = open_record(record_path)

    @app.task(name=TASK_NAME, ignore_result=True, shared=False)
    def io(*_args: Any) -> None:
        started = time.time()
        time.sleep(SLEEP_S)
        if record is not None:
            os.write(record, f"{started:.6f} {time.time():.6f}\n".encode())

    return app


app = (make_app(os.environ["BENCH_GREEN_BROKER"], os.environ["BENCH_GREEN_QUEUE"],
                os.environ["BENCH_GREEN_RECORD"], os.environ.get("BENCH_GREEN_OJS_PREFIX"),
                set_as_current=True)
       if "BENCH_GREEN_BROKER" in os.environ else None)
