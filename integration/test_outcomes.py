"""Outcomes on a bad day: a retry whose delay queue vanished, a storm of poison jobs.

The session's in-process worker (threads pool) consumes these queues; the
retry or dead letter of one delivery never blocks the handling of the next.
"""

from __future__ import annotations

import json
import time
from typing import Any

import amqp
from celery import Celery

from ojs_kombu.spec.job_ids import new_job_id

from .conftest import body_of, get_message, publish_raw, queue_depth, wait_until


def _retry_queues(channel: amqp.Channel, queue: str) -> list[str]:
    names = []
    for delay_ms in (192, 384):  # FAST_RETRY's 0.2 s and 0.4 s on the delay ladder
        name = f"ojs.queue.retry.{queue}.{delay_ms}"
        try:
            channel.queue_declare(name, passive=True)
        except amqp.exceptions.NotFound:
            channel = channel.connection.channel()
            continue
        names.append(name)
    return names


def test_a_retry_into_a_deleted_delay_queue_is_redeclared_not_lost(
        app: Celery, worker: Any, amqp_channel: amqp.Channel) -> None:
    """The worker declared the delay queues once; deleted under it, the next retry is
    returned by the broker, re-declared and published again: no attempt is lost."""
    first = app.tasks["flaky.twice"].apply_async(queue="retries")
    assert first.get(timeout=30).startswith("done on attempt 3")
    declared = _retry_queues(amqp_channel, "retries")
    assert declared, "the first job's retries declared no delay queue"
    for name in declared:
        amqp_channel.queue_delete(name)

    second = app.tasks["flaky.twice"].apply_async(queue="retries")
    assert second.get(timeout=60) == "done on attempt 3"
    runs = app.calls.count(second.id)
    assert runs == 3, f"ran {runs} times, expected 3 (one per attempt)"


