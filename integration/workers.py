"""The one way the integration suite starts a Celery worker and knows it is ready.

Ready means consuming: a consumer on each of the worker's job queues
(``ojs.queue.{q}``), as the broker reports it with a passive ``queue_declare``.
A dead-letter queue that exists, a ``ready.`` log line or a ping answer come
earlier: the worker declares its dead-letter queue before it binds and consumes
its job queues, and a publish that nothing routes in that window is confirmed
and dropped by the broker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import unquote, urlsplit

import amqp
from celery import Celery
from celery.contrib.testing.worker import start_worker

ROOT = Path(__file__).resolve().parents[1]
#: Seconds a worker may take to consume its queues (two cores shared by several runs).
READY_S = 90.0


def job_queue(queue: str) -> str:
    return f"ojs.queue.{queue}"


def _connect(broker_url: str | Sequence[str]) -> amqp.Connection:
    """A py-amqp connection to the broker of ``broker_url`` (host, port, credentials,
    vhost); of a failover list (``a;b`` or a list), the first that answers."""
    urls = broker_url.split(";") if isinstance(broker_url, str) else list(broker_url)
    refused: OSError | None = None
    for candidate in urls:
        url = urlsplit(candidate.strip())
        connection = amqp.Connection(
            f"{url.hostname or '127.0.0.1'}:{url.port or 5672}",
            userid=unquote(url.username or "guest"), password=unquote(url.password or "guest"),
            virtual_host=unquote(url.path[1:]) or "/", connect_timeout=5)
        try:
            connection.connect()
        except OSError as exc:
            refused = exc
            continue
        return connection
    raise AssertionError(f"no broker of {broker_url!r} answered ({refused})")


def consumers(channel: amqp.Channel, queue: str) -> int:
    """Consumers of ``queue`` as the broker sees them (0 while it does not exist)."""
    probe = channel.connection.channel()  # a failed passive declare closes its channel
    try:
        count = int(probe.queue_declare(queue, passive=True).consumer_count)
    except amqp.exceptions.NotFound:
        return 0
    probe.close()
    return count


def consumer_counts(broker_url: str | Sequence[str], queues: Sequence[str]) -> dict[str, int]:
    connection = _connect(broker_url)
    try:
        channel = connection.channel()
        return {queue: consumers(channel, queue) for queue in queues}
    finally:
        connection.close()


def wait_consuming(broker_url: str | Sequence[str], queues: Sequence[str], *,
                   timeout: float = READY_S, alive: Any = None, what: str = "the worker",
                   before: Mapping[str, int] | None = None) -> None:
    """Return once each of ``queues`` (broker names) has a consumer (one more than
    ``before`` counted, for a worker joining others); fail after ``timeout`` or as
    soon as ``alive()`` says the worker is gone."""
    connection = _connect(broker_url)
    try:
        channel = connection.channel()
        deadline = time.monotonic() + timeout
        waiting = list(queues)
        while waiting:
            if alive is not None and not alive():
                raise AssertionError(f"{what} exited before consuming {waiting}")
            waiting = [queue for queue in waiting
                       if consumers(channel, queue) <= (before or {}).get(queue, 0)]
            if waiting and time.monotonic() > deadline:
                raise AssertionError(f"{what} did not consume {waiting} within {timeout}s")
            if waiting:
                time.sleep(0.1)
    finally:
        connection.close()


class WorkerProcess:
    """A ``celery -A APP worker`` subprocess in a session of its own."""

    def __init__(self, process: subprocess.Popen[bytes], log: Path | None, hostname: str,
                 queues: Sequence[str]) -> None:
        self.process = process
        self.log = log
        self.hostname = hostname
        self.queues = tuple(queues)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_text(self) -> str:
        if self.log is None or not self.log.exists():
            return ""
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM to the main process only, as a supervisor sends it: a warm shutdown
        lets the pool finish and ack (SIGTERM to the whole group kills a pool process
        mid-ack, and its job is then a lost worker's); SIGKILL of the group after
        ``timeout``.  Returns the exit code (``None``: it had to be killed)."""
        if self.process.poll() is not None:
            return self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        """SIGKILL to the worker and its pool processes, as a crash ends them."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()


def launch_worker(broker_url: str, app: str, queues: str | Sequence[str], *,
                  pool: str = "threads", concurrency: int = 2, hostname: str | None = None,
                  log: Path | None = None, env: Mapping[str, str] | None = None,
                  cwd: Path = ROOT, loglevel: str = "INFO",
                  without: Sequence[str] = ("mingle", "gossip"), options: Sequence[str] = (),
                  ready: bool = True, control: bool = False,
                  timeout: float = READY_S) -> WorkerProcess:
    """Start ``celery -A app worker -Q queues`` and, with ``ready``, wait until it
    consumes each job queue (see the module's docstring).

    ``OJS_TEST_BROKER_URL`` is ``broker_url`` in the worker's environment, with
    ``env`` on top; output goes to ``log`` (appended) or nowhere; ``without`` lists
    Celery's ``--without-*`` switches, ``options`` any further worker options;
    ``control`` waits for its OJS control queues (``ojs.queue.control.{q}``,
    consumed just after the job queues) too.
    """
    names = [queues] if isinstance(queues, str) else list(queues)
    hostname = hostname or f"{names[0]}-{uuid.uuid4().hex[:6]}@%h"
    argv = [sys.executable, "-m", "celery", "-A", app, "worker", "-Q", ",".join(names),
            "-n", hostname, "--pool", pool, "-c", str(concurrency), "--loglevel", loglevel,
            *(f"--without-{switch}" for switch in without), *options]
    environment = {**os.environ, "OJS_TEST_BROKER_URL": broker_url, **(env or {})}
    consumed = [job_queue(q) for q in names]
    consumed += [f"ojs.queue.control.{q}" for q in names] if control else []
    before = consumer_counts(broker_url, consumed) if ready else {}
    if log is None:
        process = subprocess.Popen(argv, cwd=cwd, env=environment, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True)
    else:
        with log.open("ab") as out:
            process = subprocess.Popen(argv, cwd=cwd, env=environment,
                                       stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=subprocess.STDOUT, start_new_session=True)
    worker = WorkerProcess(process, log, hostname, names)
    if ready:
        try:
            wait_consuming(broker_url, consumed, timeout=timeout, alive=worker.alive,
                           what=f"the worker of {app} on {names}", before=before)
        except AssertionError as exc:
            worker.stop(10)
            raise AssertionError(f"{exc}\n{worker.log_text()[-3000:]}") from None
    return worker


@contextmanager
def in_process_worker(app: Celery, queues: Sequence[str], *, pool: str = "threads",
                      concurrency: int = 2, shutdown_timeout: float = 60.0,
                      **options: Any) -> Iterator[Any]:
    """Celery's in-process test worker for ``app``, yielded once it consumes each of
    ``queues`` (each stop costs ~10 s with py-amqp: share one where tests can)."""
    with start_worker(app, pool=pool, concurrency=concurrency, perform_ping_check=False,
                      queues=list(queues), shutdown_timeout=shutdown_timeout,
                      loglevel="WARNING", **options) as worker:
        wait_consuming(app.conf.broker_url, [job_queue(q) for q in queues],
                       what=f"the in-process worker of {app.main}")
        yield worker
