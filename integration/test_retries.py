"""Retries by the broker, not the worker (binding sections 5.4, 5.5, 8)."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import amqp
import pytest
from celery import Celery

import ojs_kombu
from ojs_kombu.spec.job_ids import new_job_id
from ojs_kombu.spec.naming import is_job_id

from .apps import SWITCHES, make_app
from .conftest import body_of, get_message, publish_raw, queue_depth, rabbitmqctl, wait_until
from .workers import launch_worker


def discarded_event(events_file: Path, job_id: str) -> dict[str, Any]:
    """The ``job.discarded`` event of ``job_id``: where a nacked job's last error is."""
    def find() -> dict[str, Any] | None:
        if not events_file.exists():
            return None
        for line in events_file.read_text().splitlines():
            event = json.loads(line)
            if event["type"] == "job.discarded" and event["subject"] == job_id:
                return event
        return None
    return wait_until(find, timeout=20, what=f"job.discarded of {job_id}")



def test_task_failing_twice_completes_on_attempt_3(app: Celery, worker: Any) -> None:
    result = app.tasks["flaky.twice"].apply_async(queue="retries")
    assert result.get(timeout=30) == "done on attempt 3"
    runs = [c for c in app.calls.all() if c["id"] == result.id]
    assert [(c["attempt"], c["retries"]) for c in runs] == [(1, 0), (2, 1), (3, 2)]


def test_retries_wait_in_retry_queues(app: Celery, worker: Any, vhost: str) -> None:
    """``self.retry(countdown=0.5)`` takes the same path: ``ojs.queue.retry.{q}.{ms}``
    of the longest rung not longer than 500 ms (384), the rest through the ladder."""
    result = app.tasks["explicit.retry"].apply_async(queue="retries")
    assert result.get(timeout=30) == "done"
    queues = rabbitmqctl("list_queues", "--no-table-headers", "-p", vhost, "name",
                         "arguments").splitlines()
    retry_queue = next(line for line in queues if line.startswith("ojs.queue.retry.retries.384"))
    for argument in ('{"x-dead-letter-exchange","ojs.exchange.direct"}',
                     '{"x-dead-letter-routing-key","retries"}', '{"x-message-ttl",384}',
                     '{"x-expires",'):
        assert argument in retry_queue
    bindings = rabbitmqctl("list_bindings", "--no-table-headers", "-p", vhost, "source_name",
                           "destination_name", "routing_key")
    assert "ojs.exchange.retry\tojs.queue.retry.retries.384\tretries.384" in bindings


def _next_attempt_after(app: Celery, job_id: str, task: str) -> float:
    """Seconds from the moment attempt 1 failed to the start of attempt 2."""
    first = app.calls.wait_for(job_id, task=task, attempt=1)
    second = app.calls.wait_for(job_id, timeout=30, task=task, attempt=2)
    return float(second["at"] - first["at"])


@pytest.mark.parametrize("countdown", [1.1, 3.3])
def test_self_retry_never_starts_before_its_countdown(app: Celery, worker: Any,
                                                      countdown: float) -> None:
    """A retry after an API's ``Retry-After`` must not start early: 1.1 s and 3.3 s lie
    just past a rung (1.024 s, 3.072 s), the nearest one, which is shorter."""
    result = app.tasks["retry.after"].apply_async((countdown,), queue="retries")
    assert result.get(timeout=30) == "done"
    assert _next_attempt_after(app, result.id, "retry.after") >= countdown


def test_autoretry_backoff_never_starts_before_its_delay(app: Celery, worker: Any) -> None:
    result = app.tasks["retry.backoff"].apply_async(queue="retries")
    assert result.get(timeout=30) == "done"
    assert _next_attempt_after(app, result.id, "retry.backoff") >= 5.0


