"""Celery's calling API and canvas keep working through OJS envelopes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from celery import Celery, chain, chord, group

from ojs_kombu.spec.naming import is_job_id


def test_delay_apply_async_and_send_task(app: Celery, worker: Any) -> None:
    add = app.tasks["math.add"]
    assert add.delay(2, 3).get(timeout=20) == 5  # default queue: ojs.queue.default
    assert add.apply_async((4, 5), queue="canvas").get(timeout=20) == 9
    sent = app.send_task("math.add", (6, 7), queue="canvas")
    assert is_job_id(sent.id) and sent.get(timeout=20) == 13


def test_kwargs_and_a_mapped_task_name(app: Celery, worker: Any) -> None:
    legacy = app.tasks["proj.tasks.Legacy"]  # published as OJS type legacy.run
    result = legacy.apply_async((1, [2, 3]), {"mode": "full", "nested": {"a": None}},
                                queue="canvas")
    assert result.get(timeout=20) == {"args": [1, [2, 3]],
                                      "kwargs": {"mode": "full", "nested": {"a": None}}}


def test_countdown_becomes_scheduled_at_and_is_honoured(app: Celery, worker: Any) -> None:
    before = datetime.now(UTC)
    result = app.tasks["email.send"].apply_async(("a@b.c", "later"), queue="email", countdown=2)
    call = app.calls.wait_for(result.id)
    scheduled_at = datetime.fromisoformat(call["scheduled_at"])
    assert scheduled_at >= before + timedelta(seconds=2)
    assert call["started"] >= scheduled_at  # did not start early
    assert datetime.fromisoformat(call["eta"]) == scheduled_at  # request.eta, as on Celery


def test_chain(app: Celery, worker: Any) -> None:
    add = app.tasks["math.add"]
    workflow = chain(add.s(1, 2), add.s(10), add.s(100)).set(queue="canvas")
    assert workflow.apply_async().get(timeout=30) == 113


def test_group(app: Celery, worker: Any) -> None:
    add = app.tasks["math.add"]
    result = group(add.s(i, i) for i in range(5)).set(queue="canvas").apply_async()
    assert result.get(timeout=30) == [0, 2, 4, 6, 8]


def test_chord(app: Celery, worker: Any) -> None:
    add, tsum = app.tasks["math.add"], app.tasks["math.tsum"]
    header = [add.s(i, i).set(queue="canvas") for i in range(4)]
    result = chord(header)(tsum.s().set(queue="canvas"))
    assert result.get(timeout=60) == 12


def test_errback_runs_through_the_transport(app: Celery, worker: Any) -> None:
    add = app.tasks["math.add"]
    failing = app.tasks["always.fail"].s().set(queue="errbacks")
    marker = add.si(40, 2).set(queue="canvas")
    failing.apply_async(link_error=marker)
    app.calls.wait_for(task="math.add", args=[40, 2])  # the errback ran
