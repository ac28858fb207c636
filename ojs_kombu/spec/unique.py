"""Unique jobs and idempotency keys: the rules, without a store.

An OJS ``unique`` policy (``unique-policy.schema.json``) names the dimensions
of a job that make two jobs "the same" (``type`` always, then ``queue``,
``args``, ``meta``); :func:`fingerprint` hashes them.  A conflict is a record
of another job with that fingerprint, younger than the ``period``, in one of
the policy's ``states``; :func:`resolve` says what ``on_conflict`` makes of
it.  An idempotency key (``x-ojs-idempotency-key``) names one piece of work:
:func:`run_verdict` says whether a delivery of it runs, is a duplicate, or
waits for the attempt that holds the key.  The store that keeps the records
(:mod:`ojs_kombu.celery.dedup_store`) only applies these rules atomically.

Celery's keyword arguments are part of the ``args`` dimension: an OJS
``args`` array carries Celery's positional arguments, and ``args_keys`` picks
top-level keys of the keyword arguments first, then of the first object among
the positional arguments that has them (the shape other producers send).
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from .envelope import UniquePolicy, parse_duration
from .errors import JobOptionError, NonJSONArgumentError
from .typed_values import UnencodableValue, natural, python_path

#: apply_async option (and task option) carrying an OJS ``unique`` policy.
UNIQUE_OPTION = "ojs_unique"
#: apply_async option carrying an idempotency key (a task option may be ``True``:
#: the job id is the key, or a callable ``(args, kwargs) -> str``).
IDEMPOTENCY_OPTION = "ojs_idempotency_key"
#: AMQP header of the key (binding section 6.2).
IDEMPOTENCY_HEADER = "x-ojs-idempotency-key"
#: Celery header through which a consumed unique job's fingerprint and policy reach
#: the pool (set by :func:`ojs_kombu.spec.decode.decode_job_message`).
UNIQUE_HEADER = "ojs_unique"
#: The schema's default ``states``: every non-terminal state.
DEFAULT_STATES: tuple[str, ...] = ("available", "active", "scheduled", "retryable", "pending")
#: The states a record takes: at publish, when a worker starts it, when it ends.
SCHEDULED, AVAILABLE, ACTIVE, COMPLETED = "scheduled", "available", "active", "completed"


def unique_policy(value: Any, *, task_name: str | None, job_id: str | None = None,
                  queue: str | None = None) -> UniquePolicy | None:
    """The call's ``ojs_unique`` as a :class:`UniquePolicy` (``None``: not unique), or
    :class:`JobOptionError` naming what the schema refuses."""
    if value is None or value is False:
        return None
    if isinstance(value, UniquePolicy):
        return value
    if value is True:
        value = {}
    try:
        return UniquePolicy.model_validate(value)
    except ValidationError as exc:
        raise JobOptionError(
            f"task {task_name!r}: {UNIQUE_OPTION}={value!r} is not an OJS unique policy "
            f"({exc.errors()[0]['msg']})", option=UNIQUE_OPTION, task_name=task_name,
            job_id=job_id, queue=queue) from None


def idempotency_key(value: Any, *, task_name: str | None, job_id: str,
                    args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    """The job's idempotency key from the call's or the task's ``ojs_idempotency_key``:
    a non-empty string, ``True`` (the job id: redeliveries and publish retries of this
    job), or a callable of ``(args, kwargs)`` returning one."""
    if value is None or value is False:
        return None
    if value is True:
        return job_id
    if callable(value):
        value = value(list(args), dict(kwargs))
    if not isinstance(value, str) or not value:
        raise JobOptionError(
            f"task {task_name!r}: {IDEMPOTENCY_OPTION} must be a non-empty string, True or "
            f"a callable returning one, not {value!r}", option=IDEMPOTENCY_OPTION,
            task_name=task_name, job_id=job_id)
    return value


def _pick(keys: Sequence[str], args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    picked: dict[str, Any] = {}
    for key in keys:
        if key in kwargs:
            picked[key] = kwargs[key]
            continue
        for arg in args:
            if isinstance(arg, Mapping) and key in arg:
                picked[key] = arg[key]
                break
    return picked


def fingerprint(policy: UniquePolicy, *, job_type: str, queue: str, args: Sequence[Any],
                kwargs: Mapping[str, Any] | None = None,
                meta: Mapping[str, Any] | None = None) -> str:
    """The hex SHA-256 of the policy's dimensions of the job, in canonical JSON: the same
    for every producer that sends the same work under the same policy."""
    # values in their natural JSON forms: a producer's date and a consumer's ISO string
    # of it are the same work
    try:
        args = natural(list(args), ("args",), {})
        kwargs = natural(dict(kwargs or {}), ("x_celery", "kwargs"), {})
    except UnencodableValue as exc:
        raise NonJSONArgumentError(
            f"{python_path(exc.path)} is a {type(exc.value).__name__}: {exc.advice}",
            path=python_path(exc.path)) from None
    parts: dict[str, Any] = {"type": job_type}
    if "queue" in policy.keys:
        parts["queue"] = queue
    if "args" in policy.keys:
        parts["args"] = ({"args": args, "kwargs": kwargs}
                         if policy.args_keys is None else _pick(policy.args_keys, args, kwargs))
    if "meta" in policy.keys:
        parts["meta"] = {key: (meta or {}).get(key) for key in policy.meta_keys or ()}
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str)  # meta values are JSON already
    return hashlib.sha256(text.encode()).hexdigest()


def checked_states(policy: UniquePolicy) -> tuple[str, ...]:
    return tuple(policy.states) if policy.states is not None else DEFAULT_STATES


def period_ms(policy: UniquePolicy, ceiling_s: float) -> int:
    """How long the record lives: the ``period``, else ``ceiling_s`` (the store's
    retention, so that every record expires)."""
    seconds = parse_duration(policy.period).total_seconds() if policy.period else ceiling_s
    return max(1, int(seconds * 1000))


class Resolution(enum.Enum):
    """What a unique job does about an existing job with its fingerprint."""

    ENQUEUE = "enqueue"            # no conflict: claim and publish
    REJECT = "reject"              # DuplicateJobError naming the existing job
    IGNORE = "ignore"              # the existing job's id, nothing published
    REPLACE = "replace"            # cancel the existing job, publish this one
    REPLACE_KEEP_SCHEDULE = "replace_except_schedule"  # ... at the existing schedule


def resolve(policy: UniquePolicy, existing_state: str | None) -> Resolution:
    """The decision for a record in ``existing_state`` (``None``: no record): only a
    state the policy checks is a conflict."""
    if existing_state is None or existing_state not in checked_states(policy):
        return Resolution.ENQUEUE
    return Resolution(policy.on_conflict)


class RunVerdict(enum.Enum):
    """What a delivery of an idempotency key does."""

    RUN = "run"              # the key is this attempt's now
    DUPLICATE = "duplicate"  # it ran to completion already: ack without running
    BUSY = "busy"            # another attempt holds it: come back later


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """The store's record of an idempotency key: who holds it, in which attempt."""

    state: str  # "running" or "completed"
    job_id: str
    attempt: int


def run_verdict(record: KeyRecord | None, *, job_id: str, attempt: int,
                redelivered: bool) -> RunVerdict:
    """The receiving side of exactly-once (RabbitMQ's guide): run what was not seen.

    A completed key is a duplicate whoever delivers it.  A running key is taken
    over by a later attempt of the same job (the broker retried it: attempts are
    tracked, not blocked) and by a redelivery of the same attempt (RabbitMQ
    redelivers only what a closed channel held: the holder is gone); anything else
    waits for the holder.  The store applies this same rule in one atomic step.
    """
    if record is None:
        return RunVerdict.RUN
    if record.state == COMPLETED:
        return RunVerdict.DUPLICATE
    if record.job_id == job_id and (attempt > record.attempt or redelivered):
        return RunVerdict.RUN
    return RunVerdict.BUSY