def test_a_foreign_jobs_retry_policy_never_starts_early(
        app: Celery, worker: Any, amqp_channel: amqp.Channel) -> None:
    job_id = new_job_id()
    job = {"specversion": "1.0", "id": job_id, "type": "retry.after", "queue": "retries",
           "args": [0, "raise"], "retry": {"max_attempts": 2, "initial_interval": "PT1.1S",
                                           "jitter": False}}
    publish_raw(amqp_channel,
                amqp.Message(json.dumps(job), content_type="application/openjobspec+json",
                             message_id=job_id, type="retry.after", delivery_mode=2,
                             application_headers={"x-ojs-queue": "retries", "x-ojs-attempt": 1,
                                                  "x-ojs-max-attempts": 2}),
                "retries")
    assert _next_attempt_after(app, job_id, "retry.after") >= 1.1


def test_retry_with_new_args_publishes_one_new_job_only(app: Celery, worker: Any) -> None:
    """Celery publishes the new message itself; the old delivery is only acked."""
    result = app.tasks["retry.new_args"].apply_async((1,), queue="retries")
    assert result.get(timeout=30) == 2
    import time

    time.sleep(1.0)  # a duplicate would have arrived by now
    runs = [c["args"] for c in app.calls.all() if c["id"] == result.id]
    assert runs == [[1], [2]]


def test_a_retry_with_new_args_keeps_a_chosen_task_id_and_its_job_id(app: Celery,
                                                                     worker: Any) -> None:
    """A task id that is not a UUIDv7 travels beside a UUIDv7 job id; Celery's retry
    with new arguments (a new message) keeps both."""
    task_id = f"report-{uuid.uuid4().hex[:8]}"
    result = app.tasks["retry.new_args"].apply_async((1,), queue="retries", task_id=task_id)
    assert result.id == task_id and result.get(timeout=30) == 2
    runs = [c for c in app.calls.all() if c["id"] == task_id]
    assert [c["args"] for c in runs] == [[1], [2]]
    job_ids = {c["job_id"] for c in runs}
    assert len(job_ids) == 1 and is_job_id(job_ids.pop())


def test_non_retryable_error_goes_straight_to_the_dlq(app: Celery, worker: Any,
                                                      amqp_channel: amqp.Channel,
                                                      events_file: Path) -> None:
    result = app.tasks["reject.value"].apply_async(queue="retries")
    with pytest.raises(ValueError):
        result.get(timeout=30)
    dead = get_message(amqp_channel, "ojs.queue.dlx.retries")
    headers = dead.properties["application_headers"]
    assert dead.properties["message_id"] == result.id
    assert headers["x-death"][0]["reason"] == "rejected"  # Basic.Nack (AMQP-009)
    assert headers["x-ojs-attempt"] == 1 and app.calls.count(result.id) == 1
    last_error = discarded_event(events_file, result.id)["data"]["last_error"]
    assert last_error["code"] == "NON_RETRYABLE_ERROR"


def test_a_task_out_of_its_own_retries_is_decided_once(app: Celery, worker: Any,
                                                      amqp_channel: amqp.Channel,
                                                      events_file: Path) -> None:
    """``self.retry(max_retries=0)``: the pool's verdict stands (no retry under the
    job's 3-attempt policy, out of retries rather than non-retryable), and the one
    failed attempt is one job.failed and one job.discarded."""
    result = app.tasks["retry.gives_up"].apply_async(queue="retries")
    with pytest.raises(TimeoutError):
        result.get(timeout=30)
    dead = get_message(amqp_channel, "ojs.queue.dlx.retries")
    assert dead.properties["message_id"] == result.id
    headers = dead.properties["application_headers"]
    assert headers["x-ojs-attempt"] == 1
    assert headers.get("x-ojs-error-code", "HANDLER_ERROR") == "HANDLER_ERROR"
    assert discarded_event(events_file, result.id)["data"]["last_error"]["code"] == \
        "HANDLER_ERROR"
    time.sleep(0.5)  # a retry would have run by now
    assert app.calls.count(result.id) == 1
    kinds = [e["type"] for e in map(json.loads, events_file.read_text().splitlines())
             if e["subject"] == result.id]
    assert (kinds.count("job.failed"), kinds.count("job.retrying"),
            kinds.count("job.discarded")) == (1, 0, 1)


