from __future__ import annotations

import json
from typing import Any

import amqp
import pytest

from ojs_kombu.amqp.broker.control import (
    CANCEL,
    INFO,
    control_message,
    parse_control,
    reply_to_problem,
)
from ojs_kombu.spec.errors import OJSConfigurationError
from ojs_kombu.spec.job_ids import new_job_id
from ojs_kombu.spec.settings import OJSSettings


def test_control_messages_round_trip() -> None:
    job_id = new_job_id()
    message = control_message(CANCEL, {"job_id": job_id, "reason": "x"})
    assert message.properties["type"] == "ojs.control.cancel"
    assert message.properties["delivery_mode"] == 2
    assert parse_control(message) == (CANCEL, {"job_id": job_id, "reason": "x"})


@pytest.mark.parametrize("body, kind, problem", [
    (b"{}", "ojs.control.pause", "unknown control message type"),
    (b"not json", CANCEL, "not JSON"),
    (b"[1]", CANCEL, "job_id"),
    (json.dumps({"job_id": 5}).encode(), INFO, "job_id"),
    (json.dumps({"job_id": ""}).encode(), CANCEL, "neither a job id nor a task id"),
    (json.dumps({"job_id": "a\nb"}).encode(), INFO, "neither a job id nor a task id"),
])
def test_bad_control_messages_are_named(body: bytes, kind: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_control(amqp.Message(body, type=kind))


@pytest.mark.parametrize("reply_to", [
    "amq.rabbitmq.reply-to.g1h2AA1yZXBseUA5MjQ4ODg0AAAYfwAAAAJrFPYS.LV9lf+hSEcb4lWoPWyRG+w==",
    "amq.gen-JzTY20BRgKO-HjmUJj0wLg",
])
def test_a_reply_queue_of_the_requesters_own_passes(reply_to: str) -> None:
    assert reply_to_problem(reply_to) is None


@pytest.mark.parametrize("reply_to", [
    None, "", "ojs.queue.billing", "ojs.queue.dlx.billing", "ojs.queue.control.billing",
    "shared-replies", "amq.rabbitmq.reply-to", "amq.rabbitmq.reply-to.", "amq.gen-",
    "amq.direct",
])
def test_any_other_reply_to_is_refused_with_why(reply_to: str | None) -> None:
    problem = reply_to_problem(reply_to)
    assert problem is not None and ("reply queue of the requester's own" in problem
                                    or "no reply_to" in problem)


@pytest.mark.parametrize("setting, queue, users", [
    ([], "billing", set()),
    (["ops"], "billing", {"ops"}),
    ({"*": ["ops"], "billing": ["biller"]}, "billing", {"ops", "biller"}),
    ({"*": ["ops"], "billing": ["biller"]}, "email", {"ops"}),
    ({"billing": ["biller"]}, "email", set()),
])
def test_control_users_per_queue(setting: Any, queue: str, users: set[str]) -> None:
    settings = OJSSettings.from_options({"ojs_control_users": setting}, source="test")
    assert settings.control_users_of(queue) == users


def test_control_users_name_ojs_queues() -> None:
    with pytest.raises(OJSConfigurationError, match="Not A Queue"):
        OJSSettings.from_options({"ojs_control_users": {"Not A Queue": ["x"]}}, source="t")
