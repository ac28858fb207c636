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
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

from .codec import format_time

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
) -> tuple[bytes, dict[str, Any]]:
    """Envelope and headers of a job whose attempt ``attempt`` failed.

    ``state`` is ``retryable`` (the caller then sets ``x-ojs-attempt`` to the
    next attempt) or ``discarded``.
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
    return json.dumps(job, separators=(",", ":"), ensure_ascii=False).encode(), out


def reset_for_replay(body: bytes, headers: Mapping[str, Any]) -> tuple[bytes, dict[str, Any]]:
    """A dead-lettered job made runnable again: same id, attempt reset, history kept."""
    job = json.loads(body)
    job["state"] = "available"
    job["attempt"] = 0
    job.pop("error", None)
    out = without_failure_headers(headers)
    out["x-ojs-attempt"] = 1
    return json.dumps(job, separators=(",", ":"), ensure_ascii=False).encode(), out