def test_a_prefork_pools_verdict_reaches_the_worker(broker_url: str, tmp_path: Path,
                                                  amqp_channel: amqp.Channel) -> None:
    """Across a prefork pool's process boundary the reason travels with the pickled
    exception: out of its own retries is ``HANDLER_ERROR`` on the first of 3 attempts
    (judged again in the worker it would be ``NON_RETRYABLE_ERROR``)."""
    client = make_app("verdict-client", broker_url, None)
    events = tmp_path / "events.jsonl"
    log = tmp_path / "worker.log"
    with launch_worker(broker_url, "integration.cliapp", "verdict-prefork", pool="prefork",
                       concurrency=1, log=log, env={"OJS_TEST_EVENTS_FILE": str(events)}):
        result = client.tasks["retry.gives_up"].apply_async(queue="verdict-prefork")
        dead = dead_letter_of(amqp_channel, "verdict-prefork", result.id, timeout=60)
        assert dead.properties["application_headers"]["x-ojs-attempt"] == 1, log.read_text()
        last_error = discarded_event(events, result.id)["data"]["last_error"]
        assert last_error["code"] == "HANDLER_ERROR", last_error
        kinds = [e["type"] for e in map(json.loads, events.read_text().splitlines())
                 if e["subject"] == result.id]
        assert (kinds.count("job.failed"), kinds.count("job.discarded")) == (1, 1), kinds


def test_foreign_job_with_its_own_retry_policy_is_honoured(
        app: Celery, worker: Any, amqp_channel: amqp.Channel) -> None:
    job_id = new_job_id()
    job = {"specversion": "1.0", "id": job_id, "type": "always.fail", "queue": "retries",
           "args": [], "retry": {"max_attempts": 2, "initial_interval": "PT0.1S",
                                 "jitter": False}}
    publish_raw(amqp_channel,
                amqp.Message(json.dumps(job), content_type="application/openjobspec+json",
                             message_id=job_id, type="always.fail", delivery_mode=2,
                             application_headers={"x-ojs-queue": "retries", "x-ojs-attempt": 1,
                                                  "x-ojs-max-attempts": 2}),
                "retries")
    dead = get_message(amqp_channel, "ojs.queue.dlx.retries", timeout=30)
    assert dead.properties["message_id"] == job_id
    assert dead.properties["application_headers"]["x-ojs-attempt"] == 2
    envelope = body_of(dead)
    assert envelope["retry"]["max_attempts"] == 2  # the foreign job's own policy, kept
    # nacked as delivered for attempt 2: the envelope holds attempt 1's error
    assert [e["attempt"] for e in envelope["errors"]] == [1]
    assert app.calls.count(job_id) == 2


def test_dead_letter_api_lists_shows_replays_and_purges(
        app: Celery, worker: Any, amqp_channel: amqp.Channel, events_file: Path) -> None:
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
        assert shown.death_reason == "rejected"  # nacked by the worker: say so
        assert shown.envelope is not None and shown.envelope["id"] == first.id
        last_error = discarded_event(events_file, first.id)["data"]["last_error"]
        assert last_error == {"code": "HANDLER_ERROR", "message": "switched off"}
        with pytest.raises(ojs_kombu.DeadLetterNotFound):
            dlq.get(new_job_id())

        SWITCHES["toggle.fail"] = False
        dlq.replay(first.id)
        # same id, run again: the backend holds the first run's FAILURE until the
        # replayed run stores its own (as for any Celery task sent again with its id)
        def stored() -> dict[str, Any]:
            return app.backend.get_task_meta(first.id, cache=False)

        wait_until(lambda: stored()["status"] != "FAILURE", timeout=30,
                   what="the replayed run's result")
        assert stored()["result"] == "ran"
        runs = [c for c in app.calls.all() if c["id"] == first.id]
        assert [c["attempt"] for c in runs] == [1, 1]  # attempt reset
        assert [d.job_id for d in dlq.list()] == [second.id]
        assert dlq.purge() == 1
        assert len(dlq) == 0
    assert queue_depth(amqp_channel, "ojs.queue.dlx.retries") == 0


