"""Retried and scheduled jobs whose delay ends while their bounded queue is full are
never dropped: they wait in ``ojs.queue.ready.{q}`` until the queue accepts them
(classic and quorum job queues, real broker, counted)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import amqp
import pytest
from celery import Celery

from ojs_kombu.amqp.job_channel import JobChannel, JobConnection, JobDelivery
from ojs_kombu.spec.failures import JobFailure

from .apps import make_app
from .conftest import body_of, queue_depth, rabbitmqctl, wait_until

BOUND = 3
#: RabbitMQ offers a refused at-least-once dead letter again after its dead-letter
#: worker's ``dead_letter_worker_publisher_confirm_timeout`` (180 s by default): set
#: to RETRY_MS while this module's queues are declared (each queue's worker reads it
#: when it starts), so that held jobs arrive within seconds rather than minutes.
RETRY_MS, DEFAULT_RETRY_MS = 10000, 180000
# The retry time is the broker's, not the vhost's: one module at a time changes it
# and sets it back (integration/conftest.py, broker_wide).
pytestmark = pytest.mark.broker_wide("dead_letter_worker_publisher_confirm_timeout")
ARRIVAL_TIMEOUT = 300.0
QUEUES = {"nl-classic": {"max_depth": BOUND},
          "nl-quorum": {"type": "quorum", "max_depth": BOUND,
                        "dead_letter_strategy": "at-least-once"}}


def dead_letter_retry_ms() -> int:
    return int(rabbitmqctl("eval", "application:get_env(rabbit, "
                           "dead_letter_worker_publisher_confirm_timeout, 0)."))


def set_dead_letter_retry_ms(ms: int) -> None:
    rabbitmqctl("eval", "application:set_env(rabbit, "
                f"dead_letter_worker_publisher_confirm_timeout, {ms}).")


@pytest.fixture(scope="module")
def short_dead_letter_retry() -> Iterator[None]:
    """The broker's default is changed only where it is the default, and set back: a
    suite on the same broker (CI runs two) that finds it changed leaves it alone."""
    changed = dead_letter_retry_ms() == DEFAULT_RETRY_MS
    if changed:
        set_dead_letter_retry_ms(RETRY_MS)
    try:
        yield
    finally:
        if changed and dead_letter_retry_ms() == RETRY_MS:
            set_dead_letter_retry_ms(DEFAULT_RETRY_MS)


@pytest.fixture(scope="module")
def nl_app(broker_url: str, short_dead_letter_retry: None) -> Celery:
    """A producer only: nothing consumes these queues but the test."""
    return make_app("no-loss", broker_url, None, ojs_queues=QUEUES)


def send(app: Celery, queue: str, n: int, **options: Any) -> str:
    return app.tasks["math.add"].apply_async((n, n), queue=queue, **options).id


def fail_into_retry(channel: JobChannel, queue: str, delay_s: float) -> list[str]:
    """Fail every job waiting in ``queue`` once, as a worker does: each goes to its retry
    queue and the delivery is acked."""
    retried = []
    while (message := channel.basic_get(f"ojs.queue.{queue}")) is not None:
        props = message.properties
        delivery = JobDelivery(queue, props["message_id"], message.body, dict(props),
                               props.get("type"))
        channel.retry_job(delivery, message.delivery_tag,
                          JobFailure("HANDLER_ERROR", "Boom", "failed on purpose"), delay_s)
        retried.append(props["message_id"])
    return retried


def messages_in(vhost: str, queue: str) -> int:
    """Every message of ``queue`` the broker holds (ready, unacked, or an at-least-once
    dead letter waiting for its target to confirm it)."""
    for line in rabbitmqctl("list_queues", "-p", vhost, "name", "messages").splitlines():
        name, _, count = line.partition("\t")
        if name == queue:
            return int(count)
    raise AssertionError(f"no queue {queue!r}")


def test_retries_and_schedules_of_a_full_queue_wait_and_arrive(
        nl_app: Celery, amqp_channel: amqp.Channel, vhost: str) -> None:
    """On a classic and a quorum job queue at once: 3 retried and 4 scheduled jobs whose
    delays end while the queue is full (3 of 3) are held, then arrive once there is room."""
    jobs: dict[str, dict[str, list[str]]] = {}
    for queue in QUEUES:
        retrying = [send(nl_app, queue, n) for n in range(BOUND)]
        with nl_app.connection_for_write() as connection:
            connection.ensure_connection()
            amqp_connection: JobConnection = connection.connection
            channel = amqp_connection.channel()
            assert sorted(fail_into_retry(channel, queue, 1.0)) == sorted(retrying)
            channel.close()
        scheduled = [send(nl_app, queue, n, countdown=1.0) for n in range(4)]
        filling = [send(nl_app, queue, n) for n in range(BOUND)]  # full before any delay ends
        jobs[queue] = {"retried": retrying, "scheduled": scheduled, "filling": filling}
    time.sleep(2.5)  # every delay has ended; none of the 7 waited jobs had room
    for queue, groups in jobs.items():
        published = sum(len(ids) for ids in groups.values())
        # a quorum queue's message count is refreshed every few seconds
        def counts(q: str = queue, total: int = published) -> tuple[int, int] | None:
            in_queue = queue_depth(amqp_channel, f"ojs.queue.{q}")
            held = messages_in(vhost, f"ojs.queue.ready.{q}")
            return (in_queue, held) if in_queue + held >= total else None
        in_queue, held = wait_until(counts, 30, f"held jobs of {queue}", interval=1.0)
        dead = queue_depth(amqp_channel, f"ojs.queue.dlx.{queue}")
        print(f"{queue}: published {published}, in the job queue {in_queue}, held in "
              f"ojs.queue.ready.{queue} {held}, dead-lettered {dead}, "
              f"lost {published - in_queue - held - dead}")
        assert dead == 0 and in_queue + held == published  # nothing lost
        assert in_queue >= BOUND and held >= published - in_queue

    seen: dict[str, list[str]] = {queue: [] for queue in QUEUES}

    def take() -> bool:
        for queue in QUEUES:
            while (message := amqp_channel.basic_get(f"ojs.queue.{queue}")) is not None:
                amqp_channel.basic_ack(message.delivery_tag)
                seen[queue].append(body_of(message)["id"])
        waited = {q: set(g["retried"] + g["scheduled"]) for q, g in jobs.items()}
        return all(set(seen[q]) & waited[q] for q in QUEUES)  # held jobs move on

    started = time.monotonic()
    wait_until(take, ARRIVAL_TIMEOUT, "held jobs to reach their emptied queues")
    for queue, groups in jobs.items():
        published = {job for ids in groups.values() for job in ids}

        def accounted(q: str = queue, n: int = len(published)) -> bool:
            take()  # the count of held jobs trails by a few seconds
            return len(set(seen[q])) + messages_in(vhost, f"ojs.queue.ready.{q}") == n

        wait_until(accounted, 30, f"every job of {queue} arrived or held", interval=1.0)
        arrived = set(seen[queue])
        print(f"{queue}: after {time.monotonic() - started:.0f}s {len(arrived)} arrived, "
              f"{len(published) - len(arrived)} still held, "
              f"duplicates {len(seen[queue]) - len(arrived)}")
        assert arrived <= published and len(seen[queue]) == len(arrived)
