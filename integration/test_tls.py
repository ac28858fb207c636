"""``ojss://`` against a real TLS listener: ``verify_peer``, client certificates.

The module starts a node of its own (:func:`integration.rabbitmq_node.tls_node`:
certificates made here with ``openssl``, a CA, a server certificate for
``localhost``/``127.0.0.1``, a client certificate; no plain TCP listener), under
``OJS_RABBITMQ_EXEC`` when set (RabbitMQ 4.x in CI) or this machine's RabbitMQ.
Workers are ``celery -A integration.tlsapp worker`` subprocesses; the CLI is the
installed ``ojs-kombu``.  Every client uses ``broker_use_ssl`` as docs/production.rst
writes it (no ``server_hostname``: the URL's host is checked).  What fails for good,
and a broker that is down, is :mod:`integration.test_tls_failures`.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from .apps import make_app
from .conftest import queue_counts, wait_until
from .rabbitmq_node import TLSNode, cannot_start_reason, tls_node
from .test_cli import cli_path
from .workers import WorkerProcess, launch_worker

ROOT = Path(__file__).resolve().parents[1]
#: The drain: jobs of 50 KB (each frame past TLS's 16 KB record) published while consumed.
DRAIN_JOBS = int(os.environ.get("OJS_TEST_TLS_DRAIN_JOBS", "5000"))
PAYLOAD = "x" * 50_000


@pytest.fixture(scope="module")
def node() -> Iterator[TLSNode]:
    reason = cannot_start_reason()
    if reason:
        pytest.skip(f"no TLS test broker: {reason}")
    with tls_node() as started:
        yield started


def tls_env(node: TLSNode, done_file: Path, url: str | None = None, replace: Any = None,
            **ssl_changes: Any) -> dict[str, str]:
    """The environment of ``integration.tlsapp``: the node's URL (or ``url``) and its
    ``broker_use_ssl`` with ``ssl_changes`` (or ``replace`` in its place)."""
    url = url or node.url()
    ssl_options = node.ssl_options(**ssl_changes) if replace is None else replace
    return {**os.environ, "OJS_TEST_BROKER_URL": url, "OJS_BROKER_URL": url,
            "OJS_TEST_BROKER_USE_SSL": json.dumps(ssl_options),
            "OJS_TEST_DONE_FILE": str(done_file)}


def start_worker(node: TLSNode, queue: str, done_file: Path, log: Path) -> WorkerProcess:
    """The one launcher; the test waits for the consumer through the TLS node itself."""
    return launch_worker(node.url(), "integration.tlsapp", queue, pool="threads",
                         concurrency=4, hostname=f"{queue}@%h", log=log,
                         env=tls_env(node, done_file), ready=False)


def producer(node: TLSNode, **ssl_changes: Any) -> Celery:
    return make_app("tls-producer", node.url(), "rpc://",
                    broker_use_ssl=node.ssl_options(**ssl_changes))


def consumers(node: TLSNode, queue: str) -> int:
    """Consumers of ``ojs.queue.{queue}`` on the node, asked over TLS with a passive
    ``Queue.Declare`` (polled: no Erlang VM a poll, as ``rabbitmqctl`` would start)."""
    counts = queue_counts("/", f"ojs.queue.{queue}", address=f"localhost:{node.port}",
                          ssl=node.ssl_options())
    return counts[1] if counts else 0


def done(done_file: Path) -> list[str]:
    return done_file.read_text().split() if done_file.exists() else []


def test_a_worker_runs_jobs_over_tls(node: TLSNode, tmp_path: Path) -> None:
    """The README's flow over ``ojss://``: a worker consumes, runs, answers."""
    worker = start_worker(node, "tls-readme", tmp_path / "done", tmp_path / "worker.log")
    try:
        wait_until(lambda: consumers(node, "tls-readme"), 60, "the worker's consumer")
        app = producer(node)
        results = [app.send_task("math.add", args=[n, 1], queue="tls-readme") for n in range(5)]
        assert [r.get(timeout=30) for r in results] == [1, 2, 3, 4, 5]
        record = app.send_task("tls.record", args=["hello"], queue="tls-readme")
        assert record.get(timeout=30) == 5 and done(tmp_path / "done") == [record.id]
        # the connections the broker holds are TLS, with the client's certificate
        lines = node.ctl("list_connections", "--no-table-headers", "ssl",
                         "peer_cert_subject").splitlines()
        assert lines and all(line.startswith("true\t") for line in lines), lines
        assert all("ojs-kombu test client" in line for line in lines), lines
    finally:
        worker.stop()


