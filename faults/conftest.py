"""Fixtures of the fault suite: RabbitMQ nodes of its own, worker subprocesses, counts.

The destructive tests stop, start and cut the connections of a broker: they
run against a separate node (``ojs-faults@localhost`` on port 5673, data and
logs in a temporary directory) or a three-node cluster (:mod:`faults.cluster`,
ports 5681-5683) that this suite starts and always stops, never against the
shared broker on 5672.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from ojs_kombu.spec.job_ids import new_job_id

from .cluster import RABBITMQ_EXEC, Cluster, node_conf, port_open, rabbitmqctl_command, wait_until

ROOT = Path(__file__).resolve().parents[1]
NODE = os.environ.get("OJS_FAULTS_NODE", "ojs-faults@localhost")
PORT = int(os.environ.get("OJS_FAULTS_PORT", "5673"))
DIST_PORT = int(os.environ.get("OJS_FAULTS_DIST_PORT", "25673"))
BROKER_URL = f"ojs://guest:guest@127.0.0.1:{PORT}//"
CLUSTER_PORTS = tuple(int(p) for p in os.environ.get(
    "OJS_CLUSTER_PORTS", "5681,5682,5683").split(","))
CLUSTER_DIST_PORTS = tuple(int(p) for p in os.environ.get(
    "OJS_CLUSTER_DIST_PORTS", "25681,25682,25683").split(","))
CLUSTER_NAME = os.environ.get("OJS_CLUSTER_NAME", "ojs-c")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """One xdist worker for ``-n auto`` (setup.cfg): the suite's nodes take fixed ports
    (above) and it stops and cuts them, so its modules run one after the other.  ``-n
    0`` (faults/README.rst) runs them in pytest's own process, where ``-s`` shows their
    progress."""
    return 1


#: What RabbitMQ 4.0.5's ``start_app`` now and then fails with on a loaded machine,
#: ``transient_nonexcl_queues`` denied and no such queue declared (a cluster node
#: always: ``cluster.CLUSTER_PERMITS``); asked again, the node starts.
DENY_RACE = "failed_to_deny_deprecated_features"


def rabbitmqctl(*args: str, timeout: float = 120, check: bool = True) -> str:
    """``rabbitmqctl -n NODE ARGS``' output; ``start_app`` is asked again (up to 3 times)
    only when it failed with :data:`DENY_RACE`."""
    for attempt in range(3 if args[:1] == ("start_app",) else 1):
        if attempt:
            time.sleep(2)
        result = subprocess.run(rabbitmqctl_command(NODE, *args), capture_output=True,
                                text=True, timeout=timeout, check=False)
        if result.returncode == 0 or DENY_RACE not in result.stderr + result.stdout:
            break
    if check and result.returncode != 0:
        raise RuntimeError(f"rabbitmqctl -n {NODE} {' '.join(args)} failed: "
                           f"{result.stderr.strip() or result.stdout.strip()}")
    return result.stdout


def await_broker() -> None:
    rabbitmqctl("--timeout", "120", "await_startup")
    wait_until(lambda: port_open(PORT), 60, f"AMQP on port {PORT}")


@pytest.fixture(scope="session")
def fault_node() -> Iterator[str]:
    """Start the suite's own RabbitMQ node; stop it and delete its data at the end."""
    if port_open(PORT) or port_open(DIST_PORT):
        pytest.fail(f"port {PORT} or node {NODE} is already in use: the fault suite runs "
                    "only against a node it starts itself (stop the leftover node first)")
    base = Path(tempfile.mkdtemp(prefix="ojs-faults-"))
    (base / "enabled_plugins").write_text("")
    (base / "rabbitmq.conf").write_text(node_conf(PORT))
    shutil.chown(base, "rabbitmq", "rabbitmq")
    for path in base.iterdir():
        shutil.chown(path, "rabbitmq", "rabbitmq")
    env = {**os.environ, "RABBITMQ_NODENAME": NODE, "RABBITMQ_NODE_PORT": str(PORT),
           "RABBITMQ_DIST_PORT": str(DIST_PORT), "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
           "RABBITMQ_LOG_BASE": str(base / "log"),
           "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
           "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins")}
    subprocess.run([*RABBITMQ_EXEC, "rabbitmq-server", "-detached"], env=env, cwd=base,
                   check=True, timeout=60)
    try:
        # its distribution port takes connections once the Erlang node is up (asked
        # in a loop, so not with ``rabbitmqctl ping``: ~0.7 s of CPU a run)
        wait_until(lambda: port_open(DIST_PORT), 60, f"node {NODE} to come up")
        await_broker()
        yield NODE
    finally:
        rabbitmqctl("stop", check=False)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def fault_broker_url(fault_node: str) -> str:
    return BROKER_URL


@pytest.fixture
def broker_app_running(fault_node: str) -> Iterator[None]:
    """Whatever a test does to the node, it leaves the rabbit app running (started again
    where AMQP does not answer: the app listens once it has booted)."""
    yield
    if not port_open(PORT):
        rabbitmqctl("start_app", check=False)
        await_broker()


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """The suite's own three-node cluster; stopped and deleted at the end, also on failure."""
    with Cluster(CLUSTER_PORTS, CLUSTER_DIST_PORTS,  # type: ignore[arg-type]
                 CLUSTER_NAME) as nodes:
        yield nodes


@pytest.fixture
def healed_cluster(cluster: Cluster) -> Iterator[Cluster]:
    """Whatever a test does to the nodes, every node runs its app afterwards."""
    try:
        yield cluster
    finally:
        cluster.heal()


