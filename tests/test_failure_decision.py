"""The one failure decision, as a table: what happened x attempt x policy -> outcome."""

from __future__ import annotations

import pytest

from ojs_kombu.spec.failures import (
    EXPIRED,
    HANDLER_ERROR,
    HANDLER_TIMEOUT,
    NON_RETRYABLE_ERROR,
    Action,
    Delivered,
    Happened,
    JobFailure,
    decide,
)
from ojs_kombu.spec.retry import Backoff, policy_from

BOOM = JobFailure(HANDLER_ERROR, "RuntimeError", "boom")
BAD = JobFailure("UNKNOWN_JOB_TYPE", "UNKNOWN_JOB_TYPE", "no task handles type 'x.y'")
GONE = JobFailure(EXPIRED, EXPIRED, "expired")


def doubling(attempt: int) -> float:
    return 2.0 ** (attempt - 1)


H = Happened
A = Action

# (what happened, retryable, requested delay, attempt, max_attempts)
#   -> (action, error code, delay, invalid input)
TABLE = [
    # a failed attempt with attempts left is retried after the policy's backoff
    ((H.HANDLER_ERROR, BOOM, True, None), 1, 3, (A.RETRY, HANDLER_ERROR, 1.0, False)),
    ((H.HANDLER_ERROR, BOOM, True, None), 2, 3, (A.RETRY, HANDLER_ERROR, 2.0, False)),
    # ... and dead-lettered once they are used up
    ((H.HANDLER_ERROR, BOOM, True, None), 3, 3, (A.DEAD_LETTER, HANDLER_ERROR, 0.0, False)),
    # a job that may run once (Celery's semantics without autoretry) is never retried
    ((H.HANDLER_ERROR, BOOM, True, None), 1, 1, (A.DEAD_LETTER, HANDLER_ERROR, 0.0, False)),
    # an error the job's rules do not retry goes straight to the DLQ, said so
    ((H.HANDLER_ERROR, BOOM, False, None), 1, 3,
     (A.DEAD_LETTER, NON_RETRYABLE_ERROR, 0.0, False)),
    # a hard time limit is a failed attempt with its own code
    ((H.TIME_LIMIT, None, True, None), 1, 3, (A.RETRY, HANDLER_TIMEOUT, 1.0, False)),
    ((H.TIME_LIMIT, None, True, None), 3, 3, (A.DEAD_LETTER, HANDLER_TIMEOUT, 0.0, False)),
    ((H.TIME_LIMIT, None, False, None), 1, 3, (A.DEAD_LETTER, HANDLER_TIMEOUT, 0.0, False)),
    ((H.WORKER_LOST, BOOM, False, None), 1, 3, (A.DEAD_LETTER, HANDLER_ERROR, 0.0, False)),
    # a lost pool process too
    ((H.WORKER_LOST, BOOM, True, None), 1, 2, (A.RETRY, HANDLER_ERROR, 1.0, False)),
    ((H.WORKER_LOST, BOOM, True, None), 2, 2, (A.DEAD_LETTER, HANDLER_ERROR, 0.0, False)),
    # a retry the task asked for keeps its own delay (its limit was checked where asked)
    ((H.RETRY_REQUESTED, BOOM, True, 7.5), 1, 3, (A.RETRY, HANDLER_ERROR, 7.5, False)),
    ((H.RETRY_REQUESTED, BOOM, True, None), 2, 3, (A.RETRY, HANDLER_ERROR, 2.0, False)),
    ((H.RETRY_REQUESTED, BOOM, True, 180.0), 5, 1, (A.RETRY, HANDLER_ERROR, 180.0, False)),
    # a failure the pool did not retry: its reason stands, whatever attempts the
    # policy would leave (self.retry(max_retries=0) used them up where it asked)
    ((H.NOT_RETRIED, BOOM, True, None), 1, 3, (A.DEAD_LETTER, HANDLER_ERROR, 0.0, False)),
    ((H.NOT_RETRIED, JobFailure(NON_RETRYABLE_ERROR, "KeyError", "'x'"), True, None), 3, 3,
     (A.DEAD_LETTER, NON_RETRYABLE_ERROR, 0.0, False)),
    ((H.NOT_RETRIED, None, True, None), 1, 3, (A.DEAD_LETTER, HANDLER_ERROR, 0.0, False)),
    # not a runnable job: dead-lettered at once, with its own code, as invalid input
    ((H.INVALID, BAD, True, None), 1, 3, (A.DEAD_LETTER, "UNKNOWN_JOB_TYPE", 0.0, True)),
    ((H.INVALID, None, True, None), 1, 3, (A.DEAD_LETTER, "INVALID_ENVELOPE", 0.0, True)),
    # expired: discarded, whatever attempts are left
    ((H.EXPIRED, GONE, True, None), 1, 3, (A.DEAD_LETTER, EXPIRED, 0.0, False)),
    ((H.EXPIRED, None, True, None), 1, 3, (A.DEAD_LETTER, EXPIRED, 0.0, False)),
    # cancelled: acked, never retried nor dead-lettered
    ((H.CANCELLED, None, True, None), 1, 3, (A.ACK, None, 0.0, False)),
    # early: back to the broker for as long as it is early
    ((H.EARLY, None, True, 42.0), 1, 3, (A.WAIT, None, 42.0, False)),
    ((H.EARLY, None, True, -1.0), 1, 3, (A.WAIT, None, 0.0, False)),
]


@pytest.mark.parametrize(("what", "attempt", "max_attempts", "expected"), TABLE)
def test_decision_table(what: tuple, attempt: int, max_attempts: int, expected: tuple) -> None:
    happened, failure, retryable, delay = what
    outcome = decide(Delivered(happened, failure, retryable, delay), attempt, max_attempts,
                     doubling)
    action, code, delay_s, invalid = expected
    assert outcome.action is action
    assert (outcome.failure.code if outcome.failure else None) == code
    assert outcome.delay_s == pytest.approx(delay_s)
    assert outcome.invalid_input is invalid


def test_the_failure_keeps_what_the_task_raised() -> None:
    failure = JobFailure(HANDLER_ERROR, "KeyError", "'x'", ("frame 1", "frame 2"))
    outcome = decide(Delivered(Happened.HANDLER_ERROR, failure, retryable=False), 1, 3,
                     doubling)
    assert outcome.failure is not None
    assert (outcome.failure.type, outcome.failure.message, outcome.failure.backtrace) == (
        "KeyError", "'x'", ("frame 1", "frame 2"))
    assert outcome.failure.code == NON_RETRYABLE_ERROR


def test_a_real_policy_backoff_drives_the_delay() -> None:
    backoff = Backoff.of(policy_from({"max_attempts": 4, "initial_interval": "PT2S",
                                      "backoff_coefficient": 3.0, "jitter": False},
                                     source="test"))
    delays = [decide(Delivered(Happened.HANDLER_ERROR, BOOM), n, backoff.max_attempts,
                     backoff.delay).delay_s for n in (1, 2, 3)]
    assert delays == [2.0, 6.0, 18.0]
    last = decide(Delivered(Happened.HANDLER_ERROR, BOOM), 4, backoff.max_attempts,
                  backoff.delay)
    assert last.action is Action.DEAD_LETTER
