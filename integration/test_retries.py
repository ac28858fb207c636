"""Retries by the broker, not the worker (binding sections 5.4, 5.5, 8)."""

from __future__ import annotations

import json
from typing import Any

import amqp
import pytest
from celery import Celery

import ojs_kombu
from ojs_kombu.job_ids import new_job_id

from .apps import SWITCHES
from .conftest import body_of, get_message, queue_depth, rabbitmqctl, wait_until


def test_task_failing_twice_completes_on_attempt_3(app: Celery, worker: Any) -> None:
    result = app.tasks["flaky.twice"].apply_async(queue="retries")
    assert result.get(timeout=30) == "done on attempt 3"
    runs = [c for c in app.calls.all() if c["id"] == result.id]
    assert [(c["attempt"], c["retries"]) for c in runs] == [(1, 0), (2, 1), (3, 2)]


def test_retries_wait_in_retry_queues(app: Celery, worker: Any, vhost: str) -> None:
    """``self.retry(countdown=0.5)`` takes the same path: ``ojs.queue.retry.{q}.{ms}``."""
    result = app.tasks["explicit.retry"].apply_async(queue="retries")
    assert result.get(timeout=30) == "done"
    queues = rabbitmqctl("list_queues", "--no-table-headers", "-p", vhost, "name",
                         "arguments").splitlines()
    retry_queue = next(line for line in queues if line.startswith("ojs.queue.retry.retries.512"))
    for argument in ('{"x-dead-letter-exchange","ojs.exchange.direct"}',
                     '{"x-dead-letter-routing-key","retries"}', '{"x-message-ttl",512}',
                     '{"x-expires",'):
        assert argument in retry_queue
    bindings = rabbitmqctl("list_bindings", "--no-table-headers", "-p", vhost, "source_name",
                           "destination_name", "routing_key")
    assert "ojs.exchange.retry\tojs.queue.retry.retries.512\tretries.512" in bindings


def test_retry_with_new_args_publishes_one_new_job_only(app: Celery, worker: Any) -> None:
    """Celery publishes the new message itself; the old delivery is only acked."""
    result = app.tasks["retry.new_args"].apply_async((1,), queue="retries")
    assert result.get(timeout=30) == 2
    import time

    time.sleep(1.0)  # a duplicate would have arrived by now
    runs = [c["args"] for c in app.calls.all() if c["id"] == result.id]
    assert runs == [[1], [2]]


def test_non_retryable_error_goes_straight_to_the_dlq(app: Celery, worker: Any,
                                                      amqp_channel: amqp.Channel) -> None:
    result = app.tasks["reject.value"].apply_async(queue="retries")
    with pytest.raises(ValueError):
        result.get(timeout=30)
    dead = get_message(amqp_channel, "ojs.queue.dlx.retries")
    headers = dead.properties["application_headers"]
    assert dead.properties["message_id"] == result.id
    assert headers["x-ojs-error-code"] == "NON_RETRYABLE_ERROR"
    assert headers["x-ojs-attempt"] == 1 and app.calls.count(result.id) == 1


def test_foreign_job_with_its_own_retry_policy_is_honoured(
        app: Celery, worker: Any, amqp_channel: amqp.Channel) -> None:
    job_id = new_job_id()
    job = {"specversion": "1.0", "id": job_id, "type": "always.fail", "queue": "retries",
           "args": [], "retry": {"max_attempts": 2, "initial_interval": "PT0.1S",
                                 "jitter": False}}
    amqp_channel.basic_publish(
        amqp.Message(json.dumps(job), content_type="application/openjobspec+json",
                     message_id=job_id, type="always.fail", delivery_mode=2,
                     application_headers={"x-ojs-queue": "retries", "x-ojs-attempt": 1,
                                          "x-ojs-max-attempts": 2}),
        exchange="ojs.exchange.direct", routing_key="retries", mandatory=True)
    dead = get_message(amqp_channel, "ojs.queue.dlx.retries", timeout=30)
    assert dead.properties["message_id"] == job_id
    assert dead.properties["application_headers"]["x-ojs-attempt"] == 2
    envelope = body_of(dead)
    assert envelope["retry"]["max_attempts"] == 2  # the foreign job's own policy, kept
    assert [e["attempt"] for e in envelope["errors"]] == [1, 2]
    assert app.calls.count(job_id) == 2


