"""``ojs-kombu dlq list|show|replay|purge``: what they print, what they leave in the
queues and their exit codes (in memory, no broker)."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import TimeLimitExceeded
from click.testing import CliRunner, Result

import ojs_kombu
from ojs_kombu.amqp.broker import dead_letters
from ojs_kombu.cli import cli
from ojs_kombu.spec.dead_letter import NOT_RECORDED_HINT

from .dead_jobs import (
    DLQ,
    JOB_QUEUE,
    hostile_dead_letters,
    ids_in,
    job_id,
    put_dead_job,
    put_task_id_dead_letters,
)
from .in_memory_broker import Broker, BrokerOptions, Stored


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("OJS_BROKER_URL", "CELERY_BROKER_URL", "CELERY_APP", "OJS_PREFIX"):
        monkeypatch.delenv(variable, raising=False)


@pytest.fixture
def broker() -> Broker:
    return Broker()


def dlq(broker: Broker, *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, ["dlq", *args], obj=BrokerOptions(broker), input=input)


def dlq_json(broker: Broker, *args: str) -> tuple[int, Any]:
    result = dlq(broker, *args, "--json")
    return result.exit_code, json.loads(result.stdout)


def test_list_shows_each_dead_letter_oldest_first_and_leaves_them(broker: Broker) -> None:
    ids = [put_dead_job(broker, n, attempt=n + 1, reason=None,
                        **{"x-ojs-error-message": f"SMTP timeout {n + 1}"}) for n in (1, 2, 3)]
    result = dlq(broker, "list", "-q", "email", "--limit", "2")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"3 dead letter(s) in {DLQ}"
    # published by the worker with its last error: code, exception type, message
    assert lines[1] == f"  {ids[0]}  email.send  attempt 2  HANDLER_ERROR  TimeoutError: " \
                       "SMTP timeout 2"
    assert lines[2].split()[0] == ids[1] and lines[3] == "  ... 1 more (--limit)"
    assert ids_in(broker, DLQ) == ids


def test_list_shows_the_task_id_and_says_why_a_nacked_or_expired_job_died(
        broker: Broker) -> None:
    nacked = put_dead_job(broker, 1, attempt=1, **{"x-ojs-error-code": None,
                                                   "x-ojs-error-message": None})
    expired = put_dead_job(broker, 2, attempt=1, reason="expired")
    envelope = {"specversion": "1.0", "id": job_id(3), "type": "shop.validate", "args": [],
                "x_celery": {"id": "order-999-validate"}}
    broker.put(DLQ, json.dumps(envelope), message_id=job_id(3),
               content_type="application/openjobspec+json",
               application_headers={"x-ojs-error-code": "HANDLER_ERROR",
                                    "x-ojs-error-message": "card declined"})
    lines = dlq(broker, "list", "-q", "email").stdout.splitlines()
    # nacked, and no -A app whose result backend keeps its failure: both remedies named
    assert lines[1:3] == [f"  {nacked}  email.send  attempt 1  -",
                          f"    why: {NOT_RECORDED_HINT}"]
    assert "result backend" in NOT_RECORDED_HINT and "'republish'" in NOT_RECORDED_HINT
    assert lines[3] == (f"  {expired}  email.send  attempt 1  EXPIRED  its time to live in "
                        f"{JOB_QUEUE} ran out (x-death expired)")
    assert lines[4:] == [f"  {job_id(3)}  shop.validate  attempt -  HANDLER_ERROR  card declined",
                         "    task id: order-999-validate"]


def test_list_as_json(broker: Broker) -> None:
    jid = put_dead_job(broker, 1, attempt=3, reason=None)
    code, data = dlq_json(broker, "list", "-q", "email")
    assert code == 0
    assert (data["queue"], data["dead_letter_queue"], data["count"]) == ("email", DLQ, 1)
    assert data["dead_letters"] == [{
        "key": jid, "job_id": jid, "task_id": jid, "type": "email.send", "queue": "email",
        "attempt": 3, "error_code": "HANDLER_ERROR", "error_message": "SMTP timeout 2",
        "error_type": "TimeoutError", "error_source": "headers", "why": None,
        "earlier_error": None, "death_reason": None, "problems": []}]


@pytest.mark.parametrize("command", [["list"], ["show", job_id(1)], ["replay", "--all"],
                                     ["purge", "--yes"]])
def test_a_queue_without_a_dlq_exits_4_and_declares_nothing(broker: Broker,
                                                           command: list[str]) -> None:
    result = dlq(broker, *command, "-q", "email")
    assert result.exit_code == 4, result.output
    assert f"unknown queue: '{DLQ}' does not exist" in result.stderr
    code, error = dlq_json(broker, *command, "-q", "email")
    assert (code, error["error"], error["exit_code"]) == (4, "not_found", 4)
    assert broker.queues == {}


def test_show_prints_why_the_ids_the_headers_and_envelope(broker: Broker) -> None:
    jid = put_dead_job(broker, 1, attempt=3, reason=None)
    result = dlq(broker, "show", "-q", "email", jid)
    assert result.exit_code == 0, result.output
    out = result.stdout
    for line in (f"key: {jid}", f"job_id: {jid}", f"task_id: {jid}", "type: email.send",
                 "attempt: 3", "error_code: HANDLER_ERROR", "error_type: TimeoutError",
                 "error_message: SMTP timeout 2", "death_reason: -", "  x-ojs-attempt: 3"):
        assert line in out.splitlines()
    envelope = json.loads(out.split("envelope:\n", 1)[1])
    assert envelope["id"] == jid and envelope["state"] == "discarded"
    assert ids_in(broker, DLQ) == [jid]


def test_show_of_a_nacked_job_gives_the_earlier_error_apart(broker: Broker) -> None:
    jid = put_dead_job(broker, 1, attempt=3)
    out = dlq(broker, "show", "-q", "email", jid).stdout.splitlines()
    assert "error_code: -" in out and "death_reason: rejected" in out
    assert "earlier error: HANDLER_ERROR  SMTP timeout 2" in out


def test_show_as_json_has_the_headers_and_envelope(broker: Broker) -> None:
    jid = put_dead_job(broker, 1, reason=None)
    code, data = dlq_json(broker, "show", "-q", "email", jid)
    assert code == 0 and data["death_reason"] is None
    assert data["headers"]["x-ojs-error-code"] == "HANDLER_ERROR"
    assert data["envelope"]["id"] == jid and "body" not in data


def test_show_gives_the_body_of_a_dead_letter_that_is_no_json_object(broker: Broker) -> None:
    broker.declare(DLQ)
    broker.put(DLQ, b"<xml/>", message_id=job_id(4), application_headers={})
    result = dlq(broker, "show", "-q", "email", job_id(4))
    assert "body (not a JSON object the tools show):\n<xml/>" in result.stdout
    assert "not a job: the body is not JSON" in result.stdout.splitlines()
    code, data = dlq_json(broker, "show", "-q", "email", job_id(4))
    assert code == 0
    assert (data["envelope"], data["body"]) == (None, "<xml/>")
    assert data["problems"] == ["no content type", "the body is not JSON"]


def test_an_unknown_id_exits_4(broker: Broker) -> None:
    put_dead_job(broker, 1)
    for command in (["show", job_id(9)], ["replay", "order-1"], ["purge", job_id(9), "--yes"]):
        result = dlq(broker, *command, "-q", "email")
        assert result.exit_code == 4, result.output
        assert f"no dead letter with key, job id or task id {command[1]!r}" in result.stderr
    assert ids_in(broker, DLQ) == [job_id(1)]


def test_show_replay_and_purge_take_the_callers_task_id(broker: Broker) -> None:
    put_task_id_dead_letters(broker)
    code, data = dlq_json(broker, "show", "-q", "email", "order-999-validate")
    assert (code, data["job_id"], data["task_id"]) == (0, job_id(1), "order-999-validate")
    result = dlq(broker, "replay", "-q", "email", "order-999-validate")
    assert result.stdout == f"replayed {job_id(1)} to {JOB_QUEUE}\n"
    result = dlq(broker, "purge", "-q", "email", "--yes", "6f1d2c6e-1b7e-4a43-9f0e-0d7a54f1c2b1")
    assert result.exit_code == 0, result.output
    assert ids_in(broker, JOB_QUEUE) == [job_id(1)] and ids_in(broker, DLQ) == []


@pytest.mark.parametrize("name", sorted(hostile_dead_letters()))
def test_every_verb_reads_any_dead_letter_in_text_and_json(broker: Broker, name: str) -> None:
    """Deep, huge, id-less, undecodable, foreign: each is listed with why it is no job,
    shown, replayed and deleted by its key, and ``--json`` is always one JSON document."""
    body, properties = hostile_dead_letters()[name]

    def fresh() -> None:
        broker.queues.clear()
        broker.declare(DLQ)
        broker.declare(JOB_QUEUE)
        broker.put(DLQ, body, **properties)

    fresh()
    code, listed = dlq_json(broker, "list", "-q", "email")
    assert code == 0 and listed["count"] == 1
    [entry] = listed["dead_letters"]
    key = entry["key"]
    assert key == properties.get("message_id", key) or key.startswith("sha256:")
    text = dlq(broker, "list", "-q", "email")
    assert text.exit_code == 0 and key in text.stdout, text.output
    for json_out in (False, True):
        fresh()
        shown = dlq(broker, "show", "-q", "email", key, *(["--json"] if json_out else []))
        assert shown.exit_code == 0, shown.output
        if json_out:
            assert json.loads(shown.stdout)["key"] == key
        for command, args in (("replay", [key]), ("purge", [key, "--yes"]),
                              ("replay", ["--all"])):
            fresh()
            result = dlq(broker, command, "-q", "email", *args,
                         *(["--json"] if json_out else []))
            assert result.exit_code == 0, (command, result.output)
            if json_out:
                json.loads(result.stdout)
            assert broker.messages(DLQ) == []
            if command == "replay":
                assert [m.body for m in broker.messages(JOB_QUEUE)] == [body]  or \
                    entry["problems"] == []


def test_replay_puts_one_job_back_on_its_queue(broker: Broker) -> None:
    ids = [put_dead_job(broker, n) for n in (1, 2)]
    result = dlq(broker, "replay", "-q", "email", ids[1])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"replayed {ids[1]} to {JOB_QUEUE}\n"
    assert ids_in(broker, JOB_QUEUE) == [ids[1]] and ids_in(broker, DLQ) == [ids[0]]
    [job] = broker.messages(JOB_QUEUE)
    assert job.properties["application_headers"]["x-ojs-attempt"] == 1


def test_replay_all_replays_in_order_with_the_progress_on_stderr(broker: Broker) -> None:
    ids = [put_dead_job(broker, n) for n in (1, 2, 3)]
    code, data = dlq_json(broker, "replay", "-q", "email", "--all")
    assert (code, data) == (0, {"queue": "email", "replayed": ids})
    assert ids_in(broker, JOB_QUEUE) == ids and ids_in(broker, DLQ) == []
    put_dead_job(broker, 4)
    result = dlq(broker, "replay", "-q", "email", "--all")
    assert result.stdout == f"replayed 1 job(s) to {JOB_QUEUE}\n"
    assert "replaying 1 job(s)" in result.stderr


def test_ctrl_c_stops_a_replay_between_windows_and_loses_none(
        broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dead_letters, "REPLAY_WINDOW", 1)  # a window of one job
    ids = [put_dead_job(broker, n) for n in (1, 2, 3)]

    def interrupt(stored: Stored) -> None:
        broker.after_publish = None
        os.kill(os.getpid(), signal.SIGINT)

    broker.after_publish = interrupt
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        result = dlq(broker, "replay", "-q", "email", "--all", "--json")
        after = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, before)
    assert result.exit_code == 130, result.output
    assert json.loads(result.stdout) == {"queue": "email", "replayed": ids[:1],
                                         "interrupted": True}
    assert f"interrupted after 1 of 3; the others are still in {DLQ}" in result.stderr
    assert ids_in(broker, JOB_QUEUE) == ids[:1] and ids_in(broker, DLQ) == ids[1:]
    assert after is signal.default_int_handler


def test_a_script_replaying_then_purging_with_yes_replays_first(broker: Broker) -> None:
    """``dlq replay ... --yes`` (the flags a rollback script gives purge too) replays: it
    never asks, and the purge after it finds nothing left to lose."""
    ids = [put_dead_job(broker, n) for n in (1, 2)]
    replayed = dlq(broker, "replay", "-q", "email", "--all", "--yes")
    assert replayed.exit_code == 0, replayed.output
    assert ids_in(broker, JOB_QUEUE) == ids and ids_in(broker, DLQ) == []
    purged = dlq(broker, "purge", "-q", "email", "--all", "--yes")
    assert purged.exit_code == 0, purged.output
    assert purged.stdout == f"deleted 0 dead letter(s) from {DLQ}\n"
    assert ids_in(broker, JOB_QUEUE) == ids


def test_purge_with_yes_deletes_every_dead_letter(broker: Broker) -> None:
    for n in (1, 2, 3):
        put_dead_job(broker, n)
    result = dlq(broker, "purge", "-q", "email", "--yes")
    assert result.exit_code == 0, result.output
    assert result.stdout == f"deleted 3 dead letter(s) from {DLQ}\n"
    assert ids_in(broker, DLQ) == [] and ids_in(broker, JOB_QUEUE) == []


def test_purge_of_one_job_id_deletes_that_one(broker: Broker) -> None:
    ids = [put_dead_job(broker, n) for n in (1, 2, 3)]
    code, data = dlq_json(broker, "purge", "-q", "email", ids[1], "--yes")
    assert (code, data) == (0, {"queue": "email", "deleted": 1})
    assert ids_in(broker, DLQ) == [ids[0], ids[2]]


def test_purge_asks_first_and_a_no_deletes_nothing(broker: Broker) -> None:
    ids = [put_dead_job(broker, n) for n in (1, 2)]
    result = dlq(broker, "purge", "-q", "email", input="n\n")
    assert result.exit_code == 1
    assert f"Delete all 2 dead letter(s) of {DLQ}?" in result.stderr
    assert ids_in(broker, DLQ) == ids
    result = dlq(broker, "purge", "-q", "email", ids[0], input="y\n")
    assert result.exit_code == 0 and f"Delete dead letter {ids[0]} of {DLQ}?" in result.stderr
    assert ids_in(broker, DLQ) == ids[1:]


def test_the_queue_goes_through_the_aliases(broker: Broker) -> None:
    broker.declare("ojs.queue.dlx.default")
    code, data = dlq_json(broker, "list", "-q", "celery")
    assert (code, data["queue"], data["dead_letter_queue"]) == (0, "default",
                                                                "ojs.queue.dlx.default")


def test_an_unroutable_dead_letter_with_no_usable_queue_is_listed_and_refused_a_replay(
        broker: Broker) -> None:
    """``--queue unroutable`` replays each dead letter to its own queue: one whose queue
    is no OJS queue name is listed and shown with why, and its replay exits 2 with the
    reason (as one JSON document with ``--json``), leaving it in place."""
    unroutable = "ojs.queue.dlx.unroutable"
    broker.declare(unroutable)
    broker.put(unroutable, b"{}", message_id="m-1", content_type="application/openjobspec+json",
               application_headers={"x-ojs-queue": "Not A Queue!"})
    code, listed = dlq_json(broker, "list", "-q", "unroutable")
    assert code == 0
    [dead] = listed["dead_letters"]
    assert dead["queue"] == "Not A Queue!"
    assert any(p.startswith("its own queue:") for p in dead["problems"])
    assert dlq(broker, "show", "-q", "unroutable", "m-1").exit_code == 0
    code, error = dlq_json(broker, "replay", "-q", "unroutable", "m-1")
    assert (code, error["error"]) == (2, "invalid_input") and "Not A Queue!" in error["message"]
    assert ids_in(broker, unroutable) == ["m-1"]


@pytest.fixture
def shop() -> Celery:
    """An installed app with a result backend and the task of ``email.send`` jobs, whose
    policy gives up at once on a ``KeyError`` and after 3 attempts otherwise."""
    app = Celery("shop", backend="cache+memory://", set_as_current=False)
    ojs_kombu.install(app)

    @app.task(name="email.send", shared=False, ojs_retry={"max_attempts": 3,
                                                          "non_retryable_errors": ["KeyError"]})
    def send(address: str) -> None:
        raise AssertionError("not run here")

    return app


def test_a_nacked_job_gets_its_failure_and_error_code_from_the_apps_result_backend(
        broker: Broker, shop: Celery) -> None:
    """``ojs_dead_letter_mode="nack"`` (the default): the dead letter does not say why;
    with ``-A`` the tools read the failure the worker stored in the app's result backend
    and name it with the code the worker's failure decision gave it."""
    non_retryable = put_dead_job(broker, 1, attempt=1)
    exhausted = put_dead_job(broker, 2, attempt=3)
    timed_out = put_dead_job(broker, 3, attempt=1)
    unknown = put_dead_job(broker, 4)
    shop.backend.mark_as_failure(non_retryable, KeyError("sku-42"))
    shop.backend.mark_as_failure(exhausted, ConnectionError("SMTP down"))
    shop.backend.mark_as_failure(timed_out, TimeLimitExceeded(5.0))
    result = CliRunner().invoke(cli, ["dlq", "list", "-q", "email", "--json"],
                                obj=BrokerOptions(broker, _app=shop))
    listed = json.loads(result.stdout)["dead_letters"]
    said = [(d["error_code"], d["error_type"], d["error_message"], d["error_source"])
            for d in listed]
    assert said == [
        ("NON_RETRYABLE_ERROR", "KeyError", "'sku-42'", "result backend"),
        ("HANDLER_ERROR", "ConnectionError", "SMTP down", "result backend"),
        ("HANDLER_TIMEOUT", "TimeLimitExceeded", "TimeLimitExceeded(5.0,)", "result backend"),
        (None, None, None, "not recorded")]
    assert listed[0]["earlier_error"]["code"] == "HANDLER_ERROR"
    assert listed[3]["job_id"] == unknown and listed[3]["why"] == NOT_RECORDED_HINT
    shown = CliRunner().invoke(cli, ["dlq", "show", "-q", "email", non_retryable],
                               obj=BrokerOptions(broker, _app=shop)).stdout.splitlines()
    assert {"error_code: NON_RETRYABLE_ERROR", "error_type: KeyError",
            "error_message: 'sku-42'"} <= set(shown)
    assert not any(line.startswith("why:") for line in shown)


