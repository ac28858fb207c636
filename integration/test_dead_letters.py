"""Malformed input and failing jobs end in the dead-letter queue, never acked and lost."""

from __future__ import annotations

import json
from typing import Any

import amqp
import pytest
from celery import Celery

from ojs_kombu.spec.job_ids import new_job_id

from .conftest import body_of, get_message, queue_depth, wait_until
from .test_helpers import check_job

OJS = "application/openjobspec+json"


def job(job_type: str = "math.add", **extra: Any) -> dict[str, Any]:
    return {"specversion": "1.0", "id": new_job_id(), "type": job_type, "queue": "malformed",
            "args": [1, 2], **extra}


def publish_raw(channel: amqp.Channel, body: bytes, message_id: str,
                content_type: str | None = OJS, **headers: Any) -> None:
    properties: dict[str, Any] = {"message_id": message_id, "delivery_mode": 2,
                                  "application_headers": {"x-ojs-queue": "malformed", **headers}}
    if content_type is not None:
        properties["content_type"] = content_type
    channel.confirm_select()
    channel.basic_publish_confirm(amqp.Message(body, **properties),
                                  exchange="ojs.exchange.direct", routing_key="malformed",
                                  mandatory=True)


CASES = [
    ("not JSON", lambda: b"{this is not json", OJS, "INVALID_PAYLOAD"),
    ("not UTF-8", lambda: b"\xff\xfe\x00", OJS, "INVALID_PAYLOAD"),
    ("JSON but not a job", lambda: json.dumps([1, 2, 3]).encode(), OJS, "INVALID_ENVELOPE"),
    ("invalid envelope", lambda: json.dumps(job("Math.Add")).encode(), OJS, "INVALID_ENVELOPE"),
    ("unknown type", lambda: json.dumps(job("nobody.handles_this")).encode(), OJS,
     "UNKNOWN_JOB_TYPE"),
    ("wrong content type", lambda: json.dumps(job()).encode(), "application/json",
     "UNSUPPORTED_CONTENT_TYPE"),
    ("pickle", lambda: b"\x80\x04K\x01.", "application/x-python-serialize",
     "UNSUPPORTED_CONTENT_TYPE"),
    ("no content type", lambda: json.dumps(job()).encode(), None, "UNSUPPORTED_CONTENT_TYPE"),
]


@pytest.mark.parametrize("case, make_body, content_type, code", CASES,
                         ids=[c[0] for c in CASES])
def test_malformed_message_is_dead_lettered_with_error_headers(
        app: Celery, worker: Any, amqp_channel: amqp.Channel, case: str, make_body: Any,
        content_type: str | None, code: str) -> None:
    body = make_body()
    message_id = new_job_id()
    publish_raw(amqp_channel, body, message_id, content_type)

    dead = get_message(amqp_channel, "ojs.queue.dlx.malformed")
    headers = dead.properties["application_headers"]
    assert dead.properties["message_id"] == message_id
    assert headers["x-ojs-error-code"] == code
    assert headers["x-ojs-error-message"]
    assert headers["x-ojs-queue"] == "malformed"  # original headers kept
    assert dead.body == body  # the original bytes, for inspection and replay

    # The worker is still consuming, and nothing was requeued or left unacked.
    follow_up = app.tasks["math.add"].apply_async((2, 3), queue="malformed")
    assert app.calls.wait_for(follow_up.id)["args"] == [2, 3]
    assert queue_depth(amqp_channel, "ojs.queue.malformed") == 0
    assert queue_depth(amqp_channel, "ojs.queue.dlx.malformed") == 0


def test_failing_task_exhausts_its_attempts_then_is_dead_lettered(
        app: Celery, worker: Any, amqp_channel: amqp.Channel) -> None:
    """Three attempts, retried by the broker, then ``Basic.Nack(requeue=false)``: the broker
    dead-letters the last delivery (AMQP-009), which carries the earlier attempts' errors."""
    result = app.tasks["always.fail"].apply_async(queue="failing")
    with pytest.raises(RuntimeError, match="boom"):
        result.get(timeout=30)

    dead = get_message(amqp_channel, "ojs.queue.dlx.failing")
    assert dead.properties["message_id"] == result.id
    headers = dead.properties["application_headers"]
    assert headers["x-ojs-attempt"] == 3
    death = headers["x-death"][0]
    assert death["reason"] == "rejected" and death["queue"] == "ojs.queue.failing"
    body = body_of(dead)
    assert body["id"] == result.id and body["attempt"] == 2  # as attempt 3 was delivered
    assert [e["attempt"] for e in body["errors"]] == [1, 2]
    assert {e["type"] for e in body["errors"]} == {"RuntimeError"}
    assert body["error"]["type"] == "RuntimeError" and body["error"]["message"] == "boom"
    check_job(body)
    assert app.calls.count(result.id) == 3
    wait_until(lambda: queue_depth(amqp_channel, "ojs.queue.failing") == 0, what="empty queue")


def test_requeue_request_is_retried_by_the_broker_not_looped(
        app: Celery, worker: Any, amqp_channel: amqp.Channel) -> None:
    """``Reject(requeue=True)`` (and a hard time limit) would loop; OJS retries it instead."""
    result = app.tasks["always.requeue"].apply_async(queue="failing")
    dead = get_message(amqp_channel, "ojs.queue.dlx.failing", timeout=30)
    assert dead.properties["message_id"] == result.id
    assert dead.properties["application_headers"]["x-ojs-attempt"] == 3
    assert app.calls.count(result.id) == 3  # bounded by max_attempts, never an immediate loop
