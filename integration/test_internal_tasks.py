"""Celery's internal tasks (``celery.*``) sent as OJS jobs by a producer, with
``x_celery`` as Celery's own canvas sends them, against a real prefork ``celery
worker`` started as users start one (gossip, mingle, heartbeats, events on).

Each ends in a bounded outcome: run and acked, or dead-lettered with a code; the
worker keeps consuming.  ``celery.chord_unlock`` naming a chord that never
completes polls at most ``ojs_chord_unlock_max_retries`` times, then is
dead-lettered (it used to republish itself twice a second without end).  With the
least-privilege worker of docs/production.rst the same job (whose retry the broker
may refuse) is dead-lettered and the worker keeps consuming (it used to stop: the
pool's ``Reject(TopologyPermissionError)`` could not be unpickled).
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import amqp
import celery
import pytest
import redis

from ojs_kombu.spec.job_ids import new_job_id

from . import management
from .conftest import HOST, PORT, WorkerLauncher, rabbitmqctl, wait_until
from .test_permissions import QUEUE as LP_QUEUE
from .test_permissions import cli, documented_permissions, role_users
from .workers import WorkerProcess, launch_worker

OJS = "application/openjobspec+json"
RUNS_URL = "redis://127.0.0.1:6379/13"  # integration/hostileapp.py's hostile.count
BACKEND = "redis://127.0.0.1:6379/14"
#: ``ojs_chord_unlock_max_retries`` of the workers here.
UNLOCK_RETRIES = 3


def job(queue: str, job_type: str, args: list[Any], **x_celery: Any) -> dict[str, Any]:
    return {"specversion": "1.0", "id": new_job_id(), "type": job_type, "queue": queue,
            "args": args, "x_celery": x_celery}


def signature(task: str, queue: str, *args: Any) -> dict[str, Any]:
    return {"task": task, "args": list(args), "kwargs": {}, "options": {"queue": queue},
            "subtask_type": None, "immutable": False}


def chord_unlock(queue: str) -> dict[str, Any]:
    """What Celery's fallback_chord_unlock publishes, for a group nobody runs."""
    return job(queue, "celery.chord_unlock",
               [str(uuid.uuid4()), signature("hostile.count", queue)],
               kwargs={"result": [[[str(uuid.uuid4()), None], None]], "interval": 0.2,
                       "max_retries": None, "_chord_unlock_exchange_type": "direct"})


def internal_jobs(queue: str) -> dict[str, dict[str, Any]]:
    count = signature("hostile.count", queue)
    return {
        "celery.chord_unlock": chord_unlock(queue),
        "celery.backend_cleanup": job(queue, "celery.backend_cleanup", []),
        "celery.accumulate": job(queue, "celery.accumulate", [1, 2, 3]),
        "celery.group": job(queue, "celery.group", [[count], [], str(uuid.uuid4()), []]),
        "celery.chain": job(queue, "celery.chain", [[count, count]]),
        "celery.chord": job(queue, "celery.chord", [[count], count]),
        "celery.map": job(queue, "celery.map", [count, [[1], [2]]]),
        "celery.starmap": job(queue, "celery.starmap", [count, [[1], [2]]]),
        "celery.chunks": job(queue, "celery.chunks", [count, [[1], [2], [3]], 2]),
        "celery.not_a_builtin": job(queue, "celery.not_a_builtin", []),
    }


def publish(channel: amqp.Channel, queue: str, body: dict[str, Any]) -> None:
    channel.basic_publish_confirm(
        amqp.Message(json.dumps(body).encode(), content_type=OJS, content_encoding="utf-8",
                     delivery_mode=2, message_id=body["id"],
                     application_headers={"x-ojs-attempt": 1}),
        exchange="ojs.exchange.direct", routing_key=queue, mandatory=True)