def test_a_nacked_job_of_an_app_without_a_result_backend_is_not_recorded(
        broker: Broker) -> None:
    app = Celery("shop", set_as_current=False)
    ojs_kombu.install(app)
    nacked = put_dead_job(broker, 1)
    shown = CliRunner().invoke(cli, ["dlq", "show", "-q", "email", nacked],
                               obj=BrokerOptions(broker, _app=app)).stdout.splitlines()
    assert f"why: {NOT_RECORDED_HINT}" in shown and "error_code: -" in shown


def test_replay_all_puts_back_hundreds_of_mixed_dead_letters_across_windows(
        broker: Broker) -> None:
    """Good jobs among hostile dead letters, more than one replay window: every one is
    listed and replayed once, in order, none lost or doubled."""
    hostile = [case for name, case in sorted(hostile_dead_letters().items())
               if name not in ("huge", "deep, no id", "deep, with id")]
    broker.declare(DLQ)
    broker.declare(JOB_QUEUE)
    bodies = []
    for n in range(600):
        if n % 3:
            body, properties = hostile[n % len(hostile)]
            broker.put(DLQ, body, **properties)
            bodies.append(body)
        else:
            put_dead_job(broker, n + 1)
            bodies.append(None)
    code, listed = dlq_json(broker, "list", "-q", "email", "--limit", "450")
    assert (code, listed["count"], len(listed["dead_letters"])) == (0, 600, 450)
    code, replayed = dlq_json(broker, "replay", "-q", "email", "--all")
    assert code == 0 and len(replayed["replayed"]) == 600
    back = broker.messages(JOB_QUEUE)
    assert broker.messages(DLQ) == [] and len(back) == 600
    for body, message in zip(bodies, back, strict=True):
        if body is not None:
            assert message.body == body  # no job: back as it came
        else:
            assert json.loads(message.body)["state"] == "available"