class Workers:
    """``celery worker`` subprocesses of ``faults.app``, each in its own process group."""

    def __init__(self, broker_url: str, done_file: Path, log: Path,
                 conf: dict[str, Any] | None = None) -> None:
        self.broker_url = broker_url
        self.done_file = done_file
        self.log = log
        self.conf = conf or {}
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, queue: str, *extra: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, "OJS_FAULTS_BROKER_URL": self.broker_url,
               "OJS_FAULTS_DONE_FILE": str(self.done_file),
               "OJS_FAULTS_CONF": json.dumps(self.conf)}
        with self.log.open("ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "faults.app", "worker", "-Q", queue,
                 "-n", f"faults-{len(self.processes)}@%h", "--loglevel", "INFO",
                 "--without-mingle", "--without-gossip", "--without-heartbeat", *extra],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        self.processes.append(process)
        return process

    def wait_ready(self, timeout: float = 120) -> None:
        """Until every worker started so far has said ``ready.``: only then is a
        broker disruption a *re*connection for all of them (a worker still starting
        when the broker goes away merely connects late, and reports nothing)."""
        wait_until(lambda: self.log.exists()
                   and self.log.read_text(errors="replace").count(" ready.")
                   >= len(self.processes), timeout, "the workers to be ready")

    def kill9(self, process: subprocess.Popen[bytes]) -> None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                with suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)


@pytest.fixture
def workers(fault_broker_url: str, tmp_path: Path) -> Iterator[Workers]:
    pool = Workers(fault_broker_url, tmp_path / "done.txt", tmp_path / "workers.log")
    try:
        yield pool
    finally:
        pool.stop_all()


@dataclass
class Counts:
    """What happened to every job of a fault test, printed and checked."""

    published: list[str] = field(default_factory=list)
    confirmed: list[str] = field(default_factory=list)
    #: job id -> the exception ``apply_async`` raised for it
    refused: dict[str, BaseException] = field(default_factory=dict)
    #: job id -> seconds its refused ``apply_async`` took (reported, not checked)
    refused_after: dict[str, float] = field(default_factory=dict)
    #: ``time.monotonic()`` of each confirm, in order (for the longest stall)
    confirmed_at: list[float] = field(default_factory=list)
    #: ``time.monotonic()`` of each refusal, in order
    refused_at: list[float] = field(default_factory=list)

    def completions(self, done_file: Path) -> collections.Counter[str]:
        if not done_file.exists():
            return collections.Counter()
        return collections.Counter(done_file.read_text().split())

    def report(self, name: str, done_file: Path) -> dict[str, int]:
        done = self.completions(done_file)
        lost = [job for job in self.confirmed if job not in done]
        numbers = {
            "published": len(self.published) + len(self.refused),
            "confirmed": len(self.confirmed),
            "refused": len(self.refused),
            # raised to the producer, yet it ran: the broker had it before the
            # connection died (at-least-once; the producer may publish it again)
            "refused_but_ran": sum(job in done for job in self.refused),
            "completed": len(done),
            "duplicated": sum(n - 1 for n in done.values()),
            "lost": len(lost),
        }
        print(f"\n[{name}] " + " ".join(f"{k}={v}" for k, v in numbers.items()))
        for job, exc in self.refused.items():
            print(f"  refused {job} after {self.refused_after.get(job, 0):.1f}s: "
                  f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")
        return numbers

    def wait_completed(self, done_file: Path, timeout: float,
                       stop: Callable[[], str | None] = lambda: None) -> None:
        """Wait until every confirmed job ran; ``stop()``, asked every 2 s, names a reason
        none can complete any more (the worker stopped), which ends the wait at once."""
        asked = [0.0]

        def done() -> bool:
            if time.monotonic() - asked[0] >= 2.0:
                asked[0] = time.monotonic()
                if reason := stop():
                    raise AssertionError(f"stopped waiting for the jobs to complete: {reason}")
            return all(job in self.completions(done_file) for job in self.confirmed)

        wait_until(done, timeout, "every confirmed job to complete")


def publish(app: Celery, counts: Counts, n: int, *, seconds: float = 0.0,
            queue: str, pause: float = 0.0, task_name: str = "faults.record",
            until: threading.Event | None = None) -> None:
    """``n`` jobs of ``task_name`` one after another (``pause`` s apart), each counted as
    confirmed or refused; with ``until``, more after the ``n`` th until it is set (so that
    a disruption always finds the producer publishing, however slow the machine)."""
    task = app.tasks[task_name]
    for sent in itertools.count():
        if sent >= n and (until is None or until.is_set()):
            break
        if pause:
            time.sleep(pause)
        job_id = new_job_id()  # known before the publish: a refused job may still run
        started = time.monotonic()
        try:
            task.apply_async((seconds,), queue=queue, task_id=job_id)
        except Exception as exc:  # surfaced to the producer: counted, never silent
            counts.refused[job_id] = exc
            counts.refused_after[job_id] = time.monotonic() - started
            counts.refused_at.append(time.monotonic())
            continue
        counts.published.append(job_id)
        counts.confirmed.append(job_id)  # apply_async returns after the confirm
        counts.confirmed_at.append(time.monotonic())


def longest_gap(times: list[float]) -> float:
    """The longest wait between two consecutive events: how long clients saw an outage."""
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


class CompletionClock:
    """Samples the done file every 0.1 s: when completions grew, for the longest stall."""

    def __init__(self, done_file: Path) -> None:
        self.done_file = done_file
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CompletionClock:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        size = 0
        while not self._stop.wait(0.1):
            with suppress(OSError):
                now = self.done_file.stat().st_size
                if now > size:
                    size = now
                    self.times.append(time.monotonic())
