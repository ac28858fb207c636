"""A job's ETA, as the worker's request of it tells Celery's strategy.

Celery's strategy reads ``request.eta`` more than once per job (``if req.eta:`` then
``to_system_tz(req.eta)``, and ``req.eta and req.eta.isoformat()`` for the
``task-received`` event).  A job that falls due between two of those reads must
read the same each time: a true ETA turning ``None`` halfway stopped the worker
(``AttributeError: 'NoneType' object has no attribute 'astimezone'``).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from celery import Celery

import ojs_kombu
from ojs_kombu.celery.request import JobRequest

from .test_one_failure_decision import celery_request


def eta_app() -> Celery:
    """An installed app with one task, built before any due time is set (building it
    can take longer than the moment a test leaves before the due time)."""
    app = Celery("eta", set_as_current=False)
    ojs_kombu.install(app)

    @app.task(name="e.report", shared=False)
    def report() -> None:
        """A task."""

    return app


def request_due_at(eta: datetime | None, app: Celery | None = None) -> JobRequest:
    """The worker's request of a Celery job due at ``eta``, as the transport hands it."""
    request, _, _ = celery_request(app or eta_app(), "e.report", ojs_kombu.new_job_id(),
                                   eta=eta and eta.isoformat(), utc=True)
    return request


def test_a_job_falling_due_between_reads_keeps_the_eta_read_first() -> None:
    """Read while still due, then after the due time: the same ETA both times, so
    Celery's timer holds the job the moment that is left and the worker goes on.

    A loaded machine may take longer than the moment left to build the request and
    read it (the first read is then already ``None``, which is not this case): the
    moment is doubled until the first read comes before the due time."""
    app = eta_app()
    for lead in (0.25, 0.5, 1.0, 2.0, 4.0, 8.0):
        due = datetime.now(UTC) + timedelta(seconds=lead)
        request = request_due_at(due, app)
        first = request.eta
        if first is not None:
            break
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
