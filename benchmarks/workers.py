"""Where every worker subprocess of the benchmarks starts and stops.

:func:`spawn` starts ``python ARGV`` with this directory on ``PYTHONPATH`` (the worker
app modules, ``*_app.py``, import ``sides.py`` from it), its output into a log file;
:func:`stop` ends it (SIGTERM, then SIGKILL of its process group: no pool process
outlives a run); :func:`rss_bytes` reads its memory with its children's.  The drains'
workers are :class:`WorkerProcess` objects whose jobs record ``start end`` lines.
Each part still chooses its worker's command line (pool, concurrency, gossip,
mingle, heartbeat): those are part of what it measures.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: Seconds a drain worker has for its warm shutdown before its group is SIGKILLed.
STOP_TIMEOUT = 20.0


@contextmanager
def workdir(part: str) -> Iterator[Path]:
    """A directory for a part's worker logs and record files, removed at the end (also
    after an error)."""
    with tempfile.TemporaryDirectory(prefix=f"ojs-bench-{part}-",
                                     ignore_cleanup_errors=True) as path:
        yield Path(path)


def environment(env: dict[str, str]) -> dict[str, str]:
    """This process's environment with ``env`` and this directory first on ``PYTHONPATH``."""
    merged = {**os.environ, **env}
    merged["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), merged.get("PYTHONPATH")]))
    return merged


def spawn(argv: list[str], env: dict[str, str], log: Path, *, session: bool = False,
          cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """``python ARGV`` with :func:`environment` of ``env``, stdout and stderr into ``log``;
    ``session``: in a session (and process group) of its own, so :func:`stop` can
    kill its pool with it and a Ctrl-C of the run does not reach it."""
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, *argv], env=environment(env), cwd=cwd,
                                stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=session)


def tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` of a worker's log (for the error that reports its death)."""
    with suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL of a worker and, when :func:`spawn` started it with ``session``, of its
    whole process group (its pool)."""
    with suppress(ProcessLookupError, PermissionError):
        if os.getpgid(process.pid) == process.pid:
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.kill()


def stop(process: subprocess.Popen[bytes], timeout: float) -> None:
    """Warm shutdown (SIGTERM), then after ``timeout`` :func:`kill_group`."""
    if process.poll() is None:
        with suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            process.wait(timeout)
    kill_group(process)
    process.wait()


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` plus all its descendants (prefork children would count)."""
    try:
        import psutil
    except ImportError:
        return sum(_proc_rss(p) for p in _proc_tree(pid))
    with suppress(psutil.NoSuchProcess):
        root = psutil.Process(pid)
        total = root.memory_info().rss
        for child in root.children(recursive=True):
            with suppress(psutil.NoSuchProcess):
                total += child.memory_info().rss
        return total
    return 0


def _proc_tree(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for children in Path(f"/proc/{current}/task").glob("*/children"):
            with suppress(OSError):
                todo += [int(c) for c in children.read_text().split()]
    return found


def _proc_rss(pid: int) -> int:
    with suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def read_record(path: Path) -> list[tuple[float, float]]:
    """``(start, end)`` of every job recorded so far (a partial last line is skipped)."""
    spans = []
    for line in path.read_text().splitlines():
        start, _, rest = line.partition(" ")
        with suppress(ValueError):
            spans.append((float(start), float(rest.split(" ", 1)[0])))
    return spans


class WorkerProcess:
    """``python -m celery -A APP worker`` as a subprocess of its own session (its pool
    too), its jobs recording ``start end`` lines to a file (``record_var`` in its
    environment names it), its output in a log next to it.

    The prefork drains (``prefork_drain.py``), the green and dedup parts, the latency
    part and the worker profile (``profile_worker.py``) start their workers this way:
    :meth:`spans` waits until ``n`` jobs ran, :meth:`stop` (or leaving the ``with``)
    stops it and every pool process.  ``profile``: the main thread's CPU profile into
    that file (``cpu_profile.py``); ``stages``: the main thread's CPU time per stage of a
    delivery into that file (``stage_clock.py``); ``extra_args``: more ``celery worker``
    options."""

    def __init__(self, *, app_module: str, pool: str, concurrency: int, queue: str,
                 workdir: Path, name: str, record_var: str, env: dict[str, str],
                 profile: Path | None = None, extra_args: tuple[str, ...] = (),
                 stages: Path | None = None) -> None:
        self.record, self.log = workdir / f"{name}.record", workdir / f"{name}.log"
        self.record.write_bytes(b"")
        # ``profile``: a CPU-time cProfile of the main process's main thread into that file.
        profiler = [str(HERE / "cpu_profile.py"), str(profile)] if profile is not None else []
        if stages is not None:  # the stages' CPU clock of the main thread into that file
            profiler = [str(HERE / "stage_clock.py"), str(stages)]
        self.process = spawn(
            [*profiler, "-m", "celery", "-A", app_module, "worker",
             "--pool", pool, "-c", str(concurrency), "-Q", queue, "--without-mingle",
             "--without-gossip", "--without-heartbeat", "--loglevel", "WARNING",
             "-n", f"{name}@localhost", *extra_args],
            {**env, record_var: str(self.record)}, self.log, session=True)

    @property
    def pid(self) -> int:
        return self.process.pid

    def spans(self, n: int, timeout: float, label: str, *, poll_s: float = 0.1,
              on_first: Callable[[], None] | None = None) -> list[tuple[float, float]]:
        """``(start, end)`` of the first ``n`` jobs, once they ran; ``on_first`` is called
        when the first job is recorded.  A worker that exits or a timeout raises."""
        deadline = time.monotonic() + timeout
        while len(spans := read_record(self.record)) < n:
            if on_first is not None and spans:
                on_first()
                on_first = None
            if self.process.poll() is not None:
                raise RuntimeError(f"{label} worker exited with status "
                                   f"{self.process.returncode}:\n{tail(self.log)}")
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{label}: only {len(spans)}/{n} jobs ran within "
                                   f"{timeout:.0f}s:\n{tail(self.log)}")
            time.sleep(poll_s)
        return spans

    def stop(self) -> None:
        stop(self.process, STOP_TIMEOUT)

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def elapsed(spans: list[tuple[float, float]]) -> float:
    """Seconds from the earliest job start to the latest job end."""
    return max(end for _, end in spans) - min(start for start, _ in spans)