def test_replay_all_puts_every_dead_letter_back(app: Celery, worker: Any,
                                                amqp_channel: amqp.Channel) -> None:
    SWITCHES["toggle.fail"] = True
    ids = [app.tasks["toggle.fail"].apply_async(queue="retries").id for _ in range(3)]
    with ojs_kombu.dead_letter_queue(app, "retries") as dlq:
        wait_until(lambda: len(dlq) == 3, timeout=30, what="three dead letters")
        SWITCHES["toggle.fail"] = True  # they fail again
        assert sorted(dlq.replay_all()) == sorted(ids)
        wait_until(lambda: len(dlq) == 3, timeout=30, what="the replayed jobs back")
        back = dlq.list()
        assert sorted(d.job_id for d in back) == sorted(ids)
        # a replay starts afresh (x-death dropped), then one more nack
        assert [d.headers["x-death"][0]["count"] for d in back] == [1, 1, 1]
        assert [app.calls.count(job_id) for job_id in ids] == [2, 2, 2]
        dlq.purge()
    SWITCHES["toggle.fail"] = False


def test_replay_is_confirmed_before_the_dead_letter_is_removed(
        app: Celery, worker: Any, amqp_channel: amqp.Channel) -> None:
    """If the job queue is gone, the replay fails and the dead letter stays."""
    with ojs_kombu.dead_letter_queue(app, "replay-gone") as dlq:
        job_id = new_job_id()
        publish_raw(amqp_channel,
                    amqp.Message(json.dumps({"specversion": "1.0", "id": job_id,
                                             "type": "math.add", "queue": "replay-gone",
                                             "args": [1, 2]}),
                                 message_id=job_id,
                                 content_type="application/openjobspec+json"),
                    "replay-gone", exchange="ojs.exchange.dlx")
        wait_until(lambda: len(dlq) == 1, what="the dead letter")
        amqp_channel.queue_delete("ojs.queue.replay-gone")  # deleted after it was declared
        with pytest.raises(ojs_kombu.UnroutableJobError):
            dlq.replay(job_id)
        assert [d.job_id for d in dlq.list()] == [job_id]  # the dead letter stayed


# -- ojs_retry_semantics ----------------------------------------------------------------------
# "celery" (the default, the session's app): a Celery job is retried only where Celery
# would retry it; "ojs": every failure is a failed OJS attempt (3 under the default policy).


def dead_letter_of(channel: amqp.Channel, queue: str, job_id: str,
                   timeout: float = 30) -> amqp.Message:
    dead = get_message(channel, f"ojs.queue.dlx.{queue}", timeout=timeout)
    assert dead.properties["message_id"] == job_id
    return dead


def test_a_task_without_retry_options_runs_once_then_is_dead_lettered(
        app: Celery, worker: Any, amqp_channel: amqp.Channel) -> None:
    """A failing ``send_email`` sends one email, not three."""
    result = app.tasks["semantics.no_options"].apply_async(queue="semantics")
    dead = dead_letter_of(amqp_channel, "semantics", result.id)
    headers = dead.properties["application_headers"]
    assert headers["x-ojs-attempt"] == 1 and headers["x-ojs-max-attempts"] == 1
    envelope = body_of(dead)
    assert envelope["retry"]["max_attempts"] == 1  # the envelope says it is not retried
    assert "x_celery" in envelope
    time.sleep(0.5)  # a retry would have run by now
    assert app.calls.count(result.id) == 1


