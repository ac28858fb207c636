"""A dead letter never vanishes: the DLQ deleted under a running worker (AMQP-009).

Discarded jobs are ``Basic.Nack(requeue=false)``-ed into ``ojs.exchange.dlx``;
with ``ojs.queue.dlx.{q}`` deleted (an operator, a policy, a cleanup) RabbitMQ
would drop them.  ``ojs.exchange.dlx.guard``'s alternate exchange keeps them in
``ojs.queue.dlx.unroutable``, where ``ojs-kombu dlq list --queue unroutable``
shows them and a replay puts each back on its own queue.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import amqp
import pytest
from celery import Celery

from ojs_kombu import JobNackedError
from ojs_kombu.celery.dead_letters import dead_letter_queue
from ojs_kombu.spec.job_ids import new_job_id

from .apps import make_app
from .conftest import HOST, PORT, private_vhost, wait_until
from .test_cli import run_json
from .workers import in_process_worker

CLASSIC, QUORUM = "dl-gone-classic", "dl-gone-quorum"
UNROUTABLE = "ojs.queue.dlx.unroutable"


@pytest.fixture(scope="module")
def gone_app(broker_url: str) -> Celery:
    return make_app("dl-gone", broker_url, "cache+memory://",
                    ojs_queues={QUORUM: {"type": "quorum"}})


@pytest.fixture(scope="module")
def gone_worker(gone_app: Celery) -> Iterator[Any]:
    with in_process_worker(gone_app, [CLASSIC, QUORUM], pool="threads", concurrency=2,
                           shutdown_timeout=30) as worker:
        yield worker


def publish_failing(channel: amqp.Channel, queue: str, count: int) -> list[str]:
    """Jobs that fail once and may not be retried (``max_attempts`` 1), as any OJS
    producer sends them: the worker nacks each into the DLX."""
    ids = []
    for _ in range(count):
        job_id = new_job_id()
        job = {"specversion": "1.0", "id": job_id, "type": "always.fail", "queue": queue,
               "args": [], "retry": {"max_attempts": 1}}
        channel.basic_publish_confirm(
            amqp.Message(json.dumps(job), content_type="application/openjobspec+json",
                         message_id=job_id, type="always.fail", delivery_mode=2,
                         application_headers={"x-ojs-queue": queue, "x-ojs-attempt": 1,
                                              "x-ojs-max-attempts": 1}),
            exchange="ojs.exchange.direct", routing_key=queue, mandatory=True)
        ids.append(job_id)
    return ids


def ids_in(channel: amqp.Channel, queue: str) -> list[str]:
    """The job id of each message in ``queue`` (browsed: the channel's close puts them
    back)."""
    try:
        present = channel.queue_declare(queue, passive=True).message_count
    except amqp.NotFound:
        return []
    found = []
    for _ in range(present):
        message = channel.basic_get(queue)
        if message is None:
            break
        found.append(message.properties["message_id"])
    return found


def browse(vhost: str, queue: str) -> list[str]:
    connection = amqp.Connection(f"{HOST}:{PORT}", virtual_host=vhost)
    connection.connect()
    try:
        return ids_in(connection.channel(), queue)
    finally:
        connection.close()


@pytest.mark.parametrize("queue", [CLASSIC, QUORUM])
def test_dead_letters_survive_the_deletion_of_their_dlq(
        gone_app: Celery, gone_worker: Any, amqp_channel: amqp.Channel, vhost: str,
        broker_url: str, queue: str) -> None:
    amqp_channel.confirm_select()
    before = publish_failing(amqp_channel, queue, 2)
    # each once, though two routes lead there (ojs.exchange.dlx and its guard)
    wait_until(lambda: sorted(browse(vhost, f"ojs.queue.dlx.{queue}")) == sorted(before), 30,
               "the first dead letters in their DLQ, each once")
    amqp_channel.queue_delete(f"ojs.queue.dlx.{queue}")  # under the running worker

    published = publish_failing(amqp_channel, queue, 5)
    wait_until(lambda: all(gone_app.calls.count(i) == 1 for i in published), 30,
               "every job's one attempt")
    found = wait_until(lambda: set(published) <= set(browse(vhost, UNROUTABLE))
                       and set(browse(vhost, UNROUTABLE)), 30, "the dead letters")
    ran = sum(gone_app.calls.count(i) for i in published)
    dead_lettered = set(published) & found
    lost = set(published) - dead_lettered
    assert (len(published), ran, len(dead_lettered), len(lost)) == (5, 5, 5, 0)

    # where an operator finds them: with their own queue, and the last attempt's story
    code, listing = run_json(broker_url, "dlq", "list", "--queue", "unroutable")
    assert code == 0 and listing["dead_letter_queue"] == UNROUTABLE
    ours = {d["job_id"]: d for d in listing["dead_letters"] if d["job_id"] in published}
    assert set(ours) == set(published)
    assert {d["queue"] for d in ours.values()} == {queue}
    assert {d["death_reason"] for d in ours.values()} == {"rejected"}

    # a replay puts a job back on its own queue (which declares its DLQ again)
    with dead_letter_queue(gone_app, "unroutable") as unroutable:
        unroutable.replay(published[0])
    wait_until(lambda: gone_app.calls.count(published[0]) == 2, 30, "the replayed attempt")
    assert published[0] in wait_until(lambda: browse(vhost, f"ojs.queue.dlx.{queue}"), 30,
                                      "the replayed job's second dead letter")
    assert published[0] not in browse(vhost, UNROUTABLE)


def test_a_replay_acks_each_dead_letter_whose_copy_was_confirmed_and_keeps_the_refused(
        ) -> None:
    """``dlq replay --all`` of ``unroutable``, whose dead letters go back to their own
    queues: one copy the broker refuses (its queue is full) keeps its dead letter, the
    copy after it that the broker took removes its own, even though it came later in
    the same window: nothing stays to be replayed twice."""
    with private_vhost("ojs-kombu-replay") as vhost:
        app = make_app("replay-acks", f"ojs://guest:guest@{HOST}:{PORT}/{vhost}",
                       ojs_queues={"replay-full": {"max_depth": 1}})
        app.tasks["math.add"].apply_async((1, 1), queue="replay-full")  # the queue is full
        app.tasks["math.add"].apply_async((2, 2), queue="replay-open")
        connection = amqp.Connection(f"{HOST}:{PORT}", virtual_host=vhost)
        connection.connect()
        try:
            channel = connection.channel()
            channel.queue_purge("ojs.queue.replay-open")
            with dead_letter_queue(app, "unroutable"):
                pass  # declares ojs.queue.dlx.unroutable
            full, taken = new_job_id(), new_job_id()
            channel.confirm_select()
            for job_id, queue in ((full, "replay-full"), (taken, "replay-open")):
                job = {"specversion": "1.0", "id": job_id, "type": "math.add",
                       "queue": queue, "args": [1, 2]}
                channel.basic_publish_confirm(
                    amqp.Message(json.dumps(job), message_id=job_id, type="math.add",
                                 content_type="application/openjobspec+json",
                                 application_headers={"x-ojs-queue": queue}),
                    exchange="", routing_key=UNROUTABLE, mandatory=True)
            with dead_letter_queue(app, "unroutable") as dlq, \
                    pytest.raises(JobNackedError, match=f"job {full} .* stays in"):
                dlq.replay_all()

            def look(queue: str) -> list[str]:  # a channel each: its close requeues
                browsing = connection.channel()
                try:
                    return ids_in(browsing, queue)
                finally:
                    browsing.close()
            # the replay's channel closed: its unacked dead letter is back in the DLQ
            wait_until(lambda: look(UNROUTABLE) == [full], timeout=10,
                       what="only the refused dead letter left")
            assert look("ojs.queue.replay-open") == [taken]
            assert len(look("ojs.queue.replay-full")) == 1  # the job that filled it
        finally:
            connection.close()
