"""Quorum job queues (AMQP-032): retry, schedule and dead-letter paths on the real broker."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import amqp
import pytest
from celery import Celery

from ojs_kombu.celery.dead_letters import dead_letter_queue

from .apps import make_app
from .conftest import body_of, get_message, rabbitmqctl
from .workers import in_process_worker

QUEUE = "bp-qq"


@pytest.fixture(scope="module")
def qq_app(broker_url: str) -> Celery:
    # The error-rich dead letters (republished with x-ojs-error-*), on quorum queues.
    return make_app("quorum", broker_url, "cache+memory://", ojs_dead_letter_mode="republish",
                    ojs_queues={QUEUE: {"type": "quorum", "max_depth": 1000,
                                        "dead_letter_strategy": "at-least-once"}})


@pytest.fixture(scope="module")
def qq_worker(qq_app: Celery) -> Iterator[Any]:
    with in_process_worker(qq_app, [QUEUE], pool="threads", concurrency=2,
                           shutdown_timeout=30) as worker:
        yield worker


def queue_types(vhost: str) -> dict[str, str]:
    listing = rabbitmqctl("list_queues", "--no-table-headers", "-p", vhost, "name", "type",
                          "arguments")
    return {line.split("\t")[0]: line for line in listing.splitlines()}


def test_job_queue_its_dlq_and_its_control_queue_are_quorum(qq_app: Celery, qq_worker: Any,
                                                           vhost: str) -> None:
    lines = queue_types(vhost)
    job = lines[f"ojs.queue.{QUEUE}"]
    assert "\tquorum\t" in job
    for argument in ('{"x-dead-letter-strategy","at-least-once"}',
                     '{"x-overflow","reject-publish"}', '{"x-max-length",1000}',
                     '{"x-dead-letter-exchange","ojs.exchange.dlx"}'):
        assert argument in job
    assert "x-max-priority" not in job
    assert "\tquorum\t" in lines[f"ojs.queue.dlx.{QUEUE}"]
    # a durable classic queue whose node is down refuses Queue.Declare: the control
    # queue is quorum too, so workers find it again on a cluster that lost a node
    assert "\tquorum\t" in lines[f"ojs.queue.control.{QUEUE}"]


def test_retried_job_completes_through_a_quorum_retry_queue(
        qq_app: Celery, qq_worker: Any, vhost: str) -> None:
    result = qq_app.tasks["flaky.twice"].apply_async(queue=QUEUE)
    assert result.get(timeout=60) == "done on attempt 3"
    runs = [c for c in qq_app.calls.all() if c["id"] == result.id]
    assert [c["attempt"] for c in runs] == [1, 2, 3]
    retry_queues = [line for name, line in queue_types(vhost).items()
                    if name.startswith(f"ojs.queue.retry.{QUEUE}.")]
    assert retry_queues
    for line in retry_queues:
        assert "\tquorum\t" in line and '{"x-dead-letter-strategy","at-least-once"}' in line
        assert "x-expires" not in line


def test_scheduled_job_runs_on_a_quorum_queue(qq_app: Celery, qq_worker: Any) -> None:
    sent = time.time()
    result = qq_app.tasks["email.send"].apply_async(("a@example.com", "later"), countdown=1,
                                                    queue=QUEUE)
    assert result.get(timeout=60) == "sent later to a@example.com"
    call = qq_app.calls.wait_for(result.id)
    assert call["started"].timestamp() >= sent + 1


def test_failed_job_reaches_the_quorum_dlq(qq_app: Celery, qq_worker: Any,
                                           amqp_channel: amqp.Channel) -> None:
    result = qq_app.tasks["reject.value"].apply_async(queue=QUEUE)
    with pytest.raises(ValueError):
        result.get(timeout=60)
    dead = get_message(amqp_channel, f"ojs.queue.dlx.{QUEUE}")
    assert dead.properties["message_id"] == result.id
    assert body_of(dead)["id"] == result.id
    headers = dead.properties["application_headers"]
    assert headers["x-ojs-error-code"] == "NON_RETRYABLE_ERROR"
    assert "x-death" not in headers  # republished, not dead-lettered by the broker


def test_a_job_redelivered_over_its_delivery_limit_lands_in_the_dlq_with_its_reason(
        broker_url: str, vhost: str, amqp_channel: amqp.Channel) -> None:
    """RabbitMQ 4.0+ gives quorum queues ``delivery-limit`` 20 by default; here it is
    set to 1 (``delivery_limit``), which 3.10 honours: a job returned to its queue
    more often (say its run kills the worker each time) is dead-lettered into
    ``ojs.queue.dlx.{q}``, reason ``delivery_limit``, never dropped."""
    queue = "qq-limit"
    app = make_app("quorum-limit", broker_url, None,
                   ojs_queues={queue: {"type": "quorum", "delivery_limit": 1}})
    result = app.tasks["math.add"].apply_async((1, 2), queue=queue)
    for _ in range(2):  # delivered and returned twice: one more than the limit
        message = wait_for(lambda: amqp_channel.basic_get(f"ojs.queue.{queue}"))
        assert message.properties["message_id"] == result.id
        amqp_channel.basic_reject(message.delivery_tag, requeue=True)
    with dead_letter_queue(app, queue) as dlq:
        dead = wait_for(lambda: next(iter(dlq.list()), None))
        assert dead.job_id == result.id
        assert dead.death_reason == "delivery_limit"
        assert dead.envelope is not None and dead.envelope["id"] == result.id
    assert amqp_channel.basic_get(f"ojs.queue.{queue}") is None


def wait_for(get: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = get()
        if value is not None:
            return value
        time.sleep(0.05)
    raise AssertionError(f"nothing after {timeout}s")
