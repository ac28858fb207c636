"""``python cpu_profile.py OUT -m celery ARGS...``: a Celery worker whose main thread is profiled
from ``worker_ready`` on (its start-up left out), with cProfile timed by that thread's CPU
clock, the stats written to OUT when it exits (``profile_worker.py``).

A wall-clock profile on a loaded machine charges every function for the time the
scheduler gave to other processes; the thread's CPU time does not.
"""

from __future__ import annotations

import cProfile
import runpy
import sys
import time
from collections.abc import Callable

from celery import signals


def run_worker(usage: str, start: Callable[[], None], finish: Callable[[], None]) -> None:
    """Run ``-m MODULE ARGS...`` (``sys.argv`` from its second item on) as ``python -m``
    would, calling ``start`` at ``worker_ready`` and ``finish`` when it exits (the
    wrappers of a worker's main thread: this profile, ``stage_clock.py``)."""
    flag, module, *rest = sys.argv[2:]
    if flag != "-m":
        raise SystemExit(usage)
    sys.argv = [module, *rest]
    signals.worker_ready.connect(lambda **_: start(), weak=False)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit:
        pass
    finally:
        finish()


def main() -> None:
    out = sys.argv[1]
    profiler = cProfile.Profile(time.thread_time)

    def finish() -> None:
        profiler.disable()
        profiler.dump_stats(out)

    run_worker(__doc__, profiler.enable, finish)


if __name__ == "__main__":
    main()
