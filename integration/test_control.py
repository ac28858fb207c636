"""CANCEL, BEAT and INFO over OJS control queues, with real workers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import amqp
import pytest
from celery import Celery
from celery.exceptions import TaskRevokedError

from ojs_kombu.amqp.broker.control import ControlClient
from ojs_kombu.spec.errors import ControlError, ControlTimeout
from ojs_kombu.spec.job_ids import new_job_id

from .apps import make_app
from .conftest import publish_raw, queue_counts, queue_depth, rabbitmqctl, wait_until
from .workers import WorkerProcess, launch_worker


def test_control_queues_are_part_of_the_topology(app: Celery, worker: Any, vhost: str) -> None:
    bindings = rabbitmqctl("list_bindings", "--no-table-headers", "-p", vhost, "source_name",
                           "destination_name", "routing_key")
    assert ("ojs.exchange.direct\tojs.queue.control.email\tojs.queue.control.email"
            in bindings)
    counts = queue_counts(vhost, "ojs.queue.control.email")
    assert counts is not None and counts[1] == 1  # the worker consumes it


def consumers_of(vhost: str, queue: str) -> set[tuple[str, str]]:
    """(channel, consumer tag) of each consumer of ``queue``: a reconnect changes both."""
    listing = rabbitmqctl("list_consumers", "--no-table-headers", "-p", vhost, "queue_name",
                          "channel_pid", "consumer_tag")
    return {(line.split("\t")[1], line.split("\t")[2]) for line in listing.splitlines()
            if line.split("\t")[0] == queue}


def test_a_deleted_control_queue_is_declared_and_consumed_again_without_a_reconnect(
        app: Celery, worker: Any, vhost: str, amqp_channel: amqp.Channel) -> None:
    """What ``ojs-kombu conformance --recovery`` does to a live worker (AMQP-026/027):
    the worker handles the broker's ``Basic.Cancel`` and its job consumers stay."""
    jobs = consumers_of(vhost, "ojs.queue.email")
    assert jobs
    amqp_channel.queue_delete("ojs.queue.control.email")
    wait_until(lambda: (queue_counts(vhost, "ojs.queue.control.email") or (0, 0))[1], 30,
               "the control queue consumed again")
    assert consumers_of(vhost, "ojs.queue.email") == jobs  # same channel, same consumer
    result = app.tasks["email.send"].apply_async(("a@b.c", "after"), queue="email")
    assert result.get(timeout=30) == "sent after to a@b.c"


def test_cancel_before_start_means_never_start(app: Celery, worker: Any, broker_url: str,
                                              amqp_channel: amqp.Channel) -> None:
    dead_before = queue_depth(amqp_channel, "ojs.queue.dlx.email")  # other tests' letters
    result = app.tasks["email.send"].apply_async(("a@b.c", "never"), queue="email",
                                                 countdown=3)
    with ControlClient(app) as client:
        client.cancel(result.id, "email", reason="customer unsubscribed",
                      cancelled_by="user:ops")
    with pytest.raises(TaskRevokedError):
        result.get(timeout=20)
    assert app.calls.count(result.id) == 0
    # cancelled, not failed
    assert queue_depth(amqp_channel, "ojs.queue.dlx.email") == dead_before


def test_raw_amqp_cancel_from_the_spec_text(app: Celery, worker: Any,
                                            amqp_channel: amqp.Channel) -> None:
    """Section 5.6: type ojs.control.cancel, body {"job_id": ...}, to ojs.queue.control.{q},
    with the sender's broker user as ``user_id`` (workers refuse a CANCEL without it)."""
    result = app.tasks["email.send"].apply_async(("a@b.c", "raw"), queue="email", countdown=3)
    publish_raw(amqp_channel,
                amqp.Message(json.dumps({"job_id": result.id}), type="ojs.control.cancel",
                             user_id="guest"),
                "ojs.queue.control.email", exchange="")
    with pytest.raises(TaskRevokedError):
        result.get(timeout=20)
    assert app.calls.count(result.id) == 0


