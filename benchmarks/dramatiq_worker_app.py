"""Dramatiq worker module of ``latency_memory.py``: ``python -m dramatiq dramatiq_worker_app``.

Its settings come from the environment (``BENCH_DQ_URL``, ``BENCH_DQ_QUEUE``,
``BENCH_DQ_RECORD``).  The actor has the name ``dramatiq_side.DramatiqPublisher``
sends to; each message appends ``"<start> <end> <published>\\n"`` (``time.time()``;
the third field is the message's first argument, its publish time) to the record
file, in the format of ``drain_app``'s.
"""

from __future__ import annotations

import os
import time
from typing import Any

import dramatiq
from dramatiq_side import ACTOR_NAME, dramatiq_broker

broker = dramatiq_broker(os.environ["BENCH_DQ_URL"])
dramatiq.set_broker(broker)
_record = os.open(os.environ["BENCH_DQ_RECORD"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)


@dramatiq.actor(actor_name=ACTOR_NAME, queue_name=os.environ["BENCH_DQ_QUEUE"])
def noop(*args: Any) -> None:
    started = time.time()
    sent = f" {args[0]:.6f}" if args and isinstance(args[0], float) else ""
    os.write(_record, f"{started:.6f} {time.time():.6f}{sent}\n".encode())