def test_dead_letter_api_lists_shows_replays_and_purges(
        app: Celery, worker: Any, amqp_channel: amqp.Channel) -> None:
    SWITCHES["toggle.fail"] = True
    toggle = app.tasks["toggle.fail"]
    first = toggle.apply_async(queue="retries")
    second = toggle.apply_async(queue="retries")
    with ojs_kombu.dead_letter_queue(app, "retries") as dlq:
        wait_until(lambda: len(dlq) == 2, timeout=30, what="two dead letters")
        listed = dlq.list()
        assert {d.job_id for d in listed} == {first.id, second.id}
        assert len(dlq) == 2  # listing consumed nothing
        shown = dlq.get(first.id)
        assert shown.error_code == "HANDLER_ERROR" and shown.error_message == "switched off"
        assert shown.envelope is not None and shown.envelope["state"] == "discarded"
        with pytest.raises(ojs_kombu.DeadLetterNotFound):
            dlq.get(new_job_id())

        SWITCHES["toggle.fail"] = False
        dlq.replay(first.id)
        assert first.get(timeout=30) == "ran"  # same id, run again
        runs = [c for c in app.calls.all() if c["id"] == first.id]
        assert [c["attempt"] for c in runs] == [1, 1]  # attempt reset
        assert [d.job_id for d in dlq.list()] == [second.id]
        assert dlq.purge() == 1
        assert len(dlq) == 0
    assert queue_depth(amqp_channel, "ojs.queue.dlx.retries") == 0


def test_replay_all_keeps_error_history(app: Celery, worker: Any,
                                        amqp_channel: amqp.Channel) -> None:
    SWITCHES["toggle.fail"] = True
    ids = [app.tasks["toggle.fail"].apply_async(queue="retries").id for _ in range(3)]
    with ojs_kombu.dead_letter_queue(app, "retries") as dlq:
        wait_until(lambda: len(dlq) == 3, timeout=30, what="three dead letters")
        SWITCHES["toggle.fail"] = True  # they fail again: history grows
        assert sorted(dlq.replay_all()) == sorted(ids)
        wait_until(lambda: len(dlq) == 3, timeout=30, what="the replayed jobs back")
        histories = [d.envelope["errors"] for d in dlq.list()]
        assert all(len(errors) == 2 for errors in histories)
        dlq.purge()
    SWITCHES["toggle.fail"] = False


def test_replay_is_confirmed_before_the_dead_letter_is_removed(
        app: Celery, worker: Any, amqp_channel: amqp.Channel) -> None:
    """If the job queue is gone, the replay fails and the dead letter stays."""
    with ojs_kombu.dead_letter_queue(app, "replay-gone") as dlq:
        job_id = new_job_id()
        amqp_channel.basic_publish(
            amqp.Message(json.dumps({"specversion": "1.0", "id": job_id, "type": "math.add",
                                     "queue": "replay-gone", "args": [1, 2]}),
                         message_id=job_id, content_type="application/openjobspec+json"),
            exchange="ojs.exchange.dlx", routing_key="replay-gone")
        wait_until(lambda: len(dlq) == 1, what="the dead letter")
        amqp_channel.queue_delete("ojs.queue.replay-gone")  # deleted after it was declared
        with pytest.raises(ojs_kombu.UnroutableJobError):
            dlq.replay(job_id)
        assert [d.job_id for d in dlq.list()] == [job_id]  # the dead letter stayed
