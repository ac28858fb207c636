"""The dead letters of an OJS queue: browsing leaves them in place, replay and delete
take exactly one, a replay is the job runnable again (in memory, no broker)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import amqp
import kombu
import pytest

from ojs_kombu.amqp.broker import dead_letters as dead_letters_module
from ojs_kombu.amqp.broker.dead_letters import DeadLetter, DeadLetterQueue, open_dead_letter_queue
from ojs_kombu.spec.dead_letter import NOT_RECORDED
from ojs_kombu.spec.errors import DeadLetterNotFound, JobNackedError, OJSConfigurationError
from ojs_kombu.spec.times import format_time

from .dead_jobs import (
    DLQ,
    JOB_QUEUE,
    TRACE,
    failed_attempts,
    hostile_dead_letters,
    ids_in,
    job_id,
    put_dead_job,
    put_task_id_dead_letters,
)
from .in_memory_broker import Broker


@pytest.fixture
def broker() -> Broker:
    return Broker()


@pytest.fixture
def dead_letters(broker: Broker) -> Iterator[DeadLetterQueue]:
    with open_dead_letter_queue(broker.connection(), "email") as dlq:
        yield dlq


def test_a_nacked_job_says_its_reason_is_not_on_the_message(
        broker: Broker, dead_letters: DeadLetterQueue) -> None:
    """``Basic.Nack`` (``ojs_dead_letter_mode="nack"``) cannot change the message: its
    ``x-ojs-error-*`` are the attempt before's, and the dead letter says so."""
    jid = put_dead_job(broker, 1, job_type="email.send", attempt=3)
    dead = dead_letters.get(jid)
    assert (dead.key, dead.job_id, dead.task_id, dead.job_type, dead.queue) == (
        jid, jid, jid, "email.send", "email")
    assert dead.error_code is None and dead.error_message is None
    assert dead.why.source == NOT_RECORDED  # without a result backend to read it from
    assert dead.why.earlier == {"code": "HANDLER_ERROR", "message": "SMTP timeout 2"}
    assert dead.attempt == 3 and dead.death_reason == "rejected" and dead.problems == ()
    assert dead.envelope is not None and dead.envelope["id"] == jid
    assert json.loads(dead.body) == dead.envelope


def test_a_job_the_worker_published_with_its_error_says_code_message_and_type(
        broker: Broker, dead_letters: DeadLetterQueue) -> None:
    dead = dead_letters.get(put_dead_job(broker, 1, reason=None, **{
        "x-ojs-error-message": "SMTP timeout 3"}))
    assert (dead.error_code, dead.error_type, dead.error_message) == (
        "HANDLER_ERROR", "TimeoutError", "SMTP timeout 3")
    assert dead.death_reason is None and dead.why.source == "headers"


@pytest.mark.parametrize("reason, code, says", [
    ("expired", "EXPIRED", "time to live"), ("maxlen", None, "queue was full"),
    ("delivery_limit", None, "delivery limit")])
def test_a_job_the_broker_dead_lettered_says_why(
        broker: Broker, dead_letters: DeadLetterQueue, reason: str, code: str | None,
        says: str) -> None:
    dead = dead_letters.get(put_dead_job(broker, 1, reason=reason))
    assert dead.death_reason == reason and dead.error_code == code
    assert says in (dead.error_message or "")


def test_a_job_nacked_after_its_expires_at_reads_as_expired(broker: Broker) -> None:
    expires = datetime(2026, 1, 1, 12, 0, 0, 400000, tzinfo=UTC)
    for n, died in ((1, expires.replace(microsecond=0)), (2, expires - timedelta(seconds=5))):
        envelope = {"specversion": "1.0", "id": job_id(n), "type": "email.send", "args": [],
                    "expires_at": format_time(expires)}
        broker.declare(DLQ)
        broker.put(DLQ, json.dumps(envelope), message_id=job_id(n),
                   content_type="application/openjobspec+json",
                   application_headers={"x-death": [{"reason": "rejected", "time": died}]})
    with open_dead_letter_queue(broker.connection(), "email") as dlq:
        expired, failed = dlq.list()
    assert expired.error_code == "EXPIRED" and expired.why.source == "expires_at"
    assert failed.error_code is None  # nacked before it expired: it failed


