"""CPU per publish of this checkout's ojs_kombu, beside plain Celery's, in one process.

Waiting ``apply_async``, ``apply_async`` with deferred confirms (flushed per block) and
``enqueue_many``, with plain Celery's ``confirm_publish`` as the control: the
process's CPU time (``time.process_time()``) and the wall clock per call, each block
into a purged queue.  CPU time is what a loaded machine disturbs least, so two
checkouts can be compared by running this from each in turn::

    .venv/bin/python benchmarks/publish_cpu.py [BLOCKS]

One JSON line: the commit, the load average and each block's figures.  Queue names
are unique to the run and deleted at the end.
"""
from __future__ import annotations

import json
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from admin import Broker
from measure import publish, publish_batches, publish_deferred, warm_up
from sides import DEFERRED_CONF, make_ojs_side, make_plain_side

import ojs_kombu

URL = "amqp://guest:guest@127.0.0.1:5672//"
tag = f"b47cpu{secrets.token_hex(3)}"
broker = Broker(URL)
sides = {
    "plain_confirm": make_plain_side(URL, f"{tag}"),
    "ojs_wait": make_ojs_side(URL, 0, prefix=f"{tag}w"),
    "ojs_deferred": make_ojs_side(URL, 0, prefix=f"{tag}d", conf=DEFERRED_CONF),
    "ojs_batch": make_ojs_side(URL, 0, prefix=f"{tag}b"),
}
N = {"plain_confirm": 1500, "ojs_wait": 1500, "ojs_deferred": 5000, "ojs_batch": 20000}
send: dict[str, Any] = {
    "plain_confirm": lambda s, n: publish(s, n),
    "ojs_wait": lambda s, n: publish(s, n),
    "ojs_deferred": lambda s, n: publish_deferred(s, n),
    "ojs_batch": lambda s, n: publish_batches(s, n, 1000),
}
out: dict[str, list[dict[str, float]]] = {k: [] for k in sides}
try:
    for key, side in sides.items():
        warm_up(side, broker)
        if key == "ojs_deferred":
            ojs_kombu.flush_confirms()
    for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
        for key, side in sides.items():
            broker.purge(side.amqp_queue)
            c0, w0 = time.process_time(), time.perf_counter()
            send[key](side, N[key])
            c1, w1 = time.process_time(), time.perf_counter()
            broker.purge(side.amqp_queue)
            out[key].append({"cpu_us": (c1 - c0) / N[key] * 1e6, "jobs_per_s": N[key] / (w1 - w0)})
finally:
    for side in sides.values():
        side.app.close()
        broker.delete_side(side)
    broker.close()
commit = os.popen("git rev-parse --short HEAD").read().strip()
print(json.dumps({"git": commit, "load": os.getloadavg()[0], "blocks": out}))
