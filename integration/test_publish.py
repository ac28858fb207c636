"""Publishing: confirms, returns and nacks become typed errors; bad input never leaves."""

from __future__ import annotations

from typing import Any

import amqp
import pytest
from celery import Celery

from ojs_kombu.spec.errors import (
    InvalidJobIdError,
    JobNackedError,
    JobRoutingError,
    NonJSONArgumentError,
    UnroutableJobError,
    UnsupportedSerializerError,
)

from .conftest import get_message, queue_depth


@pytest.mark.parametrize("call, error", [
    (lambda t: t.apply_async(({1, 2}, 1), queue="refused"), NonJSONArgumentError),
    (lambda t: t.apply_async((1, 2), queue="refused", task_id=42), InvalidJobIdError),
    (lambda t: t.apply_async((1, 2), queue="refused", serializer="pickle"),
     UnsupportedSerializerError),
    (lambda t: t.apply_async((1, 2), exchange="legacy", routing_key="refused"),
     JobRoutingError),
], ids=["set-arg", "int-task-id", "pickle", "foreign-exchange"])
def test_bad_job_raises_and_nothing_is_sent(app: Celery, amqp_channel: amqp.Channel,
                                            call: Any, error: type[Exception]) -> None:
    add = app.tasks["math.add"]
    add.apply_async((0, 0), queue="refused")  # declares the queue, one message
    get_message(amqp_channel, "ojs.queue.refused")
    with pytest.raises(error):
        call(add)
    assert queue_depth(amqp_channel, "ojs.queue.refused") == 0


def test_unroutable_job_raises_with_job_id_and_queue(app: Celery,
                                                     amqp_channel: amqp.Channel) -> None:
    add = app.tasks["math.add"]
    add.apply_async((1, 1), queue="vanishing")  # declares ojs.queue.vanishing (cached)
    amqp_channel.queue_delete("ojs.queue.vanishing")
    with pytest.raises(UnroutableJobError) as info:
        add.apply_async((1, 2), queue="vanishing")
    assert info.value.queue == "vanishing" and info.value.job_id
    assert info.value.job_id in str(info.value)
    # The channel stays usable: the next job to another queue is confirmed.
    ok = add.apply_async((1, 3), queue="refused")
    assert get_message(amqp_channel, "ojs.queue.refused").properties["message_id"] == ok.id


def test_broker_nack_raises_and_the_job_is_not_enqueued(app: Celery,
                                                       amqp_channel: amqp.Channel) -> None:
    """``full`` is declared with x-max-length=0 and x-overflow=reject-publish."""
    with pytest.raises(JobNackedError) as info:
        app.tasks["math.add"].apply_async((1, 2), queue="full")
    assert info.value.queue == "full"
    assert queue_depth(amqp_channel, "ojs.queue.full") == 0
    assert queue_depth(amqp_channel, "ojs.queue.dlx.full") == 0


def test_the_requests_priority_is_0_unless_the_job_has_one(app: Celery, worker: Any) -> None:
    """As on ``amqp://``, where kombu's producer sends priority 0 when none is given."""
    task = app.tasks["delivery.priority"]
    assert task.apply_async(queue="email").get(timeout=30) == 0
    assert task.apply_async(queue="email", priority=7).get(timeout=30) == 7
