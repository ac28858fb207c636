"""A worker's control consumer refuses what the broker does not vouch for (no broker):
a CANCEL or INFO without ``user_id`` or from a user not authorised for the queue,
an INFO whose ``reply_to`` is not the requester's own.  Each is acked, logged once
per reason and counted; nothing is broadcast or answered but ``forbidden``."""

from __future__ import annotations

import json
import logging
from typing import Any

import amqp
import pytest
from celery import Celery

import ojs_kombu
from ojs_kombu.amqp.broker.control import CANCEL, INFO
from ojs_kombu.celery.control_queues import ControlQueues
from ojs_kombu.spec.job_ids import new_job_id

JOB = new_job_id()


class Parent:
    """What the bootstep reads of Celery's consumer."""

    def __init__(self, app: Celery) -> None:
        self.app = app


@pytest.fixture
def step(monkeypatch: pytest.MonkeyPatch) -> Any:
    app = Celery("access", broker="ojs://worker:secret@127.0.0.1:5672//", set_as_current=False)
    ojs_kombu.install(app)
    app.conf.ojs_control_users = {"billing": ["biller"]}
    broadcasts: list[tuple[str, dict[str, Any]]] = []
    answers: list[tuple[Any, ...]] = []
    monkeypatch.setattr(app.control, "broadcast",
                        lambda name, arguments, **_: broadcasts.append((name, arguments)))
    bootstep = ControlQueues(None)
    bootstep.own_user = "worker"  # what start() reads from the consumer's connection
    monkeypatch.setattr(bootstep, "answer_later", lambda *args: answers.append(args) or True)
    bootstep.app, bootstep.broadcasts, bootstep.answers = app, broadcasts, answers
    yield bootstep
    bootstep.shutdown(None)


def request(kind: str, **properties: Any) -> amqp.Message:
    return amqp.Message(json.dumps({"job_id": JOB}), type=kind, **properties)


@pytest.mark.parametrize("user", [None, "mailer"])
def test_a_cancel_from_no_user_or_an_unauthorised_one_changes_nothing(
        step: Any, user: str | None, caplog: pytest.LogCaptureFixture) -> None:
    properties = {"user_id": user} if user else {}
    with caplog.at_level(logging.DEBUG, logger="ojs_kombu.celery.control_queues"):
        for _ in range(3):
            step.handle(Parent(step.app), request(CANCEL, **properties), "billing")
    assert step.broadcasts == []
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "refused" in warnings[0].getMessage()  # once, not 3 times


@pytest.mark.parametrize("user", ["worker", "biller"])
def test_a_cancel_from_an_authorised_user_is_broadcast_for_its_queue_only(
        step: Any, user: str) -> None:
    step.handle(Parent(step.app), request(CANCEL, user_id=user), "billing")
    (name, arguments), = step.broadcasts
    assert name == "ojs_cancel" and arguments["job_id"] == JOB
    assert arguments["queue"] == "billing"


def test_the_billing_user_is_not_authorised_for_another_queue(step: Any) -> None:
    step.handle(Parent(step.app), request(CANCEL, user_id="biller"), "email")
    assert step.broadcasts == []


@pytest.mark.parametrize("reply_to", ["ojs.queue.billing", "ojs.queue.dlx.billing",
                                      "ojs.queue.control.billing", "shared", None])
def test_an_info_to_a_queue_not_the_requesters_own_is_dropped(step: Any, reply_to: Any
                                                               ) -> None:
    properties = {"reply_to": reply_to} if reply_to else {}
    step.handle(Parent(step.app), request(INFO, user_id="worker", **properties), "billing")
    assert step.answers == [] and step.broadcasts == []


def test_an_unauthorised_info_is_answered_without_the_job(step: Any) -> None:
    reply_to = "amq.rabbitmq.reply-to.abc"
    step.handle(Parent(step.app), request(INFO, user_id="mailer", reply_to=reply_to),
                "billing")
    step.handle(Parent(step.app), request(INFO, user_id="biller", reply_to=reply_to),
                "billing")
    assert [(a[1], a[2], a[4], a[5]) for a in step.answers] == [
        (JOB, reply_to, "billing", False), (JOB, reply_to, "billing", True)]