def test_a_dead_letter_is_found_by_the_callers_task_id(
        broker: Broker, dead_letters: DeadLetterQueue) -> None:
    for n, task_id in put_task_id_dead_letters(broker).items():
        assert dead_letters.get(task_id).job_id == job_id(n)
        assert dead_letters.get(job_id(n)).task_id == task_id
    assert dead_letters.replay("order-999-validate") == job_id(1)
    assert dead_letters.delete("6f1d2c6e-1b7e-4a43-9f0e-0d7a54f1c2b1").job_id == job_id(2)
    assert ids_in(broker, JOB_QUEUE) == [job_id(1)] and ids_in(broker, DLQ) == []


def test_a_message_without_properties_is_named_by_its_envelope() -> None:
    body = json.dumps({"id": job_id(7), "type": "report.build", "args": []}).encode()
    dead = DeadLetter.from_message("reports", amqp.Message(body))
    assert (dead.job_id, dead.job_type, dead.queue) == (job_id(7), "report.build", "reports")
    assert dead.key == job_id(7) and dead.problems == ("no content type",)
    assert dead.attempt is None and dead.error_code is None and dead.death_reason is None


@pytest.mark.parametrize("body", [b"\xff not json", b"[1, 2]"])
def test_a_body_that_is_no_json_object_has_no_envelope(body: bytes) -> None:
    dead = DeadLetter.from_message("email", amqp.Message(body, message_id=job_id(1)))
    assert dead.envelope is None and dead.body == body and dead.job_id == job_id(1)
    assert dead.problems


@pytest.mark.parametrize("name", sorted(hostile_dead_letters()))
def test_any_dead_letter_is_listed_found_by_its_key_replayed_and_deleted(
        broker: Broker, name: str) -> None:
    body, properties = hostile_dead_letters()[name]
    broker.declare(DLQ)
    broker.put(DLQ, body, **properties)
    put_dead_job(broker, 1)
    with open_dead_letter_queue(broker.connection(), "email") as dlq:
        dead, job = dlq.list()
        assert job.job_id == job_id(1)
        assert dlq.get(dead.key).body == body
        assert dlq.replay(dead.key) == dead.key
        [replayed] = broker.messages(JOB_QUEUE)
        if dead.problems:  # no job: back as it came
            assert replayed.body == body
        dlq.delete(job_id(1))
    assert ids_in(broker, DLQ) == []


def test_listing_is_oldest_first_and_leaves_every_dead_letter_in_place(
        broker: Broker, dead_letters: DeadLetterQueue) -> None:
    ids = [put_dead_job(broker, n) for n in range(1, 5)]
    assert [d.job_id for d in dead_letters.list()] == ids
    assert [d.job_id for d in dead_letters.list(limit=2)] == ids[:2]
    assert len(dead_letters) == 4 and ids_in(broker, DLQ) == ids


def test_an_unknown_job_id_is_not_found_and_nothing_moves(
        broker: Broker, dead_letters: DeadLetterQueue) -> None:
    ids = [put_dead_job(broker, n) for n in (1, 2)]
    for action in (dead_letters.get, dead_letters.replay, dead_letters.delete):
        with pytest.raises(DeadLetterNotFound, match=job_id(9)) as raised:
            action(job_id(9))
        assert isinstance(raised.value, LookupError)
    assert ids_in(broker, DLQ) == ids and ids_in(broker, JOB_QUEUE) == []


def test_a_replay_is_the_same_job_at_attempt_one_with_its_error_history(
        broker: Broker, dead_letters: DeadLetterQueue) -> None:
    first, second, third = (put_dead_job(broker, n) for n in (1, 2, 3))
    dead_letters.replay(second)
    assert ids_in(broker, DLQ) == [first, third]  # the others stay, in order
    [job] = broker.messages(JOB_QUEUE)
    headers = job.properties["application_headers"]
    envelope = json.loads(job.body)
    assert job.properties["message_id"] == envelope["id"] == second
    assert job.properties["type"] == "email.send"
    assert job.properties["content_type"] == "application/openjobspec+json"
    assert headers["x-ojs-attempt"] == 1 and envelope["attempt"] == 0
    assert envelope["state"] == "available" and "error" not in envelope
    assert envelope["errors"] == failed_attempts(2)
    assert headers["x-ojs-trace-id"] == TRACE
    assert not [k for k in headers if k.startswith(("x-ojs-error", "x-death", "x-first-death"))]


