"""What a dead letter says about itself (pure): its key, its ids, and why it died.

A DLQ holds whatever reached ``ojs.exchange.dlx``: jobs ojs_kombu discarded,
jobs other OJS workers nacked, jobs the broker expired or dropped, and messages
that never were jobs (not JSON, not UTF-8, nested 100,000 deep, another content
type, no ``message_id``).  The dead-letter tools must read each of them, so
nothing here raises: a body that is not a readable OJS envelope is kept as bytes
with the problems found, and every dead letter gets a stable key to be named by.

Why a job died comes from, in this order:

* its ``x-ojs-error-*`` headers, when the dead letter is a copy the worker
  published to the DLX with its last error (``ojs_dead_letter_mode="republish"``,
  an opt-in, and every message that was not a valid job);
* RabbitMQ's ``x-death`` reason, when the broker dead-lettered it itself:
  ``expired`` (a TTL: ``EXPIRED``), ``maxlen`` (a full ``drop_oldest`` queue),
  ``delivery_limit`` (a quorum queue's limit);
* for a job a worker discarded with ``Basic.Nack`` (AMQP-009, ``x-death``
  ``rejected``), whose message cannot change: ``EXPIRED`` when it died after
  its ``expires_at``; otherwise the dead letter does not say (``source``
  :data:`NOT_RECORDED`, until the result backend is read: see
  :mod:`ojs_kombu.celery.dead_letters`), and its ``x-ojs-error-*`` are an
  earlier attempt's (``earlier_error``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from .envelope import CONTENT_TYPE
from .failures import EXPIRED, latest_death
from .job_ids import TASK_ID_KEY, is_task_id
from .times import parse_time
from .x_celery import X_CELERY

#: Deepest envelope shown as JSON (orjson writes no deeper); a deeper body is shown as text.
MAX_ENVELOPE_DEPTH = 254
#: Prefix of the key of a dead letter that has no id: the SHA-256 of its body.
DIGEST_PREFIX = "sha256:"
#: Hex digits of the digest in such a key (128 bits).
DIGEST_HEX = 32
#: ``Why.source`` of a nacked job whose last error nothing read so far keeps.
NOT_RECORDED = "not recorded"
#: What to do about it (the tools print it as the dead letter's ``why``).
NOT_RECORDED_HINT = (
    "not recorded: Basic.Nack (ojs_dead_letter_mode='nack', the default) carries no "
    "reason; keep the failure in a result backend and give the app (-A proj), or set "
    "ojs_dead_letter_mode='republish' to put the error on the dead letter")


@dataclass(frozen=True, slots=True)
class BodyReading:
    """A dead letter's body read as an OJS envelope, or why it could not be."""

    envelope: dict[str, Any] | None
    problems: tuple[str, ...]


def read_body(body: bytes, content_type: str | None) -> BodyReading:
    """``body`` as a JSON object, and what is wrong with it as an OJS job message.

    orjson parses without recursion (refusing past 1,024 levels), so a hostile
    body ends as a problem, never a ``RecursionError``."""
    problems: list[str] = []
    base = (content_type or "").split(";", 1)[0].strip().lower()
    if base != CONTENT_TYPE:
        problems.append(f"content type {content_type!r} is not {CONTENT_TYPE!r}"
                        if content_type else "no content type")
    envelope: dict[str, Any] | None = None
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        problems.append(_undecodable(body, str(exc)))
    else:
        if _deeper_than(value, READER_DEPTH):  # an orjson older than 3.10 parses it
            problems.append(TOO_DEEP)
        elif not isinstance(value, dict):
            problems.append(f"the body is a JSON {_json_kind(value)}, not an object")
        else:
            try:
                orjson.dumps(value)
            except TypeError:  # orjson's JSONEncodeError: deeper than it writes
                problems.append(f"the body is nested deeper than {MAX_ENVELOPE_DEPTH} levels")
            else:
                envelope = value
    if envelope is not None and not isinstance(envelope.get("id"), str):
        problems.append("the body has no job id")
    return BodyReading(envelope, tuple(problems))


#: How deep JSON readers go: orjson refuses a deeper body (the versions that parse it
#: give the same problem through :func:`_deeper_than`).
READER_DEPTH = 1024
TOO_DEEP = "the body is nested deeper than JSON readers go (1,024 levels)"


