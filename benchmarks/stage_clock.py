"""``python stage_clock.py OUT -m celery ARGS...``: a Celery worker whose main thread's CPU
time is clocked per stage of a delivery, from ``worker_ready`` on, written to OUT (JSON:
stage -> ``[nanoseconds, calls]``) when it exits (``profile_worker.py --stages``).

cProfile charges every Python call alike, so it overstates code made of many small
calls and understates C; this clock reads the thread's real CPU time (user and
system: the syscalls too) around a few calls that every worker makes, on both sides:

* ``receive``: kombu's ``Transport.on_readable`` (frames read and decoded, the job handed
  to Celery's strategy and queued for the pool); within it ``strategy`` (Celery's task
  message handler) and, on ojs_kombu, ``envelope check`` (``decode_job_message``);
* ``accepted`` and ``ready``: billiard's callbacks when a pool process took the job and
  when it finished it (Celery's ``on_accepted`` and ``on_success``: plain Celery on its
  defaults acks in the first, a worker acking late in the second);
* ``ack flush``: ojs_kombu writing the acks collected in one loop iteration;
* ``socket writes``: py-amqp's writes to the broker (acks), wherever they are made;
* ``job to pool``: the request pickled for a pool process (within ``strategy`` when a
  process is free, else later from the loop's writer callbacks); ``pipe writes``:
  billiard's writes of those jobs to the pool processes' pipes (a header, then the
  job), wherever they are made;
* ``loop iteration > timers``: the hub's timers, fired once per event-loop iteration
  (its calls count the iterations);
* ``main thread, in all``: from ``worker_ready`` until the worker stopped (its
  shutdown too): what the stages leave out is the rest of the event loop.

Stages nest (``strategy`` is part of ``receive``), so they do not add up to the whole.
Each clocked call reads the clock twice (about a microsecond on a 2-core VM), on
both sides alike.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cpu_profile import run_worker

#: stage -> [nanoseconds, calls] while clocking
TOTALS: dict[str, list[int]] = {}
_clocking = [False]


def _clocked(stage: str, function: Callable[..., Any]) -> Callable[..., Any]:
    total = TOTALS.setdefault(stage, [0, 0])
    clock = time.thread_time_ns

    def clocked(*args: Any, **kwargs: Any) -> Any:
        if not _clocking[0]:
            return function(*args, **kwargs)
        started = clock()
        try:
            return function(*args, **kwargs)
        finally:
            total[0] += clock() - started
            total[1] += 1
    return clocked


def _wrap(owner: Any, name: str, stage: str) -> None:
    setattr(owner, name, _clocked(stage, getattr(owner, name)))


def install() -> None:
    """Wrap the stages' calls before the worker builds its consumer and pool."""
    import amqp.transport
    import billiard.compat
    import billiard.pool
    from celery.worker import strategy
    from kombu.asynchronous import hub
    from kombu.transport import base

    _wrap(base.Transport, "on_readable", "receive")
    _wrap(billiard.pool.ApplyResult, "_ack", "accepted")
    _wrap(billiard.pool.ApplyResult, "_set", "ready")
    _wrap(amqp.transport._AbstractTransport, "write", "socket writes")
    _wrap(billiard.compat, "__write__", "pipe writes")  # send_offset's os.write
    _wrap(hub.Hub, "fire_timers", "loop iteration > timers")
    default = strategy.default

    def clocked_strategy(*args: Any, **kwargs: Any) -> Any:
        return _clocked("receive > strategy", default(*args, **kwargs))

    strategy.default = clocked_strategy
    from celery.concurrency import asynpool
    create_write_handlers = asynpool.AsynPool._create_write_handlers

    def clocked_write_handlers(pool: Any, *args: Any, **kwargs: Any) -> Any:
        made = create_write_handlers(pool, *args, **kwargs)
        pool._quick_put = _clocked("job to pool (pickled)", pool._quick_put)
        return made

    asynpool.AsynPool._create_write_handlers = clocked_write_handlers
    try:
        from ojs_kombu.amqp import transport
        from ojs_kombu.amqp.consuming import receiver
    except ImportError:  # plain Celery's worker without ojs_kombu installed
        return
    _wrap(receiver, "decode_job_message", "receive > envelope check")
    _wrap(transport.Connection, "flush_acks", "ack flush")


def main() -> None:
    out = sys.argv[1]
    started = 0

    def start() -> None:
        nonlocal started
        started = time.thread_time_ns()
        _clocking[0] = True

    def finish() -> None:
        _clocking[0] = False
        if started:
            TOTALS["main thread, in all"] = [time.thread_time_ns() - started, 1]
        Path(out).write_text(json.dumps(TOTALS))

    install()
    run_worker(__doc__, start, finish)


if __name__ == "__main__":
    main()