def test_a_running_job_stops_cooperatively(app: Celery, worker: Any,
                                           events_file: Path) -> None:
    """A job that sees the CANCEL and stops ends as cancelled everywhere, never completed."""
    result = app.tasks["loop.until_cancelled"].apply_async((30,), queue="email")
    with ControlClient(app) as client:
        wait_until(lambda: client.info(result.id, "email")["state"] == "active", timeout=20,
                   what="the job running")
        client.cancel(result.id, "email", reason="no longer needed", cancelled_by="test")
        with pytest.raises(TaskRevokedError):
            result.get(timeout=20)
        assert result.state == "REVOKED"
        assert app.calls.count(result.id) == 1  # it saw the cancel and stopped
        assert wait_until(lambda: client.info(result.id, "email")["state"] == "cancelled",
                          what="INFO cancelled")

    def types() -> list[str]:
        return [e["type"] for e in map(json.loads, events_file.read_text().splitlines())
                if e["subject"] == result.id]
    wait_until(lambda: "job.cancelled" in types(), what="job.cancelled")
    assert "job.completed" not in types()


def test_a_job_that_never_checks_runs_to_completion(app: Celery, worker: Any,
                                                    tmp_path: Path) -> None:
    """Cooperative cancelling needs the task to look (``self.ojs.cancelled``): one that
    never does finishes, and is completed (``terminate=True`` kills a prefork process)."""
    gate = tmp_path / "gate"
    result = app.tasks["sleep.for"].apply_async((60, str(gate)), queue="email")
    with ControlClient(app) as client:
        try:
            wait_until(lambda: client.info(result.id, "email")["state"] == "active",
                       timeout=20, what="the job running")
            client.cancel(result.id, "email")
            wait_until(lambda: client.info(result.id, "email").get("cancel"), timeout=20,
                       what="the worker holding the CANCEL")
        finally:
            gate.touch()  # the job may end now
        assert result.get(timeout=20) == 60
        assert wait_until(lambda: client.info(result.id, "email")["state"] == "completed",
                          what="INFO completed")


def test_cancelling_unknown_or_finished_jobs_is_a_no_op(app: Celery, worker: Any) -> None:
    done = app.tasks["math.add"].apply_async((1, 1), queue="email")
    assert done.get(timeout=20) == 2
    with ControlClient(app) as client:
        client.cancel(new_job_id(), "email")
        client.cancel(done.id, "email")
        assert client.info(done.id, "email")["state"] == "completed"
    assert app.tasks["math.add"].apply_async((2, 2), queue="email").get(timeout=20) == 4


def test_info_answers_active_completed_and_not_found_by_correlation(app: Celery,
                                                                   worker: Any) -> None:
    running = app.tasks["loop.until_cancelled"].apply_async((60,), queue="email")
    finished = app.tasks["math.add"].apply_async((3, 4), queue="email")
    assert finished.get(timeout=20) == 7
    unknown = new_job_id()
    with ControlClient(app) as client:
        wait_until(lambda: client.info(running.id, "email")["state"] == "active", timeout=20,
                   what="the job running")
        answers = client.info_many([(unknown, "email"), (running.id, "email"),
                                    (finished.id, "email")], timeout=10)
        client.cancel(running.id, "email")  # it ran long enough to be asked about
    assert answers[unknown] == {"job_id": unknown, "state": "not_found"}
    assert answers[running.id]["state"] == "active"
    assert answers[running.id]["worker_id"] == worker.hostname
    assert answers[running.id]["attempt"] == 1
    assert answers[finished.id]["state"] == "completed"
    with pytest.raises(TaskRevokedError):  # stopped on the cancel
        running.get(timeout=20)


def test_client_errors_are_clear(broker_url: str) -> None:
    with pytest.raises(ControlError, match="cannot reach the broker"):
        ControlClient("ojs://guest:guest@127.0.0.1:5999//", connect_timeout=1)
    with ControlClient(broker_url) as client:
        with pytest.raises(ControlTimeout, match="no INFO answer"):
            client.info(new_job_id(), "nobody-consumes-this", timeout=1)
        with pytest.raises(ControlError, match="neither a job id"):
            client.cancel("", "email")


def _start(broker_url: str, name: str, log: Path, events: Path, *, control: bool,
           cancel_grace: float | None = None) -> WorkerProcess:
    env = {"OJS_TEST_EVENTS_FILE": str(events)}
    if cancel_grace is not None:
        env["OJS_TEST_CANCEL_GRACE"] = str(cancel_grace)
    if not control:
        env["OJS_TEST_NO_CONTROL"] = "1"
    return launch_worker(broker_url, "integration.cliapp", "ctl", hostname=f"{name}@%h",
                         pool="prefork", concurrency=1, log=log, env=env)


