"""``ojs-kombu enqueue``, ``cancel`` and ``info``: the messages they send, their output,
option checks and exit codes (in memory, no broker)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from click.testing import CliRunner, Result

from ojs_kombu.cli import cli

from .in_memory_broker import Broker, BrokerOptions, Stored

JOB_ID = "0190b5a8-1234-7abc-8def-0123456789ab"
CONTROL = "ojs.queue.control.email"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("OJS_BROKER_URL", "CELERY_BROKER_URL", "CELERY_APP", "OJS_PREFIX"):
        monkeypatch.delenv(variable, raising=False)


@pytest.fixture
def broker() -> Broker:
    """A broker where the topology of ``email`` and ``default`` exists."""
    broker = Broker()
    connection = broker.connection().connection
    connection.ensure_topology("email")
    connection.ensure_topology("default")
    return broker


def run(broker: Broker, *args: str) -> Result:
    return CliRunner().invoke(cli, list(args), obj=BrokerOptions(broker))


def run_json(broker: Broker, *args: str) -> tuple[int, Any]:
    result = run(broker, *args, "--json")
    return result.exit_code, json.loads(result.stdout)


def published(broker: Broker) -> Stored:
    [message] = broker.published
    return message


# -- enqueue ------------------------------------------------------------------------


def test_enqueue_publishes_one_job_and_prints_its_new_id(broker: Broker) -> None:
    result = run(broker, "enqueue", "email.send", '["a@b.c", "welcome"]', "-q", "email")
    assert result.exit_code == 0, result.output
    job_id = result.stdout.strip()
    assert uuid.UUID(job_id).version == 7
    message = published(broker)
    assert (message.exchange, message.routing_key) == ("ojs.exchange.direct", "email")
    properties = message.properties
    assert (properties["message_id"], properties["type"], properties["content_type"]) == (
        job_id, "email.send", "application/openjobspec+json")
    headers = properties["application_headers"]
    assert (headers["x-ojs-queue"], headers["x-ojs-attempt"]) == ("email", 1)
    body = json.loads(message.body)
    assert (body["id"], body["type"], body["queue"], body["args"]) == (
        job_id, "email.send", "email", ["a@b.c", "welcome"])
    assert not {"priority", "meta", "retry", "scheduled_at", "x_celery"} & set(body)
    assert "priority" not in properties


def test_enqueue_carries_the_id_priority_meta_and_retry_policy(broker: Broker) -> None:
    code, data = run_json(broker, "enqueue", "report.build", "--id", JOB_ID, "-q", "email",
                          "--priority", "5", "--meta", '{"tenant": "acme"}',
                          "--retry", '{"max_attempts": 3}')
    assert (code, data) == (0, {"id": JOB_ID, "type": "report.build", "queue": "email",
                                "scheduled_at": None, "priority": 5, "delay_ms": 0})
    message = published(broker)
    body = json.loads(message.body)
    assert (body["id"], body["args"], body["priority"], body["meta"]) == (
        JOB_ID, [], 5, {"tenant": "acme"})
    assert body["retry"]["max_attempts"] == 3
    assert message.properties["priority"] == 5
    assert message.properties["application_headers"]["x-ojs-max-attempts"] == 3


def test_enqueue_with_a_delay_sets_the_eta_that_far_ahead(broker: Broker) -> None:
    before = datetime.now(UTC)
    code, data = run_json(broker, "enqueue", "email.send", "-q", "email", "--delay", "60")
    after = datetime.now(UTC)
    assert code == 0
    scheduled = json.loads(published(broker).body)["scheduled_at"]
    eta = datetime.fromisoformat(scheduled)
    assert before + timedelta(seconds=60) <= eta <= after + timedelta(seconds=60)
    assert datetime.fromisoformat(data["scheduled_at"]) == eta
    assert published(broker).properties["application_headers"]["x-ojs-scheduled-at"] \
        == scheduled
    assert 59_000 <= data["delay_ms"] <= 60_000


def test_enqueue_at_a_time_takes_a_naive_time_as_utc(broker: Broker) -> None:
    code, data = run_json(broker, "enqueue", "email.send", "-q", "email",
                          "--scheduled-at", "2099-01-02T03:04:05")
    expected = datetime(2099, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert code == 0 and datetime.fromisoformat(data["scheduled_at"]) == expected
    body = json.loads(published(broker).body)
    assert datetime.fromisoformat(body["scheduled_at"]) == expected
    broker.published.clear()
    code, data = run_json(broker, "enqueue", "email.send", "-q", "email",
                          "--scheduled-at", "2001-01-01T00:00:00Z")
    assert (code, data["delay_ms"]) == (0, 0)  # in the past: due now
    assert published(broker).routing_key == "email"


def test_enqueue_names_the_queue_through_the_aliases(broker: Broker) -> None:
    code, data = run_json(broker, "enqueue", "email.send", "-q", "celery")
    assert (code, data["queue"], published(broker).routing_key) == (0, "default", "default")


@pytest.mark.parametrize("args, fragment", [
    (["not.json!", "-q", "email"], "is not valid JSON"),
    (['{"to": "a@b.c"}'], "must be a JSON array"),
    (["[NaN]"], "NaN is not JSON"),
    (["[]", "--meta", "[1]"], "must be a JSON object"),
    (["[]", "--retry", "3"], "must be a JSON object"),
    (["[]", "--delay", "5", "--scheduled-at", "2099-01-01T00:00:00Z"],
     "give --delay or --scheduled-at, not both"),
    (["[]", "--id", "0190B5A8-1234-7ABC-8DEF-0123456789AB"], "is not a lowercase UUIDv7"),
    (["[]", "--id", str(uuid.uuid4())], "is not a lowercase UUIDv7"),
    (["[]", "--scheduled-at", "next tuesday"], "is not an ISO 8601 timestamp"),
])
def test_enqueue_refuses_bad_input_with_exit_2_and_sends_nothing(
        broker: Broker, args: list[str], fragment: str) -> None:
    result = run(broker, "enqueue", "email.send", *args)
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr
    code, error = run_json(broker, "enqueue", "email.send", *args)
    assert code == 2 and error["exit_code"] == 2 and fragment in error["message"]
    assert broker.published == []


@pytest.mark.parametrize("job_type", ["Email.Send", "email..send", "1email", "email-send"])
def test_enqueue_refuses_a_type_that_is_no_ojs_job_type(broker: Broker, job_type: str) -> None:
    opened = broker.connections_opened
    result = run(broker, "enqueue", job_type)
    assert result.exit_code == 2 and "is not an OJS job type" in result.stderr
    assert broker.published == [] and broker.connections_opened == opened  # not connected


# -- cancel -------------------------------------------------------------------------


def control_requests(broker: Broker) -> list[tuple[str, dict[str, Any]]]:
    return [(m.properties["type"], json.loads(m.body)) for m in broker.messages(CONTROL)]


def test_cancel_sends_a_cancel_request_to_the_queues_workers(broker: Broker) -> None:
    broker.consumers[CONTROL] = 2
    result = run(broker, "cancel", JOB_ID, "-q", "email", "--reason", "duplicate",
                 "--by", "user:ops", "--terminate")
    assert result.exit_code == 0, result.output
    assert result.stdout == f"cancel request for {JOB_ID} sent to {CONTROL}\n"
    assert control_requests(broker) == [("ojs.control.cancel", {
        "job_id": JOB_ID, "reason": "duplicate", "cancelled_by": "user:ops",
        "terminate": True})]
    [request] = broker.published
    assert (request.exchange, request.routing_key) == ("ojs.exchange.direct", CONTROL)


def test_cancel_without_a_worker_says_it_waits_for_one(broker: Broker) -> None:
    result = run(broker, "cancel", JOB_ID, "-q", "email")
    assert result.exit_code == 0, result.output
    assert "(no worker consumes it now: it is handled when one starts)" in result.stdout
    assert control_requests(broker) == [("ojs.control.cancel",
                                         {"job_id": JOB_ID, "terminate": False})]
    code, data = run_json(broker, "cancel", JOB_ID, "-q", "email")
    assert (code, data) == (0, {"job_id": JOB_ID, "queue": "email", "control_queue": CONTROL,
                                "sent": True, "workers": 0})


@pytest.mark.parametrize("command", ["cancel", "info"])
def test_a_queue_without_a_control_queue_exits_4_and_sends_nothing(command: str) -> None:
    broker = Broker()
    result = run(broker, command, JOB_ID, "-q", "email")
    assert result.exit_code == 4, result.output
    assert (f"unknown queue: '{CONTROL}' does not exist (OJS queue 'email' has no control "
            "queue)") in result.stderr
    assert broker.published == [] and broker.queues == {}


# -- info ---------------------------------------------------------------------------


def answering(broker: Broker, answer: dict[str, Any] | None) -> list[dict[str, Any]]:
    """A worker of ``email`` answering INFO with ``answer``; returns the requests."""
    requests: list[dict[str, Any]] = []

    def worker(kind: str, body: dict[str, Any]) -> dict[str, Any] | None:
        requests.append({"type": kind, **body})
        return None if answer is None else {"job_id": body["job_id"], **answer}

    broker.worker = worker
    return requests


def test_info_prints_the_state_a_worker_answers(broker: Broker) -> None:
    requests = answering(broker, {"state": "active", "attempt": 2, "worker": "w1@host"})
    result = run(broker, "info", JOB_ID, "-q", "email")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [f"{JOB_ID}: active", "  attempt: 2",
                                          '  worker: "w1@host"']
    assert requests == [{"type": "ojs.control.info", "job_id": JOB_ID}]
    [request] = broker.published
    assert request.properties["reply_to"] and request.properties["correlation_id"]
    code, data = run_json(broker, "info", JOB_ID, "-q", "email")
    assert (code, data) == (0, {"job_id": JOB_ID, "state": "active", "attempt": 2,
                                "worker": "w1@host"})


@pytest.mark.parametrize("answer, code, fragment", [
    ({"state": "not_found"}, 4, f"job {JOB_ID} is not found in queue 'email': no worker holds "
                                "it or finished it recently"),
    ({"state": "unknown", "reason": "no result backend"}, 4,
     f"job {JOB_ID} is unknown in queue 'email': no result backend"),
    ({"state": "error", "error": "boom"}, 1,
     f"a worker of queue 'email' could not answer INFO for {JOB_ID}: boom"),
])
def test_info_exit_codes_follow_the_answer(broker: Broker, answer: dict[str, Any], code: int,
                                           fragment: str) -> None:
    answering(broker, answer)
    result = run(broker, "info", JOB_ID, "-q", "email")
    assert result.exit_code == code, result.output
    assert fragment in result.stderr
    assert result.stdout.startswith(f"{JOB_ID}: {answer['state']}")
    exit_code, data = run_json(broker, "info", JOB_ID, "-q", "email")
    assert (exit_code, data["state"]) == (code, answer["state"])


def test_info_without_an_answer_in_time_exits_5(broker: Broker) -> None:
    answering(broker, None)
    result = run(broker, "info", JOB_ID, "-q", "email", "--timeout", "0.1")
    assert result.exit_code == 5, result.output
    assert f"no INFO answer within 0.1s for job(s) {JOB_ID}" in result.stderr
    code, error = run_json(broker, "info", JOB_ID, "-q", "email", "--timeout", "0.1")
    assert (code, error["error"]) == (5, "timeout")
