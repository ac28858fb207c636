"""Batch enqueue against the real broker: every job confirmed and run, failures named."""

from __future__ import annotations

from typing import Any

import amqp
import pytest
from celery import Celery, group

import ojs_kombu
from ojs_kombu.spec.errors import BatchPublishError

from .conftest import queue_depth


def test_a_batch_of_signatures_groups_and_tuples_runs_every_job(app: Celery, worker: Any) -> None:
    add = app.tasks["math.add"]
    jobs: list[Any] = [add.s(i, 1) for i in range(300)]
    jobs.append(group(add.s(i, 2) for i in range(300)))
    jobs += [("math.add", (i, 3), {}, {"priority": 5}) for i in range(300)]
    jobs.append(add.s(1000, 0).set(countdown=1))
    results = ojs_kombu.enqueue_many(app, jobs)
    assert len(results) == 901 and len({r.id for r in results}) == 901
    for result in results:  # each job ran exactly once, under the id enqueue_many returned
        app.calls.wait_for(result.id, timeout=60)
    assert all(app.calls.count(r.id) == 1 for r in results)
    last = app.calls.wait_for(results[-1].id)
    assert last["args"] == [1000, 0]


@pytest.mark.parametrize("chosen_ids", [False, True], ids=["uuid7-ids", "chosen-task-ids"])
def test_a_batch_names_exactly_the_jobs_the_broker_did_not_take(
        app: Celery, amqp_channel: amqp.Channel, chosen_ids: bool) -> None:
    """By the task ids its results have, chosen ones (``"order-7"``) too."""
    add = app.tasks["math.add"]
    ojs_kombu.enqueue_many(app, [add.s(0, 0).set(queue="batchgone"),
                                 add.s(0, 0).set(queue="batchkept")])
    # Declared and cached by the producer's connection; deleted behind its back.
    amqp_channel.queue_delete("ojs.queue.batchgone")
    amqp_channel.queue_purge("ojs.queue.batchkept")
    ids = [f"order-{i}-{ojs_kombu.new_job_id()[-6:]}" if chosen_ids else ojs_kombu.new_job_id()
           for i in range(30)]
    jobs = [add.s(i, i).set(queue="batchgone" if i % 3 == 0 else "batchkept", task_id=ids[i])
            for i in range(30)]
    with pytest.raises(BatchPublishError) as info:
        ojs_kombu.enqueue_many(app, jobs)
    error = info.value
    assert set(error.rejected) == set(ids[::3])
    assert error.accepted == tuple(i for n, i in enumerate(ids) if n % 3)
    assert not error.unconfirmed
    assert all("returned" in reason for reason in error.rejected.values())
    for job_id in error.rejected:
        assert chosen_ids or job_id in str(error)
    assert queue_depth(amqp_channel, "ojs.queue.batchkept") == 20
    # The next batch re-declares the queue and goes through.
    ojs_kombu.enqueue_many(app, [add.s(1, 1).set(queue="batchgone")])
    assert queue_depth(amqp_channel, "ojs.queue.batchgone") == 1


def test_a_batch_into_a_full_queue_raises_and_nothing_is_enqueued(
        app: Celery, amqp_channel: amqp.Channel) -> None:
    """``full`` is declared with x-max-length=0 and x-overflow=reject-publish: the batch
    is refused before it is sent (broker nacks are in integration/test_backpressure.py)."""
    add = app.tasks["math.add"]
    with pytest.raises(BatchPublishError) as info:
        ojs_kombu.enqueue_many(app, [add.s(i, i).set(queue="full") for i in range(5)])
    assert isinstance(info.value, ojs_kombu.QueueFullError)
    assert len(info.value.rejected) == 5 and not info.value.accepted
    assert all(reason.startswith("not sent") for reason in info.value.rejected.values())
    assert queue_depth(amqp_channel, "ojs.queue.full") == 0


def test_results_come_back_one_per_job_in_order_and_an_empty_batch_has_none(
        app: Celery, amqp_channel: amqp.Channel) -> None:
    """More jobs than one confirm window (500), each named by the caller."""
    add = app.tasks["math.add"]
    assert ojs_kombu.enqueue_many(app, []) == []
    ids = [f"order-{i}-{ojs_kombu.new_job_id()[-6:]}" for i in range(700)]
    results = ojs_kombu.enqueue_many(
        app, [add.s(i, i).set(task_id=ids[i], queue="batchorder") for i in range(700)])
    assert [result.id for result in results] == ids
    assert queue_depth(amqp_channel, "ojs.queue.batchorder") == 700