def test_cooperative_cancel_reaches_a_prefork_pool_process(broker_url: str,
                                                           tmp_path: Path) -> None:
    client_app = make_app("coop-client", broker_url, "rpc://")
    worker = _start(broker_url, "coop", tmp_path / "w.log", tmp_path / "e.jsonl", control=True)
    try:
        wait_until(lambda: client_app.control.inspect(timeout=1).ping(), timeout=60,
                   what="the worker")
        result = client_app.tasks["loop.until_cancelled"].apply_async((30,), queue="ctl")
        with ControlClient(client_app) as client:
            wait_until(lambda: client.info(result.id, "ctl")["state"] == "active", timeout=30,
                       what="the job running")
            client.cancel(result.id, "ctl")  # cooperative: no terminate
        with pytest.raises(TaskRevokedError):  # stopped on the cancel: cancelled, not done
            result.get(timeout=20)
    finally:
        worker.stop()


def test_a_running_job_that_never_checks_is_ended_after_the_grace_period(
        broker_url: str, tmp_path: Path, amqp_channel: amqp.Channel) -> None:
    """AMQP-019's "attempt to abort": a prefork job that never looks at
    ``self.ojs.cancelled`` is ended once ``ojs_cancel_grace`` passes, and reported
    cancelled everywhere; the worker goes on with the next job."""
    client_app = make_app("grace-client", broker_url, "rpc://")
    events_file = tmp_path / "e.jsonl"
    worker = _start(broker_url, "grace", tmp_path / "w.log", events_file, control=True,
                    cancel_grace=1.0)
    try:
        wait_until(lambda: client_app.control.inspect(timeout=1).ping(), timeout=60,
                   what="the worker")
        result = client_app.tasks["sleep.for"].apply_async((60,), queue="ctl")
        with ControlClient(client_app) as client:
            wait_until(lambda: client.info(result.id, "ctl")["state"] == "active", timeout=30,
                       what="the job running")
            client.cancel(result.id, "ctl", reason="too slow")  # no terminate
            with pytest.raises(TaskRevokedError):  # long before its 60 s
                result.get(timeout=30)
            answer = wait_until(lambda: (a := client.info(result.id, "ctl"))["state"]
                                == "cancelled" and a, timeout=20, what="INFO cancelled")
        cancelled = wait_until(lambda: [
            e for e in map(json.loads, events_file.read_text().splitlines())
            if e["type"] == "job.cancelled" and e["subject"] == result.id], timeout=20,
            what="job.cancelled")
        after = client_app.tasks["math.add"].apply_async((2, 3), queue="ctl")
        assert after.get(timeout=30) == 5
    finally:
        worker.stop()
    assert answer["state"] == "cancelled"
    assert cancelled[0]["data"]["reason"] == "too slow"
    assert "still running 1.0s after the cancel" in (tmp_path / "w.log").read_text()
    assert queue_depth(amqp_channel, "ojs.queue.dlx.ctl") == 0  # cancelled, not failed


def test_the_threads_pool_says_it_cannot_end_a_running_job(app: Celery, worker: Any,
                                                           events_file: Path,
                                                           tmp_path: Path) -> None:
    """The threads pool cannot stop a thread: the job runs to its end, and INFO and the
    job's later events say the cancel was requested and not carried out."""
    gate = tmp_path / "gate"
    running = app.tasks["sleep.for"].apply_async((60, str(gate)), queue="canvas")
    with ControlClient(app) as client:
        wait_until(lambda: client.info(running.id, "canvas")["state"] == "active",
                   timeout=20, what="the job running")
        client.cancel(running.id, "canvas")
        during = wait_until(lambda: (a := client.info(running.id, "canvas")).get("cancel")
                            and a, timeout=20, what="INFO naming the cancel")
        gate.touch()  # the job may end now
        running.get(timeout=20)
        after = client.info(running.id, "canvas")
    assert during["state"] == "active"
    assert "threads pool cannot end a running job" in during["cancel"]
    assert after["state"] == "completed"
    assert after["cancel"] == during["cancel"]
    completed = wait_until(lambda: [
        e for e in map(json.loads, events_file.read_text().splitlines())
        if e["type"] == "job.completed" and e["subject"] == running.id], timeout=20,
        what="job.completed")
    assert completed[0]["data"]["cancel"] == during["cancel"]


