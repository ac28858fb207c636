"""``celery -A integration.polyglotapp worker`` for integration/test_node_interop.py.

The Celery side of the Node.js example (examples/node): tasks whose OJS types the
Node producer sends, each run appended as one JSON line to ``OJS_TEST_RUNS_FILE``
(the worker is another process, so the test reads what ran from there), and the
``"amqp"`` event sink on, which the Node subscriber reads.  No result backend:
INFO answers from the workers' memory.
"""

from __future__ import annotations

import json
import os
import threading
from datetime import UTC, datetime
from typing import Any

from celery import Celery

import ojs_kombu

app = Celery("polyglot", broker=os.environ["OJS_TEST_BROKER_URL"], set_as_current=False)
ojs_kombu.install(app)
app.conf.update(broker_connection_retry_on_startup=False, worker_hijack_root_logger=False,
                ojs_event_sinks=[{"amqp": True, "batch_ms": 10}])

_lock = threading.Lock()


def record(task: Any, **fields: Any) -> None:
    """One line per run: the job id, its attempt and when it started."""
    request = task.request
    line = {"id": request.id, "type": task.name,
            "attempt": getattr(request, "x-ojs-attempt", None),
            "scheduled_at": getattr(request, "x-ojs-scheduled-at", None),
            "started": datetime.now(UTC).isoformat(), **fields}
    with _lock, open(os.environ["OJS_TEST_RUNS_FILE"], "a", encoding="utf-8") as runs:
        runs.write(json.dumps(line) + "\n")


@app.task(name="greet.hello", bind=True, shared=False)
def hello(self: Any, name: str) -> str:
    record(self, args=[name])
    return f"hello {name}"


@app.task(name="billing.charge", bind=True, shared=False)
def charge(self: Any, day: Any, ref: Any, amount: Any, **kwargs: Any) -> str:
    """Records the Python types its arguments arrived as (a Node job sends typed values)."""
    record(self, args=[str(day), str(ref), str(amount)],
           kinds=[type(v).__name__ for v in (day, ref, amount)])
    return f"charged {amount}"


@app.task(name="always.fail", bind=True, shared=False)
def always_fail(self: Any) -> None:
    record(self, args=[])
    raise RuntimeError("this task always fails")
