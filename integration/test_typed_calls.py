"""An ordinary Celery app's calls, unchanged, against a real prefork worker.

Values Celery's JSON carries (dates, times, UUIDs, Decimals, bytes, NaN, a type the
app registers with kombu) as arguments, keyword arguments, nested values and results,
through chains, groups, chords and links; explicit task ids (``"report-42"``,
``str(uuid.uuid4())``) with ``AsyncResult``, ``revoke``, ``inspect query_task``,
Celery's events, and OJS CANCEL and INFO by either id.  The worker is
``celery -A integration.typedapp worker -P prefork -c 2 -E`` with a Redis result
backend, as users run it.
"""

from __future__ import annotations

import importlib
import math
import os
import threading
import time as time_module
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from types import ModuleType
from typing import Any

import amqp
import pytest
from celery import chain, chord, group
from celery.result import AsyncResult

from ojs_kombu.amqp.broker.control import ControlClient
from ojs_kombu.spec.naming import is_job_id

from .conftest import HOST, PORT, body_of, wait_until
from .test_helpers import check_job
from .workers import launch_worker

BACKEND = "redis://127.0.0.1:6379/0"
QUEUE = "typed"

VALUES: list[Any] = [
    datetime(2026, 3, 4, 5, 6, 7, 891011),
    datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC),
    datetime(2026, 3, 4, 5, 6, 7, tzinfo=timezone(timedelta(hours=5, minutes=30))),
    date(2026, 2, 28),
    time(9, 30),
    uuid.UUID("0f8fad5b-d9cb-469f-a165-70867728950e"),
    Decimal("1234.5600"),
    b"\x00\xffraw",
]


@pytest.fixture(scope="module")
def typed(broker_url: str) -> ModuleType:
    """The app module the worker runs, imported here too (its tasks, its Money type)."""
    os.environ["OJS_TEST_BROKER_URL"] = broker_url
    os.environ["OJS_TEST_BACKEND_URL"] = BACKEND
    return importlib.import_module("integration.typedapp")


