"""``ojs-kombu dlq`` on dead letters a real worker made and on any a producer can leave.

The worker is ``celery -A integration.cliapp worker`` with gossip, mingle and
heartbeats on.  Under the default ``ojs_dead_letter_mode="nack"`` (AMQP-009) a
discarded job's dead letter is the delivery as it was, and ``dlq -A app`` reads
why it died from the app's Redis result backend; under the opt-in
``"republish"`` the dead letter carries its last error itself, so every DLQ
reader (other languages' too) sees why it died.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import amqp
import pytest

from ojs_kombu.spec.job_ids import is_job_id

from .apps import make_app
from .conftest import body_of, get_message, queue_depth, wait_until
from .test_cli import run, run_json

REPUBLISH = {"OJS_TEST_DEAD_LETTER_MODE": "republish"}
#: The result backend of the default-mode workers and of ``dlq -A integration.cliapp``.
BACKEND = "redis://127.0.0.1:6379/14"
OJS = "application/openjobspec+json"
#: Each test uses queues of its own and a worker it starts, if any: xdist may hand
#: them out one by one (conftest.py); each takes about a minute on 2 loaded cores.
XDIST_SPREAD = True


def dead_letters(broker_url: str, queue: str) -> list[dict[str, Any]]:
    code, listed = run_json(broker_url, "dlq", "list", "-q", queue)
    assert code == 0, listed
    return list(listed["dead_letters"])


def test_a_discarded_job_says_why_and_is_found_by_the_callers_task_id(
        worker_launcher: Any, broker_url: str, amqp_channel: amqp.Channel) -> None:
    queue = "dlq-why"
    producer = make_app("dlq-producer", broker_url)
    with worker_launcher("integration.cliapp", queue, without=(), env=REPUBLISH):
        producer.tasks["reject.value"].apply_async(queue=queue, task_id="order-999-validate")
        wait_until(lambda: queue_depth(amqp_channel, f"ojs.queue.dlx.{queue}") == 1,
                   timeout=60, what="the discarded job in its DLQ")
    [dead] = dead_letters(broker_url, queue)
    assert dead["task_id"] == "order-999-validate" and is_job_id(dead["job_id"])
    assert (dead["error_code"], dead["error_type"], dead["error_message"]) == (
        "NON_RETRYABLE_ERROR", "ValueError", "invalid input is not worth retrying")
    assert dead["death_reason"] is None and dead["error_source"] == "headers"
    listed = run(broker_url, "dlq", "list", "-q", queue).stdout.splitlines()
    assert listed[1:] == [f"  {dead['job_id']}  reject.value  attempt 1  NON_RETRYABLE_ERROR  "
                          "ValueError: invalid input is not worth retrying",
                          "    task id: order-999-validate"]
    shown = run(broker_url, "dlq", "show", "-q", queue, "order-999-validate")
    assert shown.returncode == 0, shown.stderr
    assert {"error_code: NON_RETRYABLE_ERROR", "error_type: ValueError",
            f"job_id: {dead['job_id']}"} <= set(shown.stdout.splitlines())
    replayed = run(broker_url, "dlq", "replay", "-q", queue, "order-999-validate")
    assert replayed.stdout == f"replayed {dead['job_id']} to ojs.queue.{queue}\n"
    assert queue_depth(amqp_channel, f"ojs.queue.{queue}") == 1
    assert queue_depth(amqp_channel, f"ojs.queue.dlx.{queue}") == 0


def test_a_job_out_of_attempts_carries_its_last_error_and_its_history(
        worker_launcher: Any, broker_url: str, amqp_channel: amqp.Channel) -> None:
    """On the wire: the dead letter is the worker's confirmed copy, not a nack (no
    ``x-death``), with the third attempt's error in its headers and all three in its
    envelope; the job ran three times and nothing is left in its queue."""
    queue = "dlq-attempts"
    producer = make_app("dlq-producer", broker_url)
    with worker_launcher("integration.cliapp", queue, without=(), env=REPUBLISH):
        result = producer.tasks["always.fail"].apply_async(queue=queue)
        dead = get_message(amqp_channel, f"ojs.queue.dlx.{queue}", timeout=60)
        assert queue_depth(amqp_channel, f"ojs.queue.{queue}") == 0
    headers = dead.properties["application_headers"]
    assert dead.properties["message_id"] == result.id and "x-death" not in headers
    assert (headers["x-ojs-error-code"], headers["x-ojs-error-message"]) == (
        "HANDLER_ERROR", "boom")
    envelope = body_of(dead)
    assert envelope["state"] == "discarded" and envelope["error"]["type"] == "RuntimeError"
    assert [e["attempt"] for e in envelope["errors"]] == [1, 2, 3]


def test_an_expired_job_reads_as_expired(worker_launcher: Any, broker_url: str,
                                         amqp_channel: amqp.Channel) -> None:
    queue = "dlq-expired"
    producer = make_app("dlq-producer", broker_url)
    expires = datetime.now(UTC) + timedelta(seconds=1)
    result = producer.tasks["math.add"].apply_async((1, 2), queue=queue, expires=expires)
    # the job must be past its expires_at when a worker first sees it
    time.sleep(max(0.0, (expires - datetime.now(UTC)).total_seconds()) + 0.1)
    with worker_launcher("integration.cliapp", queue, without=(), env=REPUBLISH):
        wait_until(lambda: queue_depth(amqp_channel, f"ojs.queue.dlx.{queue}") == 1,
                   timeout=60, what="the expired job in its DLQ")
    [dead] = dead_letters(broker_url, queue)
    assert (dead["job_id"], dead["error_code"]) == (result.id, "EXPIRED")
    assert "expired" in dead["error_message"]


def test_a_default_workers_discarded_jobs_say_why_from_the_result_backend(
        worker_launcher: Any, broker_url: str, amqp_channel: amqp.Channel) -> None:
    """``ojs_dead_letter_mode`` unset: each discarded job is nacked (``x-death``
    ``rejected``, no error of its last attempt on it), and ``dlq list``/``show -A app``
    give its error code (as the worker decided it), exception type and message from
    the Redis result backend, in text and ``--json``; an expired job reads ``EXPIRED``."""
    queue = "dlq-nacked"
    dlq = f"ojs.queue.dlx.{queue}"
    env = {"OJS_TEST_RESULT_BACKEND": BACKEND}
    producer = make_app("dlq-producer", broker_url, BACKEND)
    expires = datetime.now(UTC) + timedelta(seconds=1)
    producer.tasks["math.add"].apply_async((1, 2), queue=queue, expires=expires,
                                           task_id="order-4-expired")
    time.sleep(max(0.0, (expires - datetime.now(UTC)).total_seconds()) + 0.1)
    with worker_launcher("integration.cliapp", queue, without=(), pool="prefork",
                         options=("-E",), env=env):
        producer.tasks["reject.value"].apply_async(queue=queue, task_id="order-1-validate")
        producer.tasks["always.fail"].apply_async(queue=queue, task_id="order-2-charge")
        producer.tasks["sleep.for"].apply_async((60,), queue=queue, time_limit=1,
                                                task_id="order-3-ship")
        wait_until(lambda: queue_depth(amqp_channel, dlq) == 4, timeout=120,
                   what="the four discarded jobs in their DLQ")
    cli_env = {**env, "OJS_TEST_BROKER_URL": broker_url}
    code, listed = run_json(broker_url, "dlq", "list", "-q", queue, "-A", "integration.cliapp",
                            env=cli_env)
    assert code == 0, listed
    by_task = {d["task_id"]: d for d in listed["dead_letters"]}
    assert {d["death_reason"] for d in by_task.values()} == {"rejected"}  # Basic.Nack
    said = {task_id: (d["error_code"], d["error_type"], d["error_message"])
            for task_id, d in by_task.items()}
    assert said["order-1-validate"] == ("NON_RETRYABLE_ERROR", "ValueError",
                                        "invalid input is not worth retrying")
    assert said["order-2-charge"] == ("HANDLER_ERROR", "RuntimeError", "boom")
    assert by_task["order-2-charge"]["attempt"] == 3
    code_3, type_3, message_3 = said["order-3-ship"]
    assert (code_3, type_3) == ("HANDLER_TIMEOUT", "TimeLimitExceeded") and message_3
    # it never ran, so no exception: the worker dead-lettered it as it came off the queue
    code_4, type_4, message_4 = said["order-4-expired"]
    assert (code_4, type_4) == ("EXPIRED", None) and "job expired at" in message_4
    assert all(d["why"] is None for d in by_task.values())

    text = run(broker_url, "dlq", "list", "-q", queue, "-A", "integration.cliapp",
               env=cli_env).stdout
    for task_id, (error_code, error_type, message) in said.items():
        assert (f"{error_code}  {error_type}: {message}" if error_type
                else f"{error_code}  {message}") in text and task_id in text
    assert "why:" not in text
    shown = run(broker_url, "dlq", "show", "-q", queue, "order-2-charge", "-A",
                "integration.cliapp", env=cli_env)
    assert shown.returncode == 0, shown.stderr
    assert {"error_code: HANDLER_ERROR", "error_type: RuntimeError", "error_message: boom",
            "death_reason: rejected"} <= set(shown.stdout.splitlines())
    code, data = run_json(broker_url, "dlq", "show", "-q", queue, "order-1-validate", "-A",
                          "integration.cliapp", env=cli_env)
    assert (code, data["error_code"], data["error_source"]) == (
        0, "NON_RETRYABLE_ERROR", "result backend")

    # without the app, nothing read says why: the tools name both remedies
    bare = run(broker_url, "dlq", "show", "-q", queue, "order-2-charge")
    assert "why: not recorded" in bare.stdout and "result backend" in bare.stdout
    assert "ojs_dead_letter_mode='republish'" in bare.stdout


def hostile() -> dict[str, tuple[bytes, dict[str, Any]]]:
    deep = b"[" * 100_000 + b"]" * 100_000
    return {
        "deep": (deep, {"content_type": OJS}),
        "no message_id": (json.dumps({"type": "x.y", "args": []}).encode(),
                          {"content_type": OJS}),
        "not UTF-8": (b"\xff\xfe\x00", {"content_type": OJS, "message_id": "not-utf8"}),
        "foreign": (b"\x80\x04K\x01.", {"content_type": "application/x-python-serialize"}),
    }


@pytest.mark.parametrize("name", sorted(hostile()))
def test_any_dead_letter_goes_through_every_verb(broker_url: str, amqp_channel: amqp.Channel,
                                                 name: str) -> None:
    """Listed with why it is no job, shown and replayed by its key, then removed; each
    ``--json`` answer is one JSON document and each exit code 0."""
    queue = "dlq-any-" + name.replace(" ", "-").replace("_", "-").lower()
    body, properties = hostile()[name]
    dlq = f"ojs.queue.dlx.{queue}"
    make_app("dlq-topology", broker_url).tasks["math.add"].apply_async((0, 0), queue=queue)
    amqp_channel.queue_purge(f"ojs.queue.{queue}")
    amqp_channel.basic_publish(amqp.Message(body, **properties), "", dlq)
    wait_until(lambda: queue_depth(amqp_channel, dlq) == 1, what="the dead letter")
    [dead] = dead_letters(broker_url, queue)
    key = dead["key"]
    assert dead["problems"] and (key == properties.get("message_id")
                                 or key.startswith("sha256:"))
    for args in (["list"], ["show", key]):
        text = run(broker_url, "dlq", *args, "-q", queue)
        assert text.returncode == 0 and "Traceback" not in text.stderr, text.stderr
        assert "not a job: " in text.stdout
        code, data = run_json(broker_url, "dlq", *args, "-q", queue)
        assert code == 0 and data
    code, data = run_json(broker_url, "dlq", "replay", "-q", queue, key)
    assert (code, data["replayed"]) == (0, [key])
    assert queue_depth(amqp_channel, dlq) == 0
    # back as it came; the worker-less queue keeps it, as it came, for us to dead-letter again
    message = amqp_channel.basic_get(f"ojs.queue.{queue}", no_ack=True)
    assert message is not None and bytes(message.body) == body
    amqp_channel.basic_publish(amqp.Message(body, **properties), "", dlq)
    wait_until(lambda: queue_depth(amqp_channel, dlq) == 1, what="the dead letter again")
    code, data = run_json(broker_url, "dlq", "replay", "-q", queue, "--all")
    assert (code, data["replayed"]) == (0, [key])
    amqp_channel.queue_purge(f"ojs.queue.{queue}")
    amqp_channel.basic_publish(amqp.Message(body, **properties), "", dlq)
    wait_until(lambda: queue_depth(amqp_channel, dlq) == 1, what="the dead letter again")
    code, data = run_json(broker_url, "dlq", "purge", "-q", queue, key, "--yes")
    assert (code, data["deleted"]) == (0, 1)
    assert queue_depth(amqp_channel, dlq) == 0
