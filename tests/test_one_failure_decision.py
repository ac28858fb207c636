"""Each failed attempt is decided once, in the worker's main process.

The task runs through Celery's own tracer as a pool runs it, its report crosses
the process boundary pickled (as a prefork pool sends it), and the worker's
request of the job settles it: what a user sees per failed attempt is one outcome
handed to the broker, one ``job.failed`` and one ``job.retrying`` or
``job.discarded``, and the result backend's ``RETRY`` or ``FAILURE``.  A verdict the
pool had to reach for Celery (``self.retry()`` out of retries) stands: the worker
never judges the job's policy again.
"""

from __future__ import annotations

import json
import pickle
from typing import Any

import amqp
import pytest
from celery import Celery
from celery.app.trace import build_tracer

import ojs_kombu
from ojs_kombu.amqp.consuming.delivery import JobMessage
from ojs_kombu.amqp.job_channel import JobDelivery
from ojs_kombu.celery.request import JobRequest
from ojs_kombu.spec.decode import CELERY_JOB_HEADER
from ojs_kombu.spec.failures import HANDLER_ERROR, NON_RETRYABLE_ERROR, Action

from .test_delivery import SettlingChannel

FAST = {"initial_interval": "PT0.1S", "jitter": False}


def make_app(semantics: str = "celery") -> tuple[Celery, list[Any]]:
    events: list[Any] = []
    app = Celery("decide-once", set_as_current=False, backend="cache+memory://")
    app.conf.update(ojs_retry_semantics=semantics, ojs_event_sinks=[events.append])
    ojs_kombu.install(app)

    @app.task(name="d.plain", bind=True, shared=False)
    def plain(self: Any) -> None:
        raise RuntimeError("sent one email, then failed")

    @app.task(name="d.autoretry", bind=True, shared=False, autoretry_for=(ValueError,),
              max_retries=2, default_retry_delay=0.1)
    def autoretry(self: Any, error: str) -> None:
        raise {"ValueError": ValueError, "KeyError": KeyError}[error](error)

    @app.task(name="d.gives_up", bind=True, shared=False, ojs_retry=FAST)
    def gives_up(self: Any) -> None:
        # the job's policy leaves 3 attempts; the task allows itself no retry
        raise self.retry(exc=TimeoutError("upstream busy"), max_retries=0)

    @app.task(name="d.stops_early", bind=True, shared=False, autoretry_for=(ValueError,),
              max_retries=2)
    def stops_early(self: Any) -> None:
        raise self.retry(exc=KeyError("no retry for this one"), max_retries=0)

    @app.task(name="d.explicit", bind=True, shared=False, max_retries=1)
    def explicit(self: Any) -> None:
        raise self.retry(countdown=0.2)

    @app.task(name="d.policy", bind=True, shared=False,
              ojs_retry={**FAST, "non_retryable_errors": ["KeyError"]})
    def policy(self: Any, error: str) -> None:
        raise {"ValueError": ValueError, "KeyError": KeyError}[error](error)

    return app, events


def celery_request(app: Celery, name: str, job_id: str, args: tuple[Any, ...] = (),
                   attempt_no: int = 1, **headers: Any
                   ) -> tuple[JobRequest, SettlingChannel, amqp.Message]:
    """The worker's request of a Celery job of task ``name`` (Celery headers plus
    ``headers``), as the transport hands it, settling on a :class:`SettlingChannel`."""
    headers = {"id": job_id, "task": name, "retries": attempt_no - 1, "lang": "py",
               "root_id": job_id, "parent_id": None, "group": None,
               "x-ojs-attempt": attempt_no, CELERY_JOB_HEADER: True, **headers}
    body = json.dumps([list(args), {}, {"callbacks": None, "errbacks": None,
                                        "chain": None, "chord": None}]).encode()
    raw = amqp.Message(body, message_id=job_id, content_type="application/json",
                       content_encoding="utf-8", application_headers=headers)
    raw.delivery_info = {"delivery_tag": attempt_no, "exchange": "ojs.exchange.direct",
                         "routing_key": "jobs", "redelivered": False}
    channel = SettlingChannel()
    message = JobMessage(raw, channel=channel)
    message.ojs = JobDelivery("jobs", job_id, body, dict(raw.properties), "d")
    request = JobRequest(message, app=app, task=app.tasks[name], hostname="w@test",
                         on_reject=message.reject_log_error)
    return request, channel, raw


def attempt(app: Celery, name: str, attempt_no: int, args: tuple[Any, ...] = (),
            job_id: str = "") -> tuple[SettlingChannel, str]:
    """One attempt of a job of task ``name``: run in the pool, settled by its request."""
    job_id = job_id or ojs_kombu.new_job_id()
    request, channel, raw = celery_request(app, name, job_id, args, attempt_no)
    headers = raw.properties["application_headers"]
    # The pool: Celery's tracer records the attempt, and the report is pickled.
    tracer = build_tracer(name, app.tasks[name], app=app, eager=False, propagate=False)
    retval = tracer(job_id, list(args), {}, {**headers, "delivery_info": raw.delivery_info,
                                              "hostname": "w@test", "is_eager": False})[0]
    report = pickle.loads(pickle.dumps(retval))
    # The worker's main process.
    request.on_success((True, report, 0.01))
    return channel, job_id