def _deeper_than(value: object, limit: int) -> bool:
    """Whether ``value`` nests more than ``limit`` arrays or objects (no recursion)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


def _undecodable(body: bytes, why: str) -> str:
    if "depth" in why or "recursion" in why.lower():
        return TOO_DEEP
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return "the body is not UTF-8"
    return "the body is not JSON" if body.strip() else "the body is empty"


def _json_kind(value: object) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


def text(value: object) -> str | None:
    """A header value as text (AMQP long strings may arrive as bytes)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def job_id_of(message_id: object, envelope: dict[str, Any] | None) -> str | None:
    """The OJS job id: ``message_id`` (AMQP-012), else the envelope's ``id``."""
    for value in (text(message_id), (envelope or {}).get("id")):
        if isinstance(value, str) and value:
            return value
    return None


def task_id_of(envelope: dict[str, Any] | None, job_id: str | None) -> str | None:
    """The caller's Celery task id: ``x_celery.id`` when it is not the job id, else the
    job id (a Celery id that is a UUIDv7 is the OJS id)."""
    x_celery = (envelope or {}).get(X_CELERY)
    carried = x_celery.get(TASK_ID_KEY) if isinstance(x_celery, dict) else None
    return carried if isinstance(carried, str) and carried else job_id


def key_of(job_id: str | None, body: bytes) -> str:
    """The name a dead letter is shown, replayed and removed by: its job id when that is
    a usable id, else the digest of its body (stable across runs and tools)."""
    if job_id is not None and is_task_id(job_id):
        return job_id
    return DIGEST_PREFIX + hashlib.sha256(body).hexdigest()[:DIGEST_HEX]


@dataclass(frozen=True, slots=True)
class Why:
    """Why a job died: its error code, message and exception type, where that was read
    (``source``), and for a nacked job the error of its attempt before."""

    code: str | None
    message: str | None
    type: str | None
    source: str
    earlier: dict[str, str | None] | None = None


def why(headers: dict[str, Any], envelope: dict[str, Any] | None) -> Why:
    """Why the dead letter with ``headers`` and ``envelope`` died (see the module text)."""
    death = latest_death(headers)
    reason = text(death.get("reason")) if death else None
    code, message = text(headers.get("x-ojs-error-code")), text(headers.get("x-ojs-error-message"))
    if reason is None:
        return Why(code, message, _error_type(envelope, code), "headers" if code else "none")
    queue = text(death.get("queue")) if death else None
    if reason == "expired":
        return Why(EXPIRED, f"its time to live in {queue} ran out (x-death expired)", None,
                   "x-death")
    if reason == "maxlen":
        return Why(None, f"dropped from {queue}: the queue was full (x-death maxlen)", None,
                   "x-death")
    if reason == "delivery_limit":
        return Why(None, f"delivered more often than {queue}'s delivery limit allows "
                         "(x-death delivery_limit)", None, "x-death")
    earlier = {"code": code, "message": message} if code else None
    expired_at = _expired_before(envelope, death)
    if expired_at is not None:
        return Why(EXPIRED, f"job expired at {expired_at}", None, "expires_at", earlier)
    return Why(None, None, None, NOT_RECORDED, earlier)


def _error_type(envelope: dict[str, Any] | None, code: str | None) -> str | None:
    """The exception type of the last error, from the envelope of a job the worker
    discarded with it (``state`` ``discarded``)."""
    if code is None or envelope is None or envelope.get("state") != "discarded":
        return None
    error = envelope.get("error")
    kind = error.get("type") if isinstance(error, dict) else None
    return kind if isinstance(kind, str) and kind != code else None


def _expired_before(envelope: dict[str, Any] | None, death: Mapping[str, Any] | None
                    ) -> str | None:
    """The job's ``expires_at`` when it was dead-lettered after it."""
    expires = (envelope or {}).get("expires_at")
    died = death.get("time") if death else None
    if not isinstance(expires, str) or not isinstance(died, datetime):
        return None
    try:
        expires_at = parse_time(expires)
    except ValueError:
        return None
    died = died if died.tzinfo else died.replace(tzinfo=UTC)
    # x-death's time has whole seconds: a job nacked within the second it expired counts
    return expires if expires_at < died + timedelta(seconds=1) else None
