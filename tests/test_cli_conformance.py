"""Conformance table rendering, verdict bookkeeping and 406 parsing (no broker)."""

from __future__ import annotations

import pytest

from ojs_kombu.cli.broker import broker_url, parse_inequivalent
from ojs_kombu.cli.conformance_report import REQUIREMENTS, Check, Results, exit_code, render_table
from ojs_kombu.cli.events import binding_keys


def test_every_requirement_of_the_binding_is_checked() -> None:
    assert list(REQUIREMENTS) == [f"AMQP-{n:03d}" for n in range(1, 33)]


def test_unchecked_ids_are_reported_as_failed_with_a_reason() -> None:
    results = Results()
    results.set("AMQP-001", "pass", "ok")
    results.set("AMQP-001", "fail", "a later verdict does not override the first")
    checks = results.ordered()
    assert len(checks) == 32 and checks[0].status == "pass"
    assert checks[1].status == "fail" and "not checked" in checks[1].reason


def test_exit_code_fails_only_on_fail() -> None:
    assert exit_code([Check("AMQP-001", "pass", "x"), Check("AMQP-032", "warn", "x"),
                      Check("AMQP-025", "n/a", "x")]) == 0
    assert exit_code([Check("AMQP-001", "pass", "x"), Check("AMQP-004", "fail", "x")]) == 1


def test_table_has_one_row_per_id_with_status_and_wrapped_reason() -> None:
    long_reason = "ojs.queue.email has x-dead-letter-exchange None " * 4
    table = render_table([Check("AMQP-004", "fail", long_reason),
                          Check("AMQP-025", "n/a", "client-side"),
                          Check("AMQP-032", "warn", "classic queue")], width=100)
    lines = table.splitlines()
    assert lines[0].startswith("id") and "requirement" in lines[0] and "reason" in lines[0]
    row = next(line for line in lines if line.startswith("AMQP-004"))
    assert "FAIL" in row and "x-dead-letter-exchange on the job queue" in row
    assert all(len(line) <= 100 for line in lines)
    continuation = lines[lines.index(row) + 1]
    assert continuation.startswith(" ") and continuation.strip()  # the reason goes on
    assert any(line.startswith("AMQP-025  N/A") for line in lines)
    assert lines[-1] == "0 pass, 1 fail, 1 warn (SHOULD not met), 1 n/a"


@pytest.mark.parametrize("reply, parsed", [
    ("PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'q1' in vhost 'v': "
     "received none but current is the value '5' of type 'signedint'", ("x-max-length", 5)),
    ("PRECONDITION_FAILED - inequivalent arg 'x-dead-letter-exchange' for queue 'q1' in vhost "
     "'v': received the value 'dlx' of type 'longstr' but current is none",
     ("x-dead-letter-exchange", None)),
    ("PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q2' in vhost '/': "
     "received none but current is the value 'quorum' of type 'longstr'",
     ("x-queue-type", "quorum")),
    ("PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q1' in vhost 'v': "
     "received 'false' but current is 'true'", ("durable", True)),
    ("PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'e1' in vhost 'v': "
     "received 'direct' but current is 'topic'", ("type", "topic")),
    ("PRECONDITION_FAILED - something else", None),
])
def test_406_replies_give_the_current_value(reply: str, parsed: object) -> None:
    assert parse_inequivalent(reply) == parsed


def test_amqp_urls_use_the_ojs_transport() -> None:
    assert broker_url("amqp://u:p@h:5672/v") == "ojs://u:p@h:5672/v"
    assert broker_url("amqps://h//") == "ojss://h//"
    assert broker_url("ojs://h//") == "ojs://h//"


def test_event_type_patterns_become_topic_binding_keys() -> None:
    assert binding_keys(None) == ["#"]
    assert binding_keys(["job.*", "worker.started"]) == ["job.#", "worker.started"]
    assert binding_keys(["job.comp*"]) == ["#"]