def test_a_storm_of_poison_jobs_does_not_hold_up_good_ones(
        app: Celery, worker: Any, amqp_channel: amqp.Channel) -> None:
    """1,000 jobs of a type nobody handles and 1,000 undecodable deliveries, interleaved
    with 50 good jobs: every poison job is dead-lettered with its error code, every good
    job runs exactly once, and nothing is left behind."""
    queue, poison = "email", 2000
    dlq = f"ojs.queue.dlx.{queue}"
    amqp_channel.queue_purge(dlq)
    amqp_channel.confirm_select()
    good = []
    for n in range(poison):
        job_id = new_job_id()
        if n % 2:
            body, content_type = b"\xff not json", "application/openjobspec+json"
        else:
            body = json.dumps({"specversion": "1.0", "id": job_id, "type": "nobody.handles_this",
                               "queue": queue, "args": []}).encode()
            content_type = "application/openjobspec+json"
        publish_raw(amqp_channel,
                    amqp.Message(body, content_type=content_type, message_id=job_id,
                                 delivery_mode=2, type="nobody.handles_this",
                                 application_headers={"x-ojs-attempt": 1}),
                    queue)
        if n % 40 == 0:
            good.append(app.tasks["math.add"].apply_async((n, 1), queue=queue))
    started = time.monotonic()
    wait_until(lambda: queue_depth(amqp_channel, dlq) >= poison, timeout=60,
               what=f"{poison} dead letters")
    elapsed = time.monotonic() - started
    results = [r.get(timeout=30) for r in good]
    assert results == [n * 40 + 1 for n in range(len(good))]
    runs = [app.calls.count(r.id) for r in good]
    assert runs == [1] * len(good), f"good jobs ran {runs}"
    dead = queue_depth(amqp_channel, dlq)
    assert dead == poison, f"published {poison} poison jobs, {dead} dead-lettered"
    codes: dict[str, int] = {}
    for _ in range(poison):
        message = get_message(amqp_channel, dlq)
        code = message.properties["application_headers"]["x-ojs-error-code"]
        codes[code] = codes.get(code, 0) + 1
    assert codes == {"UNKNOWN_JOB_TYPE": poison // 2, "INVALID_PAYLOAD": poison // 2}, codes
    assert queue_depth(amqp_channel, f"ojs.queue.{queue}") == 0
    print(f"poison storm: {poison} dead-lettered in {elapsed:.2f}s, {len(good)} good jobs "
          "ran once each")


def test_an_invalid_delivery_keeps_its_error_headers_and_body(
        app: Celery, worker: Any, amqp_channel: amqp.Channel) -> None:
    job_id = new_job_id()
    body = json.dumps({"specversion": "1.0", "id": job_id, "type": "nobody.handles_this",
                       "queue": "email", "args": [1]}).encode()
    publish_raw(amqp_channel,
                amqp.Message(body, content_type="application/openjobspec+json",
                             message_id=job_id, delivery_mode=2, type="nobody.handles_this"),
                "email")
    deadline = time.monotonic() + 20
    while True:
        dead = get_message(amqp_channel, "ojs.queue.dlx.email")
        if dead.properties.get("message_id") == job_id or time.monotonic() > deadline:
            break
    assert dead.properties["message_id"] == job_id
    assert dead.properties["application_headers"]["x-ojs-error-code"] == "UNKNOWN_JOB_TYPE"
    assert "nobody.handles_this" in dead.properties["application_headers"]["x-ojs-error-message"]
    assert body_of(dead)["args"] == [1]


def test_a_discarded_job_is_nacked_and_the_dlq_says_so(app: Celery, worker: Any) -> None:
    """AMQP-009 by default: the broker dead-letters the delivery (``x-death`` reason
    ``rejected``), and the dead-letter API tells a user that is what happened."""
    import pytest

    import ojs_kombu

    with ojs_kombu.dead_letter_queue(app, "failing") as dlq:
        dlq.purge()
        result = app.tasks["always.fail"].apply_async(queue="failing")
        with pytest.raises(RuntimeError, match="boom"):
            result.get(timeout=30)
        dead = wait_until(lambda: next((d for d in dlq.list() if d.job_id == result.id), None),
                          what="the dead letter")
        dlq.purge()  # the other tests of this queue count what they find there
    assert dead.death_reason == "rejected"
    assert dead.envelope is not None and dead.envelope["id"] == result.id


def test_properties_py_amqp_cannot_decode_are_dead_lettered_not_fatal(
        app: Celery, worker: Any, amqp_channel: amqp.Channel) -> None:
    """Short strings that are not UTF-8 (the broker passes them through) used to end the
    worker with ``UnicodeDecodeError``; each is now dead-lettered on its own."""
    queue, poison = "email", 200
    dlq = f"ojs.queue.dlx.{queue}"
    amqp_channel.queue_purge(dlq)
    kinds = [{"content_type": b"\xff\xfe"}, {"message_id": b"\xc3\x28"},
             {"app_id": b"\xa0\xa1"}, {"correlation_id": b"\xff"}, {"reply_to": b"\xfe"},
             {"type": b"\xff"}, {"content_encoding": b"\xff"}, {"cluster_id": b"\xff"}]
    good = []
    for n in range(poison):
        publish_raw(amqp_channel, amqp.Message(b'{"x": 1}', delivery_mode=2, **kinds[n % 8]),
                    queue)
        if n % 20 == 0:
            good.append(app.tasks["math.add"].apply_async((n, 1), queue=queue))
    wait_until(lambda: queue_depth(amqp_channel, dlq) >= poison, timeout=60,
               what=f"{poison} dead letters")
    assert [r.get(timeout=30) for r in good] == [n * 20 + 1 for n in range(len(good))]
    assert [app.calls.count(r.id) for r in good] == [1] * len(good)
    message = get_message(amqp_channel, dlq)
    headers = message.properties["application_headers"]
    assert headers["x-ojs-error-code"] == "INVALID_PAYLOAD"
    assert "could not be decoded" in headers["x-ojs-error-message"]
    assert queue_depth(amqp_channel, dlq) == poison - 1