def seen(events: list[Any], job_id: str) -> list[str]:
    return [e.type for e in events if e.subject == job_id and e.type != "job.started"]


def outcome_of(channel: SettlingChannel) -> Any:
    assert len(channel.settled) == 1, channel.settled  # one outcome per attempt
    return channel.settled[0][2]


def test_a_failure_not_retried_is_decided_once() -> None:
    app, events = make_app()
    channel, job_id = attempt(app, "d.plain", 1)
    outcome = outcome_of(channel)
    assert (outcome.action, outcome.failure.code) == (Action.DEAD_LETTER, HANDLER_ERROR)
    assert seen(events, job_id) == ["job.failed", "job.discarded"]
    assert app.AsyncResult(job_id).state == "FAILURE"


def test_every_attempt_of_an_autoretried_job_is_decided_once() -> None:
    app, events = make_app()
    job_id = ojs_kombu.new_job_id()
    actions = []
    for n in (1, 2, 3):
        channel, _ = attempt(app, "d.autoretry", n, ("ValueError",), job_id)
        outcome = outcome_of(channel)
        actions.append((outcome.action, outcome.failure.code))
        assert app.AsyncResult(job_id).state == ("RETRY" if n < 3 else "FAILURE")
    assert actions == [(Action.RETRY, HANDLER_ERROR)] * 2 + [(Action.DEAD_LETTER,
                                                             HANDLER_ERROR)]
    assert seen(events, job_id) == ["job.failed", "job.retrying"] * 2 + [
        "job.failed", "job.discarded"]


def test_an_exception_autoretry_for_does_not_name_is_non_retryable() -> None:
    app, events = make_app()
    channel, job_id = attempt(app, "d.autoretry", 1, ("KeyError",))
    outcome = outcome_of(channel)
    assert (outcome.action, outcome.failure.code) == (Action.DEAD_LETTER, NON_RETRYABLE_ERROR)
    assert seen(events, job_id) == ["job.failed", "job.discarded"]


def test_self_retry_out_of_retries_keeps_the_pools_verdict() -> None:
    """``self.retry(max_retries=0)`` used the task's retries up where it asked: the
    dead letter says so, though the job's policy would leave two more attempts."""
    app, events = make_app("ojs")
    channel, job_id = attempt(app, "d.gives_up", 1)
    outcome = outcome_of(channel)
    assert (outcome.action, outcome.failure.code) == (Action.DEAD_LETTER, HANDLER_ERROR)
    assert outcome.failure.type == "TimeoutError"
    assert seen(events, job_id) == ["job.failed", "job.discarded"]
    assert app.AsyncResult(job_id).state == "FAILURE"


def test_celery_semantics_a_retry_limit_the_task_sets_is_the_verdict() -> None:
    """Out of the retries its own ``self.retry(max_retries=0)`` allowed: not a
    non-retryable error, though ``autoretry_for`` would leave two more attempts."""
    app, events = make_app()
    channel, job_id = attempt(app, "d.stops_early", 1)
    outcome = outcome_of(channel)
    assert (outcome.action, outcome.failure.code) == (Action.DEAD_LETTER, HANDLER_ERROR)
    assert outcome.failure.type == "KeyError"
    assert seen(events, job_id) == ["job.failed", "job.discarded"]


def test_celerys_max_retries_exceeded_is_raised_in_the_task_and_decided_once() -> None:
    app, events = make_app()
    job_id = ojs_kombu.new_job_id()
    first = outcome_of(attempt(app, "d.explicit", 1, job_id=job_id)[0])
    assert (first.action, first.delay_s) == (Action.RETRY, pytest.approx(0.2, abs=0.05))
    last = outcome_of(attempt(app, "d.explicit", 2, job_id=job_id)[0])
    assert (last.action, last.failure.code) == (Action.DEAD_LETTER, HANDLER_ERROR)
    assert last.failure.type == "MaxRetriesExceededError"
    assert seen(events, job_id) == ["job.failed", "job.retrying", "job.failed",
                                    "job.discarded"]


@pytest.mark.parametrize(("error", "expected"), [
    ("ValueError", (Action.RETRY, HANDLER_ERROR)),
    ("KeyError", (Action.DEAD_LETTER, NON_RETRYABLE_ERROR)),
])
def test_ojs_semantics_judge_a_failure_in_the_pool_only(error: str, expected: Any) -> None:
    app, events = make_app("ojs")
    channel, job_id = attempt(app, "d.policy", 1, (error,))
    outcome = outcome_of(channel)
    assert (outcome.action, outcome.failure.code) == expected
    assert len([t for t in seen(events, job_id) if t == "job.failed"]) == 1
    assert app.AsyncResult(job_id).state == (
        "RETRY" if expected[0] is Action.RETRY else "FAILURE")