def test_a_dead_letter_that_is_no_job_is_replayed_as_it_came_without_its_error(
        broker: Broker, dead_letters: DeadLetterQueue) -> None:
    broker.put(DLQ, b"not json", message_id=job_id(5),
               application_headers={"x-ojs-error-code": "INVALID_PAYLOAD", "x-custom": "kept",
                                    "x-death": [{"reason": "rejected"}]})
    dead_letters.replay(job_id(5))
    [job] = broker.messages(JOB_QUEUE)
    assert job.body == b"not json"
    assert job.properties["application_headers"] == {"x-custom": "kept"}


def test_a_replay_the_broker_refuses_leaves_the_dead_letter_in_place(
        broker: Broker, dead_letters: DeadLetterQueue) -> None:
    ids = [put_dead_job(broker, n) for n in (1, 2)]
    broker.nack_publishes = True
    with pytest.raises(amqp.exceptions.MessageNacked):
        dead_letters.replay(ids[1])
    with pytest.raises(JobNackedError, match=f"job {ids[0]} .* stays in"):
        dead_letters.replay_all()
    assert ids_in(broker, DLQ) == ids and ids_in(broker, JOB_QUEUE) == []


def test_replay_all_replays_every_dead_letter_in_order_and_reports_each(
        broker: Broker, dead_letters: DeadLetterQueue) -> None:
    ids = [put_dead_job(broker, n) for n in range(1, 4)]
    progress: list[str] = []
    assert dead_letters.replay_all(progress=progress.append) == ids
    assert progress == ids
    assert ids_in(broker, JOB_QUEUE) == ids and ids_in(broker, DLQ) == []


def test_delete_removes_one_dead_letter_for_good_and_returns_it(
        broker: Broker, dead_letters: DeadLetterQueue) -> None:
    first, second, third = (put_dead_job(broker, n) for n in (1, 2, 3))
    assert dead_letters.delete(second).job_id == second
    assert ids_in(broker, DLQ) == [first, third] and ids_in(broker, JOB_QUEUE) == []


def test_purge_deletes_every_dead_letter_and_counts_them(
        broker: Broker, dead_letters: DeadLetterQueue) -> None:
    for n in range(1, 4):
        put_dead_job(broker, n)
    assert dead_letters.purge() == 3
    assert len(dead_letters) == 0 and ids_in(broker, JOB_QUEUE) == []


def test_the_queue_is_named_through_the_aliases_and_its_topology_declared(
        broker: Broker) -> None:
    with open_dead_letter_queue(broker.connection(), "celery") as dlq:
        assert (dlq.queue, dlq.dlq) == ("default", "ojs.queue.dlx.default")
        assert len(dlq) == 0  # declared: a passive declare finds it


def test_the_connection_is_released_when_done(broker: Broker) -> None:
    connection = broker.connection()
    with open_dead_letter_queue(connection, "email"):
        assert connection.connected
    assert not connection.connected


def test_a_connection_that_is_not_ojs_is_refused() -> None:
    with pytest.raises(OJSConfigurationError, match="ojs:// connection"):
        DeadLetterQueue(kombu.Connection("memory://"), "email")


def test_replay_each_goes_window_by_window_and_stops_between_windows(
        broker: Broker, dead_letters: DeadLetterQueue,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dead_letters_module, "REPLAY_WINDOW", 2)
    ids = [put_dead_job(broker, n) for n in range(1, 6)]
    seen: list[str] = []
    replayed = dead_letters.replay_each(seen.append, stop=lambda: len(seen) >= 3)
    # the second window was finished before the stop was seen: 4 jobs, none half-done
    assert replayed == 4 and seen == ids[:4]
    assert ids_in(broker, JOB_QUEUE) == ids[:4] and ids_in(broker, DLQ) == ids[4:]
    assert dead_letters.replay_each(seen.append) == 1
    assert ids_in(broker, JOB_QUEUE) == ids and ids_in(broker, DLQ) == []


def test_a_listing_without_bodies_keeps_what_each_dead_letter_says(
        broker: Broker, dead_letters: DeadLetterQueue) -> None:
    jid = put_dead_job(broker, 1, reason=None)
    [with_body] = dead_letters.list()
    [without] = dead_letters.list(bodies=False)
    assert (without.body, without.envelope) == (b"", None) and with_body.body
    assert (without.key, without.task_id, without.why, without.problems) == (
        jid, jid, with_body.why, ())