def test_cancel_reaches_the_worker_that_holds_the_job(broker_url: str, tmp_path: Path,
                                                      amqp_channel: amqp.Channel) -> None:
    """``holder`` runs the job but does not consume the control queue; ``relay``, started
    once the job runs, receives the CANCEL and must get it to ``holder``."""
    events_file, log = tmp_path / "events.jsonl", tmp_path / "workers.log"
    client_app = make_app("ctl-client", broker_url, "rpc://")

    def events() -> list[dict[str, Any]]:
        if not events_file.exists():
            return []
        return [json.loads(line) for line in events_file.read_text().splitlines()]

    workers = [_start(broker_url, "holder", log, events_file, control=False)]
    try:
        wait_until(lambda: client_app.control.inspect(timeout=1).ping(), timeout=60,
                   what="the holder worker")
        # long enough to outlast the relay's start on a slow machine: terminate=True ends it
        result = client_app.tasks["sleep.for"].apply_async((600,), queue="ctl")
        started = wait_until(lambda: [e for e in events() if e["type"] == "job.started"
                                      and e["subject"] == result.id], timeout=30, what="start")
        assert started[0]["data"]["worker_id"].startswith("holder@")
        workers.append(_start(broker_url, "relay", log, events_file, control=True))
        # both answer (the session's in-process worker may answer too)
        wait_until(lambda: {n.split("@")[0] for n in client_app.control.inspect(timeout=1)
                            .ping() or {}} >= {"holder", "relay"},
                   timeout=60, what="the relay worker")
        # BEAT: the running job gets heartbeats (ojs_job_heartbeat=1 in this app)
        wait_until(lambda: any(e["type"] == "job.heartbeat" and e["subject"] == result.id
                               for e in events()), timeout=20, what="a job.heartbeat")
        with ControlClient(client_app) as client:
            client.cancel(result.id, "ctl", reason="stop it", cancelled_by="test",
                          terminate=True)
        with pytest.raises(TaskRevokedError):
            result.get(timeout=30)
        cancelled = wait_until(lambda: [e for e in events() if e["type"] == "job.cancelled"
                                        and e["subject"] == result.id], timeout=20,
                               what="job.cancelled")
        # The relay answers the broadcast on its own schedule: wait for it before stopping
        # (a loaded CI machine can take a while; the failure shows the workers' log).
        try:
            wait_until(lambda: f"cancel of job {result.id}: not on this worker now"
                       in log.read_text(), timeout=60,
                       what="the relay's answer to the broadcast")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the workers' log ends:\n"
                                 + "\n".join(log.read_text().splitlines()[-60:])) from None
    finally:
        for process in workers:
            process.stop()
    assert cancelled[0]["data"]["reason"] == "stop it"
    assert cancelled[0]["data"]["cancelled_by"] == "test"
    assert "holder" in cancelled[0]["source"]
    assert queue_depth(amqp_channel, "ojs.queue.dlx.ctl") == 0  # cancelled, not failed
    heartbeat = next(e for e in events() if e["type"] == "job.heartbeat")
    assert heartbeat["data"]["worker_id"].startswith("holder@")
    # only the relay consumes the control queue; the broadcast reached both workers
    assert f"cancel of job {result.id}: not on this worker now" in log.read_text()


def test_terminate_leaves_the_workers_connections_alone(broker_url: str,
                                                        tmp_path: Path) -> None:
    """``terminate=True`` kills the prefork pool process running the job; the process
    that replaces it must not shut down the sockets it inherited (the worker's own
    connections): INFO still answers, and the next job runs."""
    client_app = make_app("term-client", broker_url, "rpc://")
    log = tmp_path / "w.log"
    worker = _start(broker_url, "term", log, tmp_path / "e.jsonl", control=True)
    try:
        wait_until(lambda: client_app.control.inspect(timeout=1).ping(), timeout=60,
                   what="the worker")
        # long enough that only terminate=True ends it in time
        result = client_app.tasks["sleep.for"].apply_async((600,), queue="ctl")
        with ControlClient(client_app) as client:
            wait_until(lambda: client.info(result.id, "ctl")["state"] == "active", timeout=30,
                       what="the job running")
            client.cancel(result.id, "ctl", terminate=True)
            with pytest.raises(TaskRevokedError):
                result.get(timeout=20)
            answers = [client.info(result.id, "ctl") for _ in range(3)]
        assert [a["state"] for a in answers] == ["cancelled"] * 3, answers
        after = client_app.tasks["math.add"].apply_async((2, 3), queue="ctl")
        assert after.get(timeout=30) == 5
    finally:
        worker.stop()
    text = log.read_text()
    assert "Connection reset" not in text and "Broken pipe" not in text, text[-3000:]


