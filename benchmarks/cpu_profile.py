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
from typing import Any

from celery import signals


def main() -> None:
    out, flag, module, *rest = sys.argv[1:]
    if flag != "-m":
        raise SystemExit(__doc__)
    sys.argv = [module, *rest]
    profiler = cProfile.Profile(time.thread_time)

    def ready(**_: Any) -> None:
        profiler.enable()

    signals.worker_ready.connect(ready, weak=False)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit:
        pass
    finally:
        profiler.disable()
        profiler.dump_stats(out)


if __name__ == "__main__":
    main()