def test_autoretry_for_retries_within_max_retries(
        app: Celery, worker: Any, amqp_channel: amqp.Channel) -> None:
    """``autoretry_for=(ValueError,)``, ``max_retries=2``: 3 runs, then the DLQ."""
    result = app.tasks["semantics.autoretry"].apply_async(("ValueError",), queue="semantics")
    dead = dead_letter_of(amqp_channel, "semantics", result.id)
    assert dead.properties["application_headers"]["x-ojs-attempt"] == 3
    assert body_of(dead)["retry"]["max_attempts"] == 3
    time.sleep(0.5)
    runs = [c for c in app.calls.all() if c["id"] == result.id]
    assert [(c["attempt"], c["retries"]) for c in runs] == [(1, 0), (2, 1), (3, 2)]


def test_an_exception_autoretry_for_does_not_name_is_not_retried(
        app: Celery, worker: Any, amqp_channel: amqp.Channel) -> None:
    result = app.tasks["semantics.autoretry"].apply_async(("KeyError",), queue="semantics")
    dead = dead_letter_of(amqp_channel, "semantics", result.id)
    headers = dead.properties["application_headers"]
    assert headers["x-ojs-attempt"] == 1
    assert headers.get("x-ojs-error-code", "NON_RETRYABLE_ERROR") == "NON_RETRYABLE_ERROR"
    time.sleep(0.5)
    assert app.calls.count(result.id) == 1


def test_ojs_retry_semantics_retry_a_task_without_options_three_times(
        broker_url: str, tmp_path: Path, amqp_channel: amqp.Channel) -> None:
    """``ojs_retry_semantics="ojs"`` on producer and worker: the OJS default policy."""
    client = make_app("semantics-ojs-client", broker_url, None, ojs_retry_semantics="ojs")
    log = tmp_path / "worker.log"
    with launch_worker(broker_url, "integration.cliapp", "semantics-ojs",
                       hostname="semantics-ojs@%h", log=log,
                       env={"OJS_TEST_RETRY_SEMANTICS": "ojs"}):
        result = client.tasks["semantics.no_options"].apply_async(queue="semantics-ojs")
        dead = dead_letter_of(amqp_channel, "semantics-ojs", result.id, timeout=60)
        assert dead.properties["application_headers"]["x-ojs-attempt"] == 3, log.read_text()
        assert "retry" not in body_of(dead)  # the OJS default policy is implied
        received = f"Task semantics.no_options[{result.id}] received"
        wait_until(lambda: log.read_text().count(received) == 3, timeout=10,
                   what="three runs in the worker's log")


def test_a_caller_waiting_on_an_expired_job_is_told(app: Celery, worker: Any,
                                                     amqp_channel: amqp.Channel) -> None:
    """Dead-lettered as EXPIRED when it arrives too late (the transport, before Celery
    sees it), and stored as Celery's REVOKED, as Celery stores an expired task: get()
    raises instead of waiting for a result that never comes."""
    from datetime import UTC, datetime, timedelta

    from celery.exceptions import TaskRevokedError

    result = app.tasks["email.send"].apply_async(
        ("late@example.com", "x"), queue="retries", countdown=1,
        expires=datetime.now(UTC) + timedelta(seconds=0.3))
    with pytest.raises(TaskRevokedError):
        result.get(timeout=30)
    assert result.state == "REVOKED"
    from ojs_kombu.celery.dead_letters import dead_letter_queue

    with dead_letter_queue(app, "retries") as dlq:  # kept, never lost
        # the broker dead-letters it after the nack, which may come after REVOKED is stored
        wait_until(lambda: any(d.job_id == result.id for d in dlq.list()), 20,
                   "the expired job's dead letter")
        assert dlq.get(result.id).job_type == "email.send"
    assert app.calls.count(result.id) == 0