def test_large_jobs_drain_while_published_each_run_once(node: TLSNode, tmp_path: Path) -> None:
    done_file = tmp_path / "done"
    worker = start_worker(node, "tls-drain", done_file, tmp_path / "worker.log")
    try:
        wait_until(lambda: consumers(node, "tls-drain"), 60, "the worker's consumer")
        app = producer(node)
        started = time.monotonic()
        with app.producer_or_acquire() as publisher:
            ids = [app.send_task("tls.record", args=[PAYLOAD], queue="tls-drain",
                                 producer=publisher, ignore_result=True).id
                   for _ in range(DRAIN_JOBS)]
        published = time.monotonic() - started
        assert done(done_file), "nothing ran while the jobs were published"
        wait_until(lambda: len(done(done_file)) >= DRAIN_JOBS, 600,
                   f"{DRAIN_JOBS} jobs to run (ran {len(done(done_file))})")
        time.sleep(2)  # a duplicate would show up now
        ran = done(done_file)
        print(f"[tls drain] {DRAIN_JOBS} x 50 KB: published in {published:.1f} s, "
              f"all ran in {time.monotonic() - started:.1f} s")
        assert sorted(ran) == sorted(ids)  # each once, none lost
    finally:
        worker.stop()


def test_worker_and_producer_reconnect_after_the_tls_connection_is_cut(
        node: TLSNode, tmp_path: Path) -> None:
    done_file = tmp_path / "done"
    worker = start_worker(node, "tls-cut", done_file, tmp_path / "worker.log")
    try:
        wait_until(lambda: consumers(node, "tls-cut"), 60, "the worker's consumer")
        app = producer(node)
        first = app.send_task("tls.record", args=["before"], queue="tls-cut")
        assert first.get(timeout=30) == 6
        assert node.ctl("list_connections", "--no-table-headers", "pid").split()
        # every connection of this node (the test's own), in one rabbitmqctl run
        node.ctl("close_all_connections", "TLS connection cut by the test")
        wait_until(lambda: consumers(node, "tls-cut"), 60, "the worker's consumer to come back")
        # the publishes reconnect; the runs are read from the worker's record, not through
        # rpc:// (its result consumer's connection was cut too, and Celery 5.5's raises
        # ConnectionForced on the next get, as it does on plain Celery)
        after = [app.send_task("tls.record", args=["after"], queue="tls-cut") for _ in range(3)]
        expected = sorted([first.id, *(r.id for r in after)])
        wait_until(lambda: sorted(done(done_file)) == expected, 60, "the jobs sent after the cut")
        log = (tmp_path / "worker.log").read_text()
        assert "TLS connection cut by the test" in log or "reconnect" in log.lower(), log[-3000:]
    finally:
        worker.stop()


def cli(node: TLSNode, tmp_path: Path, *args: str, url: str | None = None,
        ssl_options: Any = None) -> subprocess.CompletedProcess[str]:
    """The installed ``ojs-kombu`` with the environment of :func:`tls_env`."""
    env = tls_env(node, tmp_path / "done", url=url, replace=ssl_options)
    return subprocess.run([cli_path(), *args], env=env, capture_output=True, text=True,
                          timeout=300, cwd=ROOT, check=False)


def test_the_cli_over_tls(node: TLSNode, tmp_path: Path) -> None:
    """``dlq``, ``conformance`` and ``migrate`` with the app's ``broker_use_ssl``."""
    def dlq(*args: str) -> Any:
        result = cli(node, tmp_path, "dlq", *args, "-q", "tls-cli", "-A", "integration.tlsapp",
                     "--json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    worker = start_worker(node, "tls-cli", tmp_path / "done", tmp_path / "worker.log")
    try:
        wait_until(lambda: consumers(node, "tls-cli"), 60, "the worker's consumer")
        app = producer(node)
        failed = app.send_task("toggle.fail", queue="tls-cli", ignore_result=True).id
        wait_until(lambda: dlq("list")["count"] == 1, 60, "the failed job's dead letter")
        assert [d["job_id"] for d in dlq("list")["dead_letters"]] == [failed]
        assert dlq("show", failed)["envelope"]["id"] == failed
        assert dlq("replay", failed)["replayed"] == [failed]
        wait_until(lambda: dlq("list")["count"] == 1, 60, "the replayed job to fail again")
        assert dlq("purge", "--yes")["deleted"] == 1

        report = cli(node, tmp_path, "conformance", "-q", "tls-cli", "-A", "integration.tlsapp",
                     "--json")
        checks = {c["id"]: c for c in json.loads(report.stdout)["checks"]}
        failures = {i: c["reason"] for i, c in checks.items() if c["status"] == "fail"}
        assert failures == {} and report.returncode == 0, report.stderr
        assert checks["AMQP-004"]["status"] == "pass"
    finally:
        worker.stop()
    migrate = cli(node, tmp_path, "migrate", "check", "-A", "integration.tlsapp", "--json")
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr
