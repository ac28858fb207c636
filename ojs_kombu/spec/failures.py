"""What a failed attempt does to a job message (pure).

A retry and a discard both republish the job: the envelope gains the error
(``error``, an ``errors`` entry, ``state``, ``attempt``), the headers gain
``x-ojs-error-code``/``x-ojs-error-message``, and RabbitMQ's dead-letter
bookkeeping (``x-death``, ``x-first-death-*``, ``x-last-death-*``) is dropped
so that RabbitMQ 4's dead-letter cycle detection never drops a retried job.
Every other property and header (trace context included) is kept.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from types import TracebackType
from typing import Any

from .strict_input import INVALID_ENVELOPE
from .times import format_time

HANDLER_ERROR = "HANDLER_ERROR"
HANDLER_TIMEOUT = "HANDLER_TIMEOUT"
NON_RETRYABLE_ERROR = "NON_RETRYABLE_ERROR"
EXPIRED = "EXPIRED"

#: Error-history entries kept in the envelope (the spec asks for at least 10).
MAX_ERRORS = 20
MAX_BACKTRACE_FRAMES = 50
MAX_MESSAGE = 1024
DEATH_HEADERS = ("x-death", "x-first-death-", "x-last-death-")


@dataclass(frozen=True, slots=True)
class JobFailure:
    """Why an attempt failed, in OJS terms."""

    code: str
    type: str
    message: str
    backtrace: tuple[str, ...] = ()

    @classmethod
    def from_exception(cls, exc: BaseException, code: str = HANDLER_ERROR,
                       tb: TracebackType | str | None = None) -> JobFailure:
        name = getattr(exc, "exc_cls_name", None) or type(exc).__name__  # unpickleable wrapper
        message = str(exc) or name
        if isinstance(tb, str):
            frames = tuple(line for line in tb.splitlines() if line.strip())
        elif tb is not None:
            frames = tuple(line.rstrip() for line in traceback.format_tb(tb))
        else:
            frames = ()
        return cls(code, name, message[:MAX_MESSAGE], frames[-MAX_BACKTRACE_FRAMES:])


ERROR_HEADERS = ("x-ojs-error-code", "x-ojs-error-message", "x-ojs-error-details")


def latest_death(headers: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """RabbitMQ's latest ``x-death`` entry (``x-death[0]``: the queue, ``reason`` and
    ``time`` of the last dead-lettering), else ``None``.  The latest is the one that
    says why a message is where it is now: a retried or scheduled job passed through
    TTL queues first, so its ``x-first-death-reason`` is ``expired`` whatever came after."""
    deaths = headers.get("x-death")
    if isinstance(deaths, list | tuple) and deaths and isinstance(deaths[0], Mapping):
        return deaths[0]
    return None


def without_death_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in headers.items() if not str(k).startswith(DEATH_HEADERS)}


def with_error_headers(headers: Mapping[str, Any], code: str, message: str) -> dict[str, Any]:
    """``headers`` without dead-letter bookkeeping, carrying ``x-ojs-error-*``."""
    out = without_death_headers(headers)
    out["x-ojs-error-code"] = code
    out["x-ojs-error-message"] = message[:MAX_MESSAGE]
    return out


def without_failure_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """``headers`` without dead-letter bookkeeping and without ``x-ojs-error-*``."""
    return {k: v for k, v in without_death_headers(headers).items() if k not in ERROR_HEADERS}


def record_failure(
    body: bytes,
    headers: Mapping[str, Any],
    failure: JobFailure,
    *,
    attempt: int,
    state: str,
    now: datetime | None = None,
    due: datetime | None = None,
) -> tuple[bytes, dict[str, Any]]:
    """Envelope and headers of a job whose attempt ``attempt`` failed.

    ``state`` is ``retryable`` (the caller then sets ``x-ojs-attempt`` to the
    next attempt) or ``discarded``.  ``due``, for a retry, is when its next attempt
    may start: the envelope's ``scheduled_at`` (and ``x-ojs-scheduled-at``), which
    holds back a job that leaves a shorter retry queue before it.
    """
    occurred = format_time(now or datetime.now(UTC))
    job = json.loads(body)
    entry = {"code": failure.code, "message": failure.message or failure.type,
             "type": failure.type, "attempt": max(attempt, 1), "occurred_at": occurred}
    history = job.get("errors") if isinstance(job.get("errors"), list) else []
    job["errors"] = [*history, entry][-MAX_ERRORS:]
    error: dict[str, Any] = {"type": failure.type or failure.code,
                             "message": failure.message or failure.type or failure.code}
    if failure.backtrace:
        error["backtrace"] = list(failure.backtrace)
    job["error"] = error
    job["state"] = state
    job["attempt"] = max(attempt, 1)
    out = with_error_headers(headers, failure.code, failure.message or failure.type)
    if due is not None:
        job["scheduled_at"] = out["x-ojs-scheduled-at"] = format_time(due)
    return json.dumps(job, separators=(",", ":"), ensure_ascii=False).encode(), out


def reset_for_replay(envelope: Mapping[str, Any],
                     headers: Mapping[str, Any]) -> tuple[bytes, dict[str, Any]]:
    """Body and headers of a dead-lettered job (its decoded ``envelope``) made runnable
    again: same id, attempt reset, history kept."""
    job = {**envelope, "state": "available", "attempt": 0}
    job.pop("error", None)
    out = without_failure_headers(headers)
    out["x-ojs-attempt"] = 1
    return json.dumps(job, separators=(",", ":"), ensure_ascii=False).encode(), out


# -- the failure decision ---------------------------------------------------


class Happened(StrEnum):
    """What became of a delivery that did not simply succeed."""

    #: the task raised (``failure`` says what)
    HANDLER_ERROR = "handler_error"
    #: the task hit its hard time limit
    TIME_LIMIT = "time_limit"
    #: the pool process running it died (OOM kill, SIGKILL)
    WORKER_LOST = "worker_lost"
    #: the task asked for a retry (``self.retry()``, ``autoretry_for``); its own limit
    #: (Celery's ``max_retries`` or the OJS policy) was checked where it asked
    RETRY_REQUESTED = "retry_requested"
    #: the task raised and the pool, where Celery records the attempt, did not retry
    #: it: ``failure.code`` is its reason (``NON_RETRYABLE_ERROR``: the job's rules
    #: do not retry this failure; ``HANDLER_ERROR``: no attempt or retry left)
    NOT_RETRIED = "not_retried"
    #: the message is not a runnable job: undecodable, invalid envelope or body,
    #: unknown type (``failure.code`` names which)
    INVALID = "invalid"
    #: ``expires_at`` passed before it started
    EXPIRED = "expired"
    #: a CANCEL reached it (AMQP-019)
    CANCELLED = "cancelled"
    #: it arrived before its ``scheduled_at``
    EARLY = "early"


class Action(StrEnum):
    """What the worker does with the delivery."""

    ACK = "ack"
    #: republish through the retry exchange after ``delay_s`` (section 5.4)
    RETRY = "retry"
    #: into ``ojs.queue.dlx.{q}`` (section 5.5)
    DEAD_LETTER = "dead_letter"
    #: back to the broker until ``delay_s`` from now (section 9)
    WAIT = "wait"


@dataclass(frozen=True, slots=True)
class Outcome:
    """The one decision for a delivery; :mod:`ojs_kombu.amqp.consuming.outcomes` carries it out."""

    action: Action
    failure: JobFailure | None = None
    delay_s: float = 0.0
    #: the message is not a valid job: its dead letter must carry ``x-ojs-error-*``
    #: whatever the dead-letter mode (a ``Basic.Nack`` could not say why)
    invalid_input: bool = False


@dataclass(frozen=True, slots=True)
class Delivered:
    """What happened to a delivery, as the decision needs it."""

    happened: Happened
    failure: JobFailure | None = None
    #: whether the job's retry rules allow retrying this failure at all
    #: (``non_retryable_errors``, Celery's ``autoretry_for``/``dont_autoretry_for``);
    #: for what the worker's main process sees happen (a time limit, a lost pool
    #: process, ``Reject``): a task's own exception comes judged, as
    #: ``RETRY_REQUESTED`` or ``NOT_RETRIED``
    retryable: bool = True
    #: a requested retry's delay, or how early the job arrived (seconds)
    delay_s: float | None = None


_FAILURE_CODES = {Happened.HANDLER_ERROR: HANDLER_ERROR, Happened.TIME_LIMIT: HANDLER_TIMEOUT,
                  Happened.WORKER_LOST: HANDLER_ERROR, Happened.RETRY_REQUESTED: HANDLER_ERROR}


def _no_delay(_attempt: int) -> float:
    return 0.0


def decide(delivered: Delivered, attempt: int, max_attempts: int = 1,
           delay_of: Callable[[int], float] = _no_delay) -> Outcome:
    """The outcome of a delivery, from what happened, its attempt and its retry policy.

    ``attempt`` is the 1-based attempt that just ended, ``max_attempts`` the
    policy's (every attempt counted, 1 = never retried) and ``delay_of(n)`` the
    policy's backoff after failed attempt ``n``; without them, as for a delivery
    no retry policy governs (invalid, expired, cancelled, early).  Called once
    per delivery, in the worker's main process; a verdict the pool had to reach
    for Celery (``RETRY_REQUESTED``, ``NOT_RETRIED``) is taken as given, never
    judged again.  Pure: no I/O, no clock.
    """
    happened = delivered.happened
    if happened is Happened.CANCELLED:
        return Outcome(Action.ACK)
    if happened is Happened.EARLY:
        return Outcome(Action.WAIT, delay_s=max(delivered.delay_s or 0.0, 0.0))
    if happened is Happened.INVALID:
        return Outcome(Action.DEAD_LETTER, _failure(delivered, INVALID_ENVELOPE),
                       invalid_input=True)
    if happened is Happened.EXPIRED:
        return Outcome(Action.DEAD_LETTER, _failure(delivered, EXPIRED))
    if happened is Happened.NOT_RETRIED:  # the pool's verdict, taken as given
        failure = delivered.failure
        return Outcome(Action.DEAD_LETTER, failure if failure is not None
                       else _failure(delivered, HANDLER_ERROR))
    failure = _failure(delivered, _FAILURE_CODES[happened])
    if happened is Happened.RETRY_REQUESTED:
        delay = delivered.delay_s if delivered.delay_s is not None else delay_of(attempt)
        return Outcome(Action.RETRY, failure, max(delay, 0.0))
    if attempt >= max_attempts:
        return Outcome(Action.DEAD_LETTER, failure)
    if not delivered.retryable:  # a time limit or a lost process keeps its own code
        code = NON_RETRYABLE_ERROR if happened is Happened.HANDLER_ERROR else failure.code
        return Outcome(Action.DEAD_LETTER, _with_code(failure, code))
    return Outcome(Action.RETRY, failure, max(delay_of(attempt), 0.0))


#: Code of an invalid delivery whose caller named none.
def _failure(delivered: Delivered, code: str) -> JobFailure:
    failure = delivered.failure
    if failure is None:
        return JobFailure(code, code, delivered.happened.value.replace("_", " "))
    return failure if failure.code == code or delivered.happened is Happened.INVALID \
        else _with_code(failure, code)


def _with_code(failure: JobFailure, code: str) -> JobFailure:
    return JobFailure(code, failure.type, failure.message, failure.backtrace)
