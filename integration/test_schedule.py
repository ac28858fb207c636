"""Scheduled jobs wait in the broker, never in the worker (AMQP-022, section 9)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import amqp
import pytest
from celery import Celery

from ojs_kombu.spec.errors import JobEncodeError
from ojs_kombu.spec.job_ids import new_job_id

from .conftest import HOST, PORT, get_message, publish_raw, queue_depth, rabbitmqctl, wait_until


def test_countdown_waits_in_the_broker_and_never_starts_early(
        app: Celery, worker: Any, vhost: str) -> None:
    before = datetime.now(UTC)
    result = app.tasks["email.send"].apply_async(("a@b.c", "scheduled"), queue="email",
                                                 countdown=12)
    # While it waits, the worker holds nothing: the job sits in a ladder queue.
    # (12 s: one rabbitmqctl call can take seconds on a busy machine, and a listing
    # taken while the job moves between two ladder queues can miss it.)
    waiting = wait_until(lambda: [line for line in rabbitmqctl(
        "list_queues", "--no-table-headers", "-p", vhost, "name", "messages").splitlines()
        if line.startswith("ojs.queue.schedule.") and not line.endswith("\t0")],
        timeout=10, what="a scheduling-ladder queue holding the job")
    assert waiting
    call = app.calls.wait_for(result.id, timeout=30)
    scheduled_at = datetime.fromisoformat(call["scheduled_at"])
    assert scheduled_at >= before + timedelta(seconds=12)
    assert call["started"] >= scheduled_at


def test_raw_consumer_sees_a_scheduled_job_only_when_due(app: Celery,
                                                          amqp_channel: amqp.Channel) -> None:
    before = datetime.now(UTC)
    result = app.tasks["email.send"].apply_async(("a@b.c", "x"), queue="sched-raw",
                                                 countdown=3)
    assert amqp_channel.basic_get("ojs.queue.sched-raw") is None  # not yet
    message = get_message(amqp_channel, "ojs.queue.sched-raw", timeout=20)
    assert datetime.now(UTC) >= before + timedelta(seconds=3)
    headers = message.properties["application_headers"]
    assert message.properties["message_id"] == result.id
    assert datetime.fromisoformat(headers["x-ojs-scheduled-at"]) >= before
    assert {d["queue"] for d in headers["x-death"]} <= {
        f"ojs.queue.schedule.{level}" for level in range(32)}


def test_foreign_job_scheduled_in_the_future_goes_back_to_wait(
        app: Celery, worker: Any, amqp_channel: amqp.Channel) -> None:
    """A producer that publishes straight to the job queue with a future scheduled_at."""
    job_id = new_job_id()
    due = datetime.now(UTC) + timedelta(seconds=1.5)
    body = {"specversion": "1.0", "id": job_id, "type": "email.send", "queue": "email",
            "args": ["later@example.com", "x"], "scheduled_at": due.isoformat()}
    publish_raw(amqp_channel,
                amqp.Message(json.dumps(body), content_type="application/openjobspec+json",
                             message_id=job_id, delivery_mode=2,
                             application_headers={"x-ojs-queue": "email", "x-ojs-attempt": 1}),
                "email")
    app.calls.wait_for(job_id, timeout=20)
    assert datetime.now(UTC) >= due


def test_expired_job_is_dead_lettered_not_run(app: Celery, worker: Any,
                                              amqp_channel: amqp.Channel) -> None:
    result = app.tasks["math.add"].apply_async(
        (1, 2), queue="failing", expires=datetime.now(UTC) + timedelta(seconds=0.5),
        countdown=1)
    dead = wait_until(lambda: _own(amqp_channel, "ojs.queue.dlx.failing", result.id),
                      timeout=20, what="the expired job's dead letter")
    assert dead.properties["message_id"] == result.id
    # discarded by Basic.Nack (AMQP-009): the broker's x-death says so; why is in job.expired
    assert dead.properties["application_headers"]["x-death"][0]["reason"] == "rejected"
    assert json.loads(dead.body)["id"] == result.id
    assert app.calls.count(result.id) == 0


def test_delays_beyond_49_days_are_refused(app: Celery, amqp_channel: amqp.Channel) -> None:
    with pytest.raises(JobEncodeError, match="49.7 days"):
        app.tasks["math.add"].apply_async((1, 2), queue="refused", countdown=50 * 86400)
    app.tasks["math.add"].apply_async((1, 2), queue="refused", countdown=48 * 86400)
    assert queue_depth(amqp_channel, "ojs.queue.refused") == 0  # waiting, not delivered


def test_delayed_exchange_option_without_the_plugin_is_a_clear_error(broker_url: str) -> None:
    from ojs_kombu.spec.errors import OJSConfigurationError

    from .apps import make_app

    plugin_app = make_app("plugin", broker_url, None, ojs_delayed_exchange=True,
                          ojs_prefix="plugin")
    with pytest.raises(OJSConfigurationError, match="delayed_message_exchange plugin"):
        plugin_app.tasks["math.add"].apply_async((1, 2), queue="plugin", countdown=5)
    # Jobs without a delay still go straight through.
    plugin_app.tasks["math.add"].apply_async((1, 2), queue="plugin")


def test_the_ladder_works_on_quorum_queues(broker_url: str, vhost: str) -> None:
    from .apps import make_app

    quorum = make_app("quorum", broker_url, None, ojs_prefix="quorum",
                      ojs_schedule_queue_arguments={"x-queue-type": "quorum"})
    connection = amqp.Connection(f"{HOST}:{PORT}", virtual_host=vhost)
    connection.connect()
    try:
        channel = connection.channel()
        before = datetime.now(UTC)
        result = quorum.tasks["math.add"].apply_async((1, 2), queue="q", countdown=0.6)
        message = get_message(channel, "quorum.ojs.queue.q", timeout=20)
        assert message.properties["message_id"] == result.id
        assert datetime.now(UTC) >= before + timedelta(seconds=0.6)
    finally:
        connection.close()
    types = rabbitmqctl("list_queues", "--no-table-headers", "-p", vhost, "name", "type")
    assert "quorum.ojs.queue.schedule.0\tquorum" in types


def _own(channel: amqp.Channel, queue: str, job_id: str) -> amqp.Message | None:
    """The next message of ``queue`` if it is ``job_id``'s (others' are taken off)."""
    message = channel.basic_get(queue, no_ack=True)
    return message if message is not None and message.properties.get(
        "message_id") == job_id else None
