"""A job's ETA, as the worker's request of it tells Celery's strategy.

Celery's strategy reads ``request.eta`` more than once per job (``if req.eta:`` then
``to_system_tz(req.eta)``, and ``req.eta and req.eta.isoformat()`` for the
``task-received`` event).  A job that falls due between two of those reads must
read the same each time: a true ETA turning ``None`` halfway stopped the worker
(``AttributeError: 'NoneType' object has no attribute 'astimezone'``).
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import amqp
from celery import Celery

import ojs_kombu
from ojs_kombu.amqp.consuming.delivery import JobMessage
from ojs_kombu.amqp.job_channel import JobDelivery
from ojs_kombu.celery.request import JobRequest
from ojs_kombu.spec.decode import CELERY_JOB_HEADER

from .test_delivery import SettlingChannel


def request_due_at(eta: datetime | None) -> JobRequest:
    """The worker's request of a Celery job due at ``eta``, as the transport hands it."""
    app = Celery("eta", set_as_current=False)
    ojs_kombu.install(app)

    @app.task(name="e.report", shared=False)
    def report() -> None:
        """A task."""

    job_id = ojs_kombu.new_job_id()
    headers: dict[str, Any] = {
        "id": job_id, "task": "e.report", "retries": 0, "lang": "py", "root_id": job_id,
        "parent_id": None, "group": None, "eta": eta and eta.isoformat(), "utc": True,
        "x-ojs-attempt": 1, CELERY_JOB_HEADER: True}
    body = json.dumps([[], {}, {"callbacks": None, "errbacks": None, "chain": None,
                                "chord": None}]).encode()
    raw = amqp.Message(body, message_id=job_id, content_type="application/json",
                       content_encoding="utf-8", application_headers=headers)
    raw.delivery_info = {"delivery_tag": 1, "exchange": "ojs.exchange.direct",
                         "routing_key": "reports", "redelivered": False}
    message = JobMessage(raw, channel=SettlingChannel())
    message.ojs = JobDelivery("reports", job_id, body, dict(raw.properties), "d")
    return JobRequest(message, app=app, task=app.tasks["e.report"], hostname="w@test")


def test_a_job_falling_due_between_reads_keeps_the_eta_read_first() -> None:
    """Read while still due, then after the due time: the same ETA both times, so
    Celery's timer holds the job the moment that is left and the worker goes on."""
    due = datetime.now(UTC) + timedelta(seconds=0.5)
    request = request_due_at(due)
    first = request.eta
    time.sleep(max(0.0, (due - datetime.now(UTC)).total_seconds()) + 0.05)
    assert first == due
    assert request.eta == first
    assert request.eta.astimezone() == due  # the strategy's second read


def test_a_job_already_due_has_no_eta_and_runs_at_once() -> None:
    """A job the broker sent back when due: no ETA for Celery's timer, on every read;
    the task still sees its due time as ``request.eta``."""
    due = datetime.now(UTC) - timedelta(seconds=1)
    request = request_due_at(due)
    assert [request.eta, request.eta] == [None, None]
    assert datetime.fromisoformat(request.request_dict["eta"]) == due


def test_a_job_without_an_eta_has_none() -> None:
    assert request_due_at(None).eta is None