def settled_queues(vhost: str, queue: str,
                   counts: dict[str, tuple[int, int]] | None = None
                   ) -> dict[str, tuple[int, int]]:
    """``{queue: (ready, unacked)}`` of the queues of ``vhost`` holding something that
    a job of ``queue`` could be in: its own, its retry queues and the scheduling ladder
    (jobs the internal tasks publish to other queues are not counted); from ``counts``
    when given, else as ``rabbitmqctl`` counts them now."""
    if counts is None:
        out = rabbitmqctl("list_queues", "-p", vhost, "-q", "--no-table-headers", "name",
                          "messages_ready", "messages_unacknowledged")
        rows = (line.split() for line in out.splitlines() if line.strip())
        counts = {r[0]: (int(r[1]), int(r[2])) for r in rows if len(r) == 3}
    return {name: held for name, held in counts.items() if held != (0, 0)
            and (name.endswith(queue) or ".schedule." in name or f".{queue}." in name)}


def all_ended(vhost: str, queue: str, dlq: str) -> bool:
    """Whether nothing of ``queue``'s jobs is left but dead letters, as ``rabbitmqctl``
    counts it; asked only once the management API's sample shows it (where it answers:
    one ``rabbitmqctl`` run costs the machine ~0.7 s of CPU, and this waits minutes)."""
    sampled = management.sampled_counts(vhost)
    if sampled is not None and set(settled_queues(vhost, queue, sampled)) - {dlq}:
        return False
    return set(settled_queues(vhost, queue)) <= {dlq}


def dead_letters(channel: amqp.Channel, dlq: str) -> dict[str, amqp.Message]:
    found = {}
    while (message := channel.basic_get(dlq, no_ack=True)) is not None:
        found[str(message.properties.get("message_id"))] = message
    return found


#: Whether the forged chord_unlock polls its chord (Celery 5.6 and later); on Celery 5.5
#: it ends at its first poll, dead-lettered: bounded too, with fewer steps to count.
POLLS_UNLOCK = celery.VERSION[:2] >= (5, 6)


def why(dead_letter: amqp.Message) -> str:
    """The error code of a dead letter, or that its task failed (``Basic.Nack``: the
    broker dead-lettered it as delivered, ``ojs_dead_letter_mode="nack"``)."""
    headers = dead_letter.properties.get("application_headers") or {}
    code = headers.get("x-ojs-error-code")
    if code is None and headers.get("x-death"):
        return ": its task failed"
    return f" {code}"


def good_job_runs(channel: amqp.Channel, queue: str) -> None:
    """The worker still consumes: a good job after the hostile ones runs, once."""
    runs = redis.Redis.from_url(RUNS_URL)
    good = job(queue, "hostile.count", [])
    del good["x_celery"]
    publish(channel, queue, good)
    wait_until(lambda: runs.get(f"hostile:{good['id']}") is not None, 60, "the good job")
    assert int(runs.get(f"hostile:{good['id']}") or 0) == 1


def test_each_internal_task_from_a_producer_ends_bounded_on_a_prefork_worker(
        vhost: str, amqp_channel: amqp.Channel, worker_launcher: WorkerLauncher,
        tmp_path: Path) -> None:
    queue = f"internal-{new_job_id()[-6:]}"
    log = tmp_path / "worker.log"
    worker = worker_launcher("integration.hostileapp", queue, pool="prefork", concurrency=2,
                             without=(), options=("-E",), log=log, loglevel="INFO",
                             env={"OJS_TEST_RESULT_BACKEND": BACKEND,
                                  "OJS_TEST_CHORD_UNLOCK_MAX_RETRIES": str(UNLOCK_RETRIES)})
    jobs = internal_jobs(queue)
    amqp_channel.confirm_select()
    for body in jobs.values():
        publish(amqp_channel, queue, body)
    dlq = f"ojs.queue.dlx.{queue}"
    unlock_id = jobs["celery.chord_unlock"]["id"]
    # Every job queue, retry queue and scheduling-ladder queue empty and nothing unacked:
    # no job is left running or waiting to be republished.
    try:
        wait_until(lambda: all_ended(vhost, queue, dlq) or not worker.alive(), 180,
                   "every internal job to end", interval=1.0)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {settled_queues(vhost, queue)}\n{log.read_text()[-6000:]}"
                             ) from None
    assert worker.alive(), worker.log_text()[-3000:]
    dead = dead_letters(amqp_channel, dlq)
    outcome = {name: "dead-lettered" + why(dead[body["id"]]) if body["id"] in dead
               else "ran and acked" for name, body in jobs.items()}
    print(outcome)
    unlock = json.loads(dead[unlock_id].body)
    if POLLS_UNLOCK:
        # chord_unlock polled its chord UNLOCK_RETRIES times, then failed the chord
        assert unlock["x_celery"].get("retries") == UNLOCK_RETRIES, unlock
        assert outcome["celery.chord_unlock"] == "dead-lettered: its task failed"
        assert log.read_text().count(f"celery.chord_unlock[{unlock_id}] retry") == \
            UNLOCK_RETRIES
    else:
        # Celery 5.5: the forged chord_unlock ends at its first poll, dead-lettered
        assert outcome["celery.chord_unlock"] in ("dead-lettered: its task failed",
                                                  "dead-lettered HANDLER_ERROR"), unlock
    assert outcome["celery.chain"] == "dead-lettered: its task failed"  # not a real task
    assert outcome["celery.not_a_builtin"] == "dead-lettered UNKNOWN_JOB_TYPE"
    assert outcome["celery.accumulate"] == "ran and acked"
    good_job_runs(amqp_channel, queue)
    text = worker.log_text()
    assert "Unrecoverable error" not in text and "Can't decode" not in text, text[-3000:]
    assert worker.stop() == 0


