"""``celery.chord_unlock`` naming a chord that never completes ends.

Celery's chord_unlock polls its chord's header by retrying itself, forever when
the chord sets no ``max_retries``; a job of it (Celery's own, or a producer's in
Celery's shape) polls at most ``ojs_chord_unlock_max_retries`` times, then the
chord fails and the job is dead-lettered.  Each attempt runs through Celery's
tracer as a pool runs it and is settled by the worker's request
(tests/test_one_failure_decision.py).
"""

from __future__ import annotations

import uuid
from typing import Any

from celery import Celery

import ojs_kombu
from ojs_kombu.spec.failures import Action

from .test_one_failure_decision import attempt, outcome_of


def make_app(**conf: Any) -> Celery:
    app = Celery("unlock-bound", set_as_current=False, backend="cache+memory://")
    app.conf.update(**conf)
    ojs_kombu.install(app)
    app.finalize()
    return app


def unlock_args() -> tuple[Any, ...]:
    """``(group_id, callback, interval, max_retries, result)`` of a chord whose one
    header task never runs."""
    callback = {"task": "celery.accumulate", "args": [], "kwargs": {}, "options": {},
                "subtask_type": None, "immutable": False}
    return (str(uuid.uuid4()), callback, 0.1, None, [[[str(uuid.uuid4()), None], None]])


def test_chord_unlock_polls_at_most_ojs_chord_unlock_max_retries_times() -> None:
    app = make_app(ojs_chord_unlock_max_retries=2)
    args = unlock_args()
    actions = [outcome_of(attempt(app, "celery.chord_unlock", n, args)[0]).action
               for n in (1, 2, 3)]
    assert actions == [Action.RETRY, Action.RETRY, Action.DEAD_LETTER]


def test_the_default_bound_is_an_hour_of_polls_at_celerys_interval() -> None:
    app = make_app()
    args = unlock_args()
    assert outcome_of(attempt(app, "celery.chord_unlock", 3600, args)[0]).action \
        is Action.RETRY
    assert outcome_of(attempt(app, "celery.chord_unlock", 3601, args)[0]).action \
        is Action.DEAD_LETTER


def test_a_chord_that_sets_max_retries_keeps_its_own() -> None:
    app = make_app(ojs_chord_unlock_max_retries=1)
    group_id, callback, interval, _, result = unlock_args()
    args = (group_id, callback, interval, 4, result)
    actions = [outcome_of(attempt(app, "celery.chord_unlock", n, args)[0]).action
               for n in (2, 4, 5)]
    assert actions == [Action.RETRY, Action.RETRY, Action.DEAD_LETTER]
