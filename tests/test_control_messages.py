from __future__ import annotations

import json

import amqp
import pytest

from ojs_kombu.amqp.broker.control import CANCEL, INFO, control_message, parse_control
from ojs_kombu.spec.job_ids import new_job_id


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