@pytest.fixture(scope="module")
def typed_worker(typed: ModuleType, broker_url: str, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[Path]:
    log_path = tmp_path_factory.mktemp("typed") / "worker.log"
    with launch_worker(broker_url, "integration.typedapp", QUEUE, pool="prefork",
                       concurrency=2, log=log_path, options=["-E"], control=True,
                       env={"OJS_TEST_BACKEND_URL": BACKEND}):
        yield log_path


def test_typed_values_are_natural_json_on_the_wire(typed: ModuleType, vhost: str) -> None:
    """What another language reads: ISO 8601, UUID and decimal strings, base64; the types
    in meta.x_celery_types; a job valid against the official schema."""
    echo = typed.app.tasks["typed.echo"]
    echo.apply_async(VALUES, {"when": date(2026, 1, 1), "ratio": float("nan")},
                     queue="typed-wire")
    connection = amqp.Connection(f"{HOST}:{PORT}", virtual_host=vhost)
    connection.connect()
    try:
        channel = connection.channel()
        message = wait_until(lambda: channel.basic_get("ojs.queue.typed-wire", no_ack=True),
                             20, "the job on ojs.queue.typed-wire")
    finally:
        connection.close()
    job = body_of(message)
    check_job(job)
    assert job["args"] == ["2026-03-04T05:06:07.891011", "2026-03-04T05:06:07+00:00",
                           "2026-03-04T05:06:07+05:30", "2026-02-28", "09:30:00",
                           "0f8fad5b-d9cb-469f-a165-70867728950e", "1234.5600", "AP9yYXc="]
    assert job["x_celery"]["kwargs"] == {"when": "2026-01-01", "ratio": "NaN"}
    assert job["meta"]["x_celery_types"]["/args/3"] == "date"
    assert job["meta"]["x_celery_types"]["/x_celery/kwargs/ratio"] == "float"
    assert "__type__" not in str(message.body)


def test_arguments_kwargs_and_nested_values_arrive_as_sent(typed: ModuleType,
                                                            typed_worker: Path) -> None:
    echo = typed.app.tasks["typed.echo"]
    nested = {"order": {"id": VALUES[5], "lines": [{"price": Decimal("9.99"), "on": VALUES[3]}]}}
    money = typed.Money(Decimal("12.50"), "EUR")
    result = echo.delay(*VALUES, money, float("inf"), nested=nested, nan=float("nan"))
    got = result.get(timeout=30)
    assert got["args"][:len(VALUES)] == VALUES
    assert got["args"][len(VALUES)] == money and got["args"][-1] == math.inf
    assert got["kinds"][0] == ["datetime", "datetime", "datetime", "date", "time", "UUID",
                               "Decimal", "bytes", "Money", "float"]
    assert got["kwargs"]["nested"] == nested and math.isnan(got["kwargs"]["nan"])
    assert got["kinds"][1]["nested"] == {"order": {"id": "UUID", "lines": [
        {"price": "Decimal", "on": "date"}]}}


def test_chain_group_chord_and_link_pass_typed_results(typed: ModuleType,
                                                       typed_worker: Path) -> None:
    tasks = typed.app.tasks
    next_day, price, total, echo = (tasks[n] for n in ("typed.next_day", "typed.price",
                                                       "typed.total", "typed.echo"))
    # a date returned into a chain: each task is given a date
    assert chain(next_day.s(date(2026, 2, 27)), next_day.s(), next_day.s()
                 ).apply_async().get(timeout=30) == date(2026, 3, 2)
    assert group(price.s(c) for c in (1, 250)).apply_async().get(timeout=30) == [
        Decimal("0.01"), Decimal("2.5")]
    # a chord's body is given the header's Decimals; it returns the app's own type
    body = total.s(currency="USD")
    assert chord([price.s(100), price.s(250)])(body).get(timeout=60) == typed.Money(
        Decimal("3.5"), "USD")
    link = echo.s("linked")
    link.freeze()
    assert next_day.apply_async((date(2026, 12, 31),), link=link).get(timeout=30) == date(
        2027, 1, 1)
    linked = AsyncResult(link.id, app=typed.app).get(timeout=30)
    assert linked["args"] == [date(2027, 1, 1), "linked"]


def test_a_chord_applied_again_runs_its_body_again(typed: ModuleType, typed_worker: Path
                                                  ) -> None:
    """A frozen chord applied twice is two runs.  Celery's Redis backend clears the first
    run's done marker just before it publishes the last header task; here the first
    header task finishes before that (the producer is held after publishing it), and
    its result still counts: the body runs twice."""
    import redis
    from celery.signals import after_task_publish

    price, count = typed.app.tasks["typed.price"], typed.app.tasks["typed.count"]
    key = f"chord-runs-{uuid.uuid4().hex[:8]}"
    workflow = chord([price.s(100), price.s(250)], count.s(key))
    workflow.freeze()

    def hold_after_first_header(headers: dict[str, Any] | None = None, **_: Any) -> None:
        if (headers or {}).get("group_index") == 0:
            time_module.sleep(2)  # the worker runs the first header task meanwhile

    runs = redis.Redis.from_url(BACKEND)
    after_task_publish.connect(hold_after_first_header, weak=False)
    try:
        for expected in (1, 2):
            workflow.apply_async()
            wait_until(lambda n=expected: int(runs.get(key) or 0) >= n, 30,
                       f"the chord body's run {expected}")
    finally:
        after_task_publish.disconnect(hold_after_first_header)
        runs.delete(key)


def test_explicit_task_ids_work_as_on_plain_celery(typed: ModuleType, typed_worker: Path,
                                                    tmp_path: Path) -> None:
    app = typed.app
    echo, slow = app.tasks["typed.echo"], app.tasks["typed.slow"]
    events: list[dict[str, Any]] = []
    receivers: list[Any] = []

    def listen() -> None:
        with app.connection_for_read() as connection:
            receivers.append(app.events.Receiver(connection, handlers={"*": events.append}))
            receivers[0].capture(limit=None, timeout=60, wakeup=False)

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    try:
        wait_until(lambda: events, 20, "the worker's heartbeat (the receiver is bound)")
        _explicit_ids(app, echo, slow, events, tmp_path / "gate")
    finally:
        if receivers:
            receivers[0].should_stop = True
        listener.join(10)


def _explicit_ids(app: Any, echo: Any, slow: Any, events: list[dict[str, Any]],
                  gate: Path) -> None:
    for task_id in (f"report-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())):
        result = echo.apply_async((1,), {"day": date(2026, 1, 1)}, task_id=task_id)
        assert result.id == task_id
        assert result.get(timeout=30)["kwargs"] == {"day": date(2026, 1, 1)}
        assert AsyncResult(task_id, app=app).state == "SUCCESS"
        wait_until(lambda tid=task_id: any(e.get("uuid") == tid and e["type"] == "task-succeeded"
                                           for e in events), 20, f"task-succeeded of {task_id}")
    # inspect query_task finds a running job by its task id
    running = f"slow-{uuid.uuid4().hex[:8]}"
    slow.apply_async((60, str(gate)), task_id=running)  # runs until the test opens the gate
    # a job the worker has taken is "reserved" until its pool starts it, then "active"
    try:
        found = wait_until(lambda: [r for r in (app.control.inspect(timeout=2)
                                                .query_task(running) or {}).values()
                                    if r.get(running, [None])[0] == "active"], 20,
                           f"{running} active in inspect query_task")
    finally:
        gate.touch()
    assert found[0][running][1]["id"] == running
    assert AsyncResult(running, app=app).get(timeout=30) == "slept"
    # revoke by task id keeps the job from running
    revoked = f"revoked-{uuid.uuid4().hex[:8]}"
    app.control.revoke(revoked)
    wait_until(lambda: revoked in str(app.control.inspect(timeout=2).revoked()), 20,
               "the revoke reaching the worker")
    slow.apply_async((0,), task_id=revoked)
    wait_until(lambda: AsyncResult(revoked, app=app).state == "REVOKED", 20,
               f"{revoked} REVOKED")


def test_cancel_and_info_take_either_id(typed: ModuleType, typed_worker: Path) -> None:
    app = typed.app
    slow = app.tasks["typed.slow"]
    with ControlClient(app) as client:
        for by in ("task id", "job id"):
            task_id = f"cancel-me-{uuid.uuid4().hex[:8]}"
            slow.apply_async((60,), task_id=task_id)
            answer = wait_until(lambda tid=task_id: (a := client.info(tid, QUEUE))["state"]
                                == "active" and a, 30, f"{task_id} active")
            job_id = answer["job_id"]
            assert is_job_id(job_id) and answer["task_id"] == task_id
            assert client.info(job_id, QUEUE)["state"] == "active"
            client.cancel(task_id if by == "task id" else job_id, QUEUE, terminate=True)
            wait_until(lambda tid=task_id: AsyncResult(tid, app=app).state == "REVOKED", 30,
                       f"{task_id} REVOKED after a CANCEL by {by}")
            for asked in (task_id, job_id):
                assert wait_until(lambda a=asked: client.info(a, QUEUE)["state"] == "cancelled",
                                  20, f"INFO by {asked}")


def test_no_job_was_refused_or_given_the_wrong_type(typed_worker: Path) -> None:
    log = typed_worker.read_text(errors="replace")
    assert "TypeError: expected" not in log, log[-3000:]
    assert "INVALID_ENVELOPE" not in log and "dead-letter" not in log, log[-3000:]
