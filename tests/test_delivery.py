"""A consumed job, and how Celery's ``reject``/``requeue`` of it becomes an OJS outcome
on its channel: never an immediate requeue (no broker)."""

from __future__ import annotations

import logging
from typing import Any

import amqp
import pytest
from amqp.exceptions import RecoverableConnectionError
from kombu.exceptions import MessageStateError

from ojs_kombu.amqp.consuming.delivery import JobMessage
from ojs_kombu.amqp.job_channel import JobDelivery
from ojs_kombu.spec.failures import HANDLER_ERROR, Action, JobFailure, Outcome

JOB_ID = "0190b5a8-1234-7abc-8def-0123456789ab"
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"
RETRY = Outcome(Action.RETRY, JobFailure(HANDLER_ERROR, "TimeoutError", "SMTP timeout"), 2.0)


class Lost(ConnectionError):
    """The connection went while settling."""


class SettlingConnection:
    connection_errors = (Lost,)


class SettlingChannel:
    """The ``ojs://`` channel a job was delivered on: what was settled, what was nacked."""

    def __init__(self, fails_with: BaseException | None = None) -> None:
        self.connection: SettlingConnection | None = SettlingConnection()
        self.settled: list[tuple[JobDelivery, int, Outcome]] = []
        self.nacked: list[tuple[int, bool, bool]] = []
        self.fails_with = fails_with

    def settle_job(self, delivery: JobDelivery, delivery_tag: int, outcome: Outcome) -> None:
        if self.fails_with is not None:
            raise self.fails_with
        self.settled.append((delivery, delivery_tag, outcome))

    def basic_nack(self, delivery_tag: int, multiple: bool = False, requeue: bool = False
                   ) -> None:
        self.nacked.append((delivery_tag, multiple, requeue))


def delivery(**headers: Any) -> JobDelivery:
    properties = {"type": "email.send", "message_id": JOB_ID, "application_headers": headers}
    return JobDelivery("email", JOB_ID, b"{}", properties)


def job_message(channel: SettlingChannel, outcome: Outcome | None = None,
                tag: int = 7) -> JobMessage:
    raw = amqp.Message(b"{}", message_id=JOB_ID, content_type="application/json")
    raw.delivery_info = {"delivery_tag": tag, "exchange": "ojs.exchange.direct",
                         "routing_key": "email", "redelivered": False}
    message = JobMessage(raw, channel=channel)
    message.ojs = delivery(**{"x-ojs-attempt": 2})
    if outcome is not None:
        message.ojs_outcome = outcome
    return message


@pytest.mark.parametrize("attempt, expected", [(3, 3), (1, 1), (None, 1), (0, 1), (-2, 1),
                                               ("3", 1), (True, 1)])
def test_the_attempt_is_x_ojs_attempt_when_it_is_a_positive_integer(attempt: Any,
                                                                      expected: int) -> None:
    headers = {} if attempt is None else {"x-ojs-attempt": attempt}
    assert delivery(**headers).attempt == expected


def test_the_job_type_is_the_type_property_unless_given() -> None:
    assert delivery().job_type == "email.send"
    given = JobDelivery("email", JOB_ID, b"{}", {"type": "email.send"}, job_type="mail.bulk")
    assert given.job_type == "mail.bulk"
    assert JobDelivery("email", JOB_ID, b"{}", {}).job_type == ""


def test_the_delivery_keeps_the_job_as_it_came_off_the_wire() -> None:
    job = delivery(**{"x-ojs-attempt": 2, "x-custom": "kept"})
    job.headers["x-custom"] = "changed"  # a copy: a retry republishes the original
    assert job.headers == {"x-ojs-attempt": 2, "x-custom": "kept"}
    assert (job.queue, job.job_id, job.body) == ("email", JOB_ID, b"{}")
    assert job.properties["message_id"] == JOB_ID


def test_its_lifecycle_events_describe_the_job_and_its_trace() -> None:
    info = delivery(**{"x-ojs-attempt": 4, "x-ojs-trace-id": TRACEPARENT}).info()
    assert (info.job_id, info.job_type, info.queue, info.attempt, info.trace_id) == (
        JOB_ID, "email.send", "email", 4, TRACE_ID)
    assert delivery().info().trace_id is None


def test_a_reject_carries_out_the_outcome_the_worker_decided() -> None:
    channel = SettlingChannel()
    message = job_message(channel, RETRY, tag=7)
    message.reject()
    [(settled, tag, outcome)] = channel.settled
    assert (settled.job_id, tag, outcome) == (JOB_ID, 7, RETRY)
    assert message.acknowledged and channel.nacked == []


def test_a_reject_without_a_decision_dead_letters_the_job() -> None:
    channel = SettlingChannel()
    job_message(channel).reject()
    [(_, _, outcome)] = channel.settled
    assert outcome.action is Action.DEAD_LETTER
    assert outcome.failure == JobFailure(HANDLER_ERROR, "Rejected", "rejected by Celery")


@pytest.mark.parametrize("requeue", [lambda m: m.requeue(), lambda m: m.reject(requeue=True)])
def test_a_requeue_dead_letters_the_job_instead_and_says_so(
        requeue: Any, caplog: pytest.LogCaptureFixture) -> None:
    channel = SettlingChannel()
    with caplog.at_level(logging.WARNING, logger="ojs_kombu"):
        requeue(job_message(channel))
    [(_, _, outcome)] = channel.settled
    assert outcome.action is Action.DEAD_LETTER
    assert outcome.failure.message == "requeue requested"
    assert JOB_ID in caplog.text and "never requeued" in caplog.text


def test_a_job_is_settled_once() -> None:
    channel = SettlingChannel()
    message = job_message(channel, RETRY)
    message.reject()
    with pytest.raises(MessageStateError):
        message.reject()
    assert len(channel.settled) == 1


def test_on_a_lost_connection_nothing_is_settled_and_the_broker_redelivers() -> None:
    channel = SettlingChannel()
    channel.connection = None
    message = job_message(channel, RETRY)
    with pytest.raises(RecoverableConnectionError):
        message.reject()
    assert channel.settled == [] and channel.nacked == [] and not message.acknowledged


def test_a_connection_error_while_settling_is_raised_to_celery() -> None:
    channel = SettlingChannel(fails_with=Lost("reset by peer"))
    with pytest.raises(Lost):
        job_message(channel, RETRY).reject()
    assert channel.nacked == []


def test_an_outcome_that_cannot_be_carried_out_nacks_the_job_into_its_dlq(
        caplog: pytest.LogCaptureFixture) -> None:
    channel = SettlingChannel(fails_with=ValueError("no retry queue"))
    message = job_message(channel, RETRY, tag=9)
    with caplog.at_level(logging.ERROR, logger="ojs_kombu"):
        message.reject()
    assert channel.nacked == [(9, False, False)] and message.acknowledged
    assert f"job {JOB_ID}: could not retry it" in caplog.text
