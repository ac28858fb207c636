"""The Node.js OJS client of examples/node against a real ``celery worker``, both ways.

Node to Celery: jobs the Node producer enqueues (confirmed, mandatory) run as Celery
tasks; a failing one is retried by the broker and dead-lettered; a scheduled one
waits in a delay queue; the Node producer's INFO and CANCEL reach the Celery worker.
Celery to Node: jobs sent with ``apply_async`` run on the Node worker, which retries
through the retry topology, dead-letters with ``Basic.Nack`` and answers INFO.  The
Node event subscriber sees the Celery worker's lifecycle events, each checked against
``event.schema.json``.  Skipped, with the reason, where ``node`` or ``npm`` is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import amqp
import pytest
from celery import Celery

from ojs_kombu.amqp.broker.control import ControlClient

from .apps import make_app
from .conftest import HOST, PORT, body_of, rabbitmqctl, wait_until
from .test_helpers import check_event, check_job
from .workers import WorkerProcess, launch_worker

ROOT = Path(__file__).resolve().parents[1]
NODE_DIR = ROOT / "examples" / "node"
#: The Celery worker's queue (Node to Celery) and the Node worker's (Celery to Node).
TO_CELERY = "polyglot-celery"
TO_NODE = "polyglot-node"
FAST_RETRY = {"max_attempts": 3, "initial_interval": "PT0.2S", "jitter": False}


@pytest.fixture(scope="module")
def node() -> str:
    """The ``node`` binary, with examples/node's dependencies installed (``npm ci``)."""
    node_bin, npm_bin = shutil.which("node"), shutil.which("npm")
    if node_bin is None or npm_bin is None:
        pytest.skip(f"{'node' if node_bin is None else 'npm'} is not on PATH: the Node.js "
                    "interop tests need Node.js 20 and npm")
    if not (NODE_DIR / "node_modules" / "amqplib").is_dir():
        done = subprocess.run([npm_bin, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR,
                              capture_output=True, text=True, timeout=300, check=False)
        if done.returncode != 0:
            pytest.fail(f"npm ci in {NODE_DIR} failed: {done.stderr.strip()}")
    return node_bin


class NodeProcess:
    """A long-running Node script whose stdout is JSON lines, collected as they come."""

    def __init__(self, node: str, env: dict[str, str], *args: str) -> None:
        self.lines: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self.process = subprocess.Popen([node, *args], cwd=NODE_DIR, env=env, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._cond:
                self.lines.append(json.loads(line))
                self._cond.notify_all()

    def wait_for(self, match: Callable[[dict[str, Any]], bool], count: int = 1,
                 timeout: float = 30.0) -> list[dict[str, Any]]:
        """The first ``count`` lines ``match`` accepts, waiting for them."""
        def found() -> list[dict[str, Any]]:
            return [line for line in self.lines if match(line)]
        with self._cond:
            if not self._cond.wait_for(lambda: len(found()) >= count or
                                       self.process.poll() is not None, timeout):
                raise AssertionError(f"{count} matching line(s) not seen within {timeout}s; "
                                     f"got {self.lines}")
            lines = found()
            if len(lines) < count:
                stderr = self.process.stderr.read() if self.process.stderr else ""
                raise AssertionError(f"node exited ({self.process.returncode}): {stderr}")
            return lines[:count]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture(scope="module")
def node_env(vhost: str) -> dict[str, str]:
    """What a Node process needs: the broker URL of the test vhost in ``OJS_AMQP_URL``."""
    url = f"amqp://guest:guest@{HOST}:{PORT}/{quote(vhost, safe='')}"
    return {**os.environ, "OJS_AMQP_URL": url}


def producer(node: str, env: dict[str, str], *args: str) -> dict[str, Any]:
    """``node producer.js ARGS``: its one JSON line (``AssertionError`` with its stderr)."""
    done = subprocess.run([node, "producer.js", *args], cwd=NODE_DIR, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"producer.js {' '.join(args)}: {done.stderr.strip()}"
    return json.loads(done.stdout)


def messages(vhost: str) -> dict[str, int]:
    """Every queue's messages, ready and unacked, as the broker counts them."""
    lines = rabbitmqctl("list_queues", "--no-table-headers", "-p", vhost, "name", "messages")
    return {name: int(count) for name, count in
            (line.split("\t") for line in lines.splitlines() if line)}


def queue_arguments(vhost: str, queue: str) -> str:
    for line in rabbitmqctl("list_queues", "--no-table-headers", "-p", vhost, "name",
                            "arguments").splitlines():
        name, _, arguments = line.partition("\t")
        if name == queue:
            return arguments
    raise AssertionError(f"no queue {queue}")


def dead_letters(vhost: str, queue: str) -> dict[str, amqp.Message]:
    """The dead letters of ``queue`` by job id, left in place (taken, then nacked back)."""
    connection = amqp.Connection(f"{HOST}:{PORT}", virtual_host=vhost)
    connection.connect()
    try:
        channel = connection.channel()
        found: dict[str, amqp.Message] = {}
        while (message := channel.basic_get(f"ojs.queue.dlx.{queue}")) is not None:
            found[message.properties["message_id"]] = message
        return found  # closing the channel puts them back
    finally:
        connection.close()


@pytest.fixture(scope="module")
def runs_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("polyglot") / "runs.jsonl"
    path.touch()
    return path


def runs(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def celery_worker(broker_url: str, vhost: str, runs_file: Path, node: str,
                  node_env: dict[str, str]) -> Iterator[WorkerProcess]:
    """``celery -A integration.polyglotapp worker -Q polyglot-celery``, a real subprocess,
    consuming its job and control queues."""
    with launch_worker(broker_url, "integration.polyglotapp", TO_CELERY,
                       hostname=f"polyglot-{os.getpid()}@%h", concurrency=4,
                       log=runs_file.parent / "worker.log", control=True,
                       env={"OJS_TEST_RUNS_FILE": str(runs_file)}) as worker:
        yield worker


@pytest.fixture(scope="module")
def node_events(node: str, node_env: dict[str, str]) -> Iterator[NodeProcess]:
    """``node events.js job.*``: the Node side's subscription to the OJS events exchange."""
    events = NodeProcess(node, node_env, "events.js", "job.*")
    events.wait_for(lambda line: "subscribed" in line)
    yield events
    events.stop()


@pytest.fixture(scope="module")
def node_worker(node: str, node_env: dict[str, str]) -> Iterator[NodeProcess]:
    """``node worker.js polyglot-node``."""
    worker = NodeProcess(node, node_env, "worker.js", TO_NODE)
    worker.wait_for(lambda line: line.get("event") == "ready")
    yield worker
    worker.stop()


def test_node_producer_jobs_run_on_a_celery_worker(
        node: str, node_env: dict[str, str], celery_worker: Any, runs_file: Path,
        vhost: str) -> None:
    def enqueue(*args: str) -> dict[str, Any]:
        return producer(node, node_env, "enqueue", TO_CELERY, *args)

    ok = enqueue("greet.hello", '["ada"]')
    failing = enqueue("always.fail", "[]", "--retry", json.dumps(FAST_RETRY))
    later = enqueue("greet.hello", '["later"]', "--delay-ms", "1500")
    # due late enough for the CANCEL (another node process) to come first on a slow machine
    never = enqueue("greet.hello", '["never"]', "--delay-ms", "8000")
    assert producer(node, node_env, "cancel", TO_CELERY, never["id"]) == {"cancelled": never["id"]}

    def ran(job: dict[str, Any], count: int = 1) -> list[dict[str, Any]]:
        return wait_until(lambda: len(found := [r for r in runs(runs_file)
                                                if r["id"] == job["id"]]) >= count and found,
                          30, f"{count} run(s) of {job['id']}")

    assert ran(ok)[0]["args"] == ["ada"]
    # INFO from Node: the Celery worker answers from what it ran (AMQP-021)
    assert wait_until(lambda: producer(node, node_env, "info", TO_CELERY, ok["id"])["state"]
                      == "completed", 30, "INFO completed")

    scheduled = ran(later)[0]
    assert scheduled["scheduled_at"] == later["scheduled_at"]
    assert datetime.fromisoformat(scheduled["started"]) >= datetime.fromisoformat(
        later["scheduled_at"])  # never early: it waited in the broker

    # retried by the broker (attempts 1, 2, 3), then Basic.Nack into ojs.queue.dlx.{q}
    assert [r["attempt"] for r in ran(failing, 3)] == [1, 2, 3]
    dead = wait_until(lambda: dead_letters(vhost, TO_CELERY).get(failing["id"]), 30,
                      "the failing job's dead letter")
    assert dead.properties["application_headers"]["x-death"][0]["reason"] == "rejected"
    check_job(body_of(dead))

    # CANCEL from Node before the job started: the worker acks it unrun when it arrives
    due = datetime.fromisoformat(never["scheduled_at"])
    seen: list[bool] = []

    def settled() -> bool:
        """Due, and neither waiting nor delivered in two listings in a row (a listing is
        per queue, so a job moving between them can be missed by one); nothing is
        listed before it is due (each listing is a ``rabbitmqctl`` run)."""
        if datetime.now(UTC) < due:
            return False
        counts = messages(vhost)
        seen.append(not counts[f"ojs.queue.{TO_CELERY}"]
                    and not counts[f"ojs.queue.retry.{TO_CELERY}.8000"])
        return seen[-2:] == [True, True]
    wait_until(settled, 45, "the cancelled job to arrive and be settled", interval=1.0)
    never_state = producer(node, node_env, "info", TO_CELERY, never["id"])["state"]
    never_runs = [r for r in runs(runs_file) if r["id"] == never["id"]]
    assert never_state == "cancelled" and not never_runs
    assert set(dead_letters(vhost, TO_CELERY)) == {failing["id"]}

    # mandatory + Basic.Return: a control message nobody can receive is reported
    # (a name of this test's own: another test of the session may have declared a
    # control queue for a fixed name)
    nobody = f"nobody-node-{os.getpid()}-{ok['id'][-12:]}"
    unroutable = subprocess.run([node, "producer.js", "info", nobody,
                                 ok["id"]], cwd=NODE_DIR, env=node_env, capture_output=True,
                                text=True, timeout=60, check=False)
    assert unroutable.returncode == 1 and "unroutable" in unroutable.stderr

    mine = [r for r in runs(runs_file) if r["id"] in {ok["id"], failing["id"], later["id"]}]
    completed = {ok["id"], later["id"]} & {r["id"] for r in mine}
    counts = {"sent": 4, "ran": len(mine), "retried": len(mine) - len({r["id"] for r in mine}),
              "completed": len(completed), "dead-lettered": len(dead_letters(vhost, TO_CELERY)),
              "cancelled": int(never_state == "cancelled" and not never_runs)}
    counts["lost"] = 4 - counts["completed"] - counts["dead-lettered"] - counts["cancelled"]
    print(f"\nNode -> Celery: {counts}")
    assert counts == {"sent": 4, "ran": 5, "retried": 2, "completed": 2, "dead-lettered": 1,
                      "cancelled": 1, "lost": 0}
    assert sum(messages(vhost).get(q, 0) for q in (f"ojs.queue.{TO_CELERY}",
                                                   f"ojs.queue.control.{TO_CELERY}")) == 0


@pytest.fixture(scope="module")
def celery_producer(broker_url: str) -> Celery:
    """A Celery app that knows the Node worker's job types only by name."""
    app = make_app("polyglot-producer", broker_url, None)

    def runs_in_node(*args: Any) -> None:
        raise NotImplementedError("the Node worker runs this type")

    for name in ("report.sum", "payment.charge", "export.slow"):
        app.task(name=name, shared=False)(runs_in_node)
    return app


def test_a_node_job_gives_a_celery_task_a_date_a_uuid_and_a_decimal(
        node: str, node_env: dict[str, str], celery_worker: Any, runs_file: Path) -> None:
    """examples/node marks typed values; the Celery task receives Python types."""
    args = [{"$celery": "date", "value": "2026-07-01"},
            {"$celery": "uuid", "value": "0f8fad5b-d9cb-469f-a165-70867728950e"},
            {"$celery": "decimal", "value": "19.90"}]
    job = producer(node, node_env, "enqueue", TO_CELERY, "billing.charge", json.dumps(args))
    assert job["args"] == ["2026-07-01", "0f8fad5b-d9cb-469f-a165-70867728950e", "19.90"]
    assert job["meta"]["x_celery_types"] == {"/args/0": "date", "/args/1": "uuid",
                                             "/args/2": "decimal"}
    check_job(job)
    run = wait_until(lambda: next((r for r in runs(runs_file) if r["id"] == job["id"]), None),
                     30, "the billing.charge run")
    assert run["kinds"] == ["date", "UUID", "Decimal"]
    assert run["args"] == ["2026-07-01", "0f8fad5b-d9cb-469f-a165-70867728950e", "19.90"]


def test_celery_jobs_run_on_the_node_worker(
        node: str, celery_producer: Celery, node_worker: NodeProcess, vhost: str) -> None:
    def send(task: str, *args: Any, **options: Any) -> str:
        return celery_producer.tasks[task].apply_async(args, queue=TO_NODE, **options).id

    def lines(job_id: str, event: str, count: int = 1) -> list[dict[str, Any]]:
        return node_worker.wait_for(lambda line: line.get("id") == job_id and
                                    line.get("event") == event, count)

    ok = send("report.sum", 1, 2, 3)
    failing = send("payment.charge", "cus_42", 1999, ojs_retry=FAST_RETRY)
    slow = send("export.slow", 8000)  # still running when INFO asks, however slow

    assert lines(ok, "completed")[0]["result"] == 6

    # INFO to the Node worker through ojs_kombu's client: it answers for a job it holds
    lines(slow, "started")
    with ControlClient(celery_producer) as client:
        active = client.info(slow, TO_NODE, timeout=10)
        assert active["state"] == "active" and active["attempt"] == 1
        assert active["worker_id"].startswith("node-")
        lines(slow, "completed")
        assert client.info(slow, TO_NODE, timeout=10)["state"] == "completed"

    # the retry topology: attempt header and error headers on each retry, then a Nack
    started = lines(failing, "started", 3)
    assert [(s["attempt"], s["error_code"]) for s in started] == [
        (1, None), (2, "HANDLER_ERROR"), (3, "HANDLER_ERROR")]
    retries = lines(failing, "retrying", 2)
    assert [r["delay_ms"] for r in retries] == [200, 400]
    for delay in (200, 400):
        arguments = queue_arguments(vhost, f"ojs.queue.retry.{TO_NODE}.{delay}")
        assert f'{{"x-message-ttl",{delay}}}' in arguments
        assert '{"x-dead-letter-exchange","ojs.exchange.direct"}' in arguments
    lines(failing, "dead-lettered")
    dead = wait_until(lambda: dead_letters(vhost, TO_NODE).get(failing), 30, "the dead letter")
    headers = dead.properties["application_headers"]
    assert headers["x-death"][0]["reason"] == "rejected"  # Basic.Nack(requeue=false)
    assert headers["x-ojs-attempt"] == 3 and headers["x-ojs-error-code"] == "HANDLER_ERROR"
    assert "declined" in headers["x-ojs-error-message"]
    body = body_of(dead)
    check_job(body)
    assert [e["attempt"] for e in body["errors"]] == [1, 2] and "x_celery" in body

    ran = [line for line in node_worker.lines if line.get("event") == "started"
           and line["id"] in {ok, failing, slow}]
    counts = {"sent": 3, "ran": len(ran),
              "retried": len([line for line in node_worker.lines
                              if line.get("event") == "retrying" and line["id"] == failing]),
              "dead-lettered": len(dead_letters(vhost, TO_NODE)),
              "lost": 3 - len({line["id"] for line in ran})}
    print(f"\nCelery -> Node: {counts}")
    assert counts == {"sent": 3, "ran": 5, "retried": 2, "dead-lettered": 1, "lost": 0}
    assert messages(vhost)[f"ojs.queue.{TO_NODE}"] == 0  # every delivery was settled


def test_node_subscriber_sees_the_celery_workers_events(
        node: str, node_env: dict[str, str], celery_worker: Any,
        node_events: NodeProcess) -> None:
    ok = producer(node, node_env, "enqueue", TO_CELERY, "greet.hello", '["events"]')["id"]
    failing = producer(node, node_env, "enqueue", TO_CELERY, "always.fail", "[]",
                       "--retry", json.dumps({**FAST_RETRY, "max_attempts": 2}))["id"]

    def types(job_id: str, last: str) -> list[dict[str, Any]]:
        node_events.wait_for(lambda e: e.get("subject") == job_id and e["type"] == last)
        return [e for e in node_events.lines if e.get("subject") == job_id]

    ok_events = types(ok, "job.completed")
    assert [e["type"] for e in ok_events] == ["job.started", "job.completed"]
    assert ok_events[1]["data"]["result"] == {"value": "hello events"}
    failing_events = types(failing, "job.discarded")
    assert [e["type"] for e in failing_events] == [
        "job.started", "job.failed", "job.retrying", "job.started", "job.failed",
        "job.discarded"]
    for event in ok_events + failing_events:
        check_event(event)
    print(f"\nevents seen by Node: {len(ok_events) + len(failing_events)}, "
          "each valid against event.schema.json")


def close_node_connections(vhost: str) -> int:
    """Close every amqplib connection of ``vhost`` from the broker's side."""
    closed = 0
    for line in rabbitmqctl("list_connections", "--no-table-headers", "pid", "vhost",
                            "client_properties").splitlines():
        pid, connection_vhost, properties = line.split("\t", 2)
        if connection_vhost == vhost and "amqplib" in properties:
            rabbitmqctl("close_connection", pid, "integration test: connection lost")
            closed += 1
    return closed


def test_node_worker_reconnects_and_consumes_again(
        node: str, celery_producer: Celery, node_worker: NodeProcess, vhost: str) -> None:
    """AMQP-025/026: after the broker drops its connection the Node worker connects
    again, declares its topology, registers its consumers, and runs the next job."""
    def ready(line: dict[str, Any]) -> bool:
        return line.get("event") == "ready"
    before = len([line for line in node_worker.lines if ready(line)])
    assert close_node_connections(vhost) >= 1
    node_worker.wait_for(ready, count=before + 1, timeout=60)
    job = celery_producer.tasks["report.sum"].apply_async((4, 5), queue=TO_NODE).id
    done = node_worker.wait_for(lambda line: line.get("id") == job and
                                line.get("event") == "completed")
    assert done[0]["result"] == 9


def test_node_worker_never_acks_a_retry_the_broker_returned(
        node: str, node_env: dict[str, str], celery_producer: Celery, vhost: str) -> None:
    """A retry copy that comes back through ``Basic.Return`` (its delay queue lost its
    binding) is not a retry: the Node worker does not ack the delivery, and the job
    is back in its queue, at the attempt that failed, once the worker is gone."""
    queue = "polyglot-returned"
    worker = NodeProcess(node, node_env, "worker.js", queue)
    try:
        worker.wait_for(lambda line: line.get("event") == "ready")
        job = celery_producer.tasks["payment.charge"].apply_async(
            ("cus_7", 5), queue=queue, ojs_retry={"max_attempts": 3, "initial_interval": "PT1S",
                                                  "backoff_coefficient": 1, "jitter": False}).id
        worker.wait_for(lambda line: line.get("id") == job and line.get("event") == "retrying")
        connection = amqp.Connection(f"{HOST}:{PORT}", virtual_host=vhost)
        connection.connect()
        try:
            channel = connection.channel()
            channel.queue_unbind(f"ojs.queue.retry.{queue}.1000", "ojs.exchange.retry",
                                 f"{queue}.1000")
            assert worker.process.wait(30) == 1  # the second failure's retry was returned
            back = wait_until(lambda: channel.basic_get(f"ojs.queue.{queue}"), 30,
                              "the job back in its queue")
            assert back.properties["message_id"] == job
            assert back.properties["application_headers"]["x-ojs-attempt"] == 2
            channel.basic_ack(back.delivery_tag)
        finally:
            connection.close()
    finally:
        worker.stop()