@pytest.fixture
def least_privilege() -> Any:
    """``{role: broker URL}`` with docs/production.rst's patterns (as test_permissions.py
    reads them), in a vhost of the test's own, and the vhost."""
    with role_users("ojs-kombu-internal") as made:
        yield made


def gossip_allowed() -> bool:
    """Whether the documented worker pattern lets Celery's gossip declare its
    ``celeryev.<uuid>`` queue (a default ``celery worker`` does)."""
    configure = documented_permissions()["worker"][0]
    return re.fullmatch(configure, f"celeryev.{uuid.uuid4()}") is not None


def test_a_foreign_chord_unlock_on_a_least_privilege_worker_ends_and_the_worker_consumes(
        least_privilege: Any, tmp_path: Path) -> None:
    urls, vhost = least_privilege
    declared = cli(urls["operator"], "topology", "declare", "-q", LP_QUEUE)
    assert declared.returncode == 0, declared.stderr
    log = tmp_path / "worker.log"
    worker: WorkerProcess = launch_worker(
        urls["worker"], "integration.hostileapp", LP_QUEUE, pool="prefork", concurrency=2,
        without=() if gossip_allowed() else ("gossip",), options=("-E",), log=log,
        env={"OJS_TEST_RESULT_BACKEND": BACKEND,
             "OJS_TEST_CHORD_UNLOCK_MAX_RETRIES": str(UNLOCK_RETRIES)})
    try:
        producer = amqp.Connection(f"{HOST}:{PORT}", userid=urls["producer"].split("//")[1]
                                   .split(":")[0], password="secret", virtual_host=vhost)
        producer.connect()
        operator = amqp.Connection(f"{HOST}:{PORT}", userid=urls["operator"].split("//")[1]
                                   .split(":")[0], password="secret", virtual_host=vhost)
        operator.connect()
        try:
            channel = producer.channel()
            channel.confirm_select()
            unlock = chord_unlock(LP_QUEUE)
            publish(channel, LP_QUEUE, unlock)
            reader = operator.channel()
            dlq = f"ojs.queue.dlx.{LP_QUEUE}"
            found: dict[str, amqp.Message] = {}

            def dead_lettered() -> bool:
                found.update(dead_letters(reader, dlq))
                return unlock["id"] in found or not worker.alive()

            wait_until(dead_lettered, 120, "the chord_unlock job's dead letter")
            assert worker.alive(), worker.log_text()[-3000:]
            assert why(found[unlock["id"]]) in ((": its task failed",) if POLLS_UNLOCK else
                                                (": its task failed", " HANDLER_ERROR"))
            reader.confirm_select()
            good_job_runs(channel, LP_QUEUE)
        finally:
            producer.close()
            operator.close()
        text = worker.log_text()
        assert "Unrecoverable error" not in text and "missing 3 required" not in text, \
            text[-3000:]
    finally:
        code = worker.stop()
    assert code == 0, worker.log_text()[-3000:]
