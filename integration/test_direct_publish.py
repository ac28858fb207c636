"""``apply_async`` straight to the OJS channel puts on the broker what Celery's path puts there."""

from __future__ import annotations

from typing import Any

import amqp
import pytest
from celery import Celery
from celery.app.task import Task

from ojs_kombu.celery.publish import direct_refusal
from ojs_kombu.spec.job_ids import new_job_id

from .conftest import body_of, get_message, wait_until

QUEUE = "direct"
#: Attributes that differ between any two publishes (ids, clocks).
PER_PUBLISH = {"id", "created_at", "enqueued_at"}


def _published(channel: amqp.Channel) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    message = get_message(channel, f"ojs.queue.{QUEUE}")
    body = body_of(message)
    properties = dict(message.properties)
    headers = dict(properties.pop("application_headers"))
    assert properties["message_id"] == body["id"]
    for key in ("message_id", "correlation_id", "timestamp"):
        properties.pop(key)
    for key in ("x-ojs-created-at", "x-ojs-enqueued-at"):
        assert headers.pop(key) == body["created_at"]
    if "expires_at" in body:  # now + expires: only that it is there can match
        body["expires_at"] = True
    return {k: v for k, v in body.items() if k not in PER_PUBLISH}, properties, headers


@pytest.mark.parametrize("args, kwargs, options", [
    ((1, 2), None, {}),
    ((1,), {"y": 2}, {"priority": 7}),
    ((3, 4), None, {"time_limit": 30, "soft_time_limit": 20, "expires": 600}),
    ((5, 6), None, {"ojs_meta": {"tenant": "acme", "tags": ["a", "b"]},
                    "ojs_retry": {"max_attempts": 5}}),
    ((7, 8), None, {"ignore_result": True}),
], ids=["plain", "kwargs-priority", "limits-expires", "meta-retry", "ignore-result"])
def test_direct_and_celery_paths_publish_the_same_job(app: Celery, amqp_channel: amqp.Channel,
                                                      args: Any, kwargs: Any,
                                                      options: dict[str, Any]) -> None:
    add = app.tasks["math.add"]
    options = {"queue": QUEUE, **options}
    assert direct_refusal(add, app, None, options) is None
    direct = add.apply_async(args, kwargs, **options)
    seen_direct = _published(amqp_channel)
    celery = Task.apply_async(add, args, kwargs, **options)  # Celery's send_task and kombu
    seen_celery = _published(amqp_channel)
    assert seen_direct == seen_celery
    assert seen_direct[0]["queue"] == QUEUE and direct.id != celery.id
    assert type(direct) is type(celery) and direct.ignored == celery.ignored
    assert ("expires_at" in seen_direct[0]) == ("expires" in options)


def test_a_direct_job_with_a_caller_id_runs_on_a_real_worker(app: Celery, worker: Any) -> None:
    job_id = new_job_id()
    add = app.tasks["math.add"]
    assert direct_refusal(add, app, job_id, {}) is None
    result = add.apply_async((20, 22), task_id=job_id)
    assert result.id == job_id
    assert wait_until(lambda: result.ready(), what="the direct job's result") and \
        result.get(timeout=5) == 42


def test_a_scheduled_direct_job_waits_in_the_broker_then_runs(app: Celery, worker: Any) -> None:
    result = app.tasks["math.add"].apply_async((1, 1), countdown=1)
    assert result.get(timeout=30) == 2
