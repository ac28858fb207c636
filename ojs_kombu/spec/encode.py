"""Celery task protocol v2 -> OJS job message: the publish side.

Pure code: Python values in, bytes and dicts out.  Celery's task sender
(:mod:`ojs_kombu.celery.task_sender`) calls :func:`encode_task_message` with
Celery's ``(args, kwargs, embed)`` as Python values (content type
:data:`CELERY_CALL`), so the envelope is the one JSON encoding of the call; a
task message another kombu producer serialised as JSON reaches it through the
transport and is parsed first.  Batches and the command line build their jobs
with :func:`build_job`, the one place an envelope is written.

Mapped onto OJS attributes: ``id`` (UUIDv7), ``task`` -> ``type``, ``eta`` ->
``scheduled_at``, ``expires`` -> ``expires_at``, the hard time limit ->
``timeout`` (whole seconds, rounded up), ``priority`` -> ``priority``; the
rest of Celery's message travels in ``x_celery`` (:mod:`ojs_kombu.spec.x_celery`).

An option or argument no envelope can carry raises a
:class:`~ojs_kombu.spec.errors.JobEncodeError` subclass naming it
(:mod:`ojs_kombu.spec.job_options`, ``max_job_bytes``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .celery_json import dumps_envelope, read_celery_json
from .envelope import CONTENT_TYPE, SPEC_VERSION, RetryPolicy, UniquePolicy
from .errors import (
    InvalidJobIdError,
    JobEncodeError,
    JobOptionError,
    JobTooLargeError,
    NonJSONArgumentError,
    OJSConfigurationError,
    UnsupportedSerializerError,
)
from .job_ids import JOB_ID_HEADER, job_id_for
from .job_options import (
    META_OPTION,
    RETRY_OPTION,
    amqp_priority,
    check_priority,
    check_time_limits,
    time_option,
)
from .times import format_time
from .trace_context import trace_id_of
from .typed_values import (
    TYPES_KEY,
    UnencodableValue,
    natural,
    parse_pointer,
    python_path,
)
from .unique import IDEMPOTENCY_OPTION, UNIQUE_OPTION, idempotency_key, unique_policy
from .x_celery import X_CELERY, x_celery_of

CELERY_JSON = "application/json"
#: Stands for the content type of a task message whose body is Celery's ``(args,
#: kwargs, embed)`` as Python values, never serialised before the envelope is.
CELERY_CALL = "application/x-ojs-celery-call"
DEFAULT_MAX_ATTEMPTS = 3

_DEFAULT_POLICY = RetryPolicy()


@dataclass(slots=True)
class OutgoingJob:
    """A job ready for ``Basic.Publish`` on ``ojs.exchange.direct`` with routing key ``queue``."""

    job_id: str
    job_type: str
    queue: str
    body: bytes
    properties: dict[str, Any]
    #: Milliseconds until ``scheduled_at`` (0: deliver now).
    delay_ms: int = 0


def encode_task_message(
    *,
    body: Any,
    content_type: str | None,
    properties: Mapping[str, Any],
    headers: Mapping[str, Any],
    job_type: str,
    queue: str,
    retry_policy: RetryPolicy | None = None,
    now: datetime | None = None,
    max_job_bytes: int | None = None,
) -> OutgoingJob:
    """Turn a Celery protocol v2 task message into an OJS job message.

    ``body`` is Celery's ``(args, kwargs, embed)``: Python values when
    ``content_type`` is :data:`CELERY_CALL`, JSON when it is ``application/json``.

    ``retry_policy`` is the task's effective policy; an ``ojs_retry`` option of
    the call merges over it.  The envelope carries the policy when it is not
    the OJS default, and ``x-ojs-max-attempts`` always does.  ``max_job_bytes``
    bounds the body (:class:`JobTooLargeError`; ``None``: no limit).
    A time limit, priority or argument no OJS envelope can carry raises a
    :class:`JobEncodeError` subclass naming the option and the task.
    """
    task_name = headers.get("task")
    task_id = headers.get("id")
    if not isinstance(task_id, str) or not task_id:
        raise InvalidJobIdError(
            f"task {task_name!r} has id {task_id!r}; a task id is a non-empty string "
            "(leave task_id unset and Celery mints one)",
            job_id=None, queue=queue,
        )
    job_id = job_id_for(task_id, headers.get(JOB_ID_HEADER))
    if content_type != CELERY_JSON and content_type != CELERY_CALL:
        raise UnsupportedSerializerError(
            f"task {task_name!r} was serialized as {content_type!r}; OJS jobs are JSON: "
            "set serializer='json' (task_serializer) for tasks sent through ojs_kombu",
            job_id=job_id, queue=queue,
        )
    if headers.get("compression"):
        raise UnsupportedSerializerError(
            f"task {task_name!r} was compressed ({headers['compression']}); OJS bodies are "
            "plain JSON: drop the compression option", job_id=job_id, queue=queue,
        )
    try:
        if content_type == CELERY_CALL:
            args, kwargs, embed = body
        else:
            args, kwargs, embed = read_celery_json(body)
    except NonJSONArgumentError as exc:
        exc.job_id, exc.queue = job_id, queue
        exc.args = (f"task {task_name!r}: {exc}",)
        raise exc.with_traceback(None) from None
    except (ValueError, TypeError) as exc:
        raise JobEncodeError(
            f"task {task_name!r}: body is not Celery protocol v2 ({exc})",
            job_id=job_id, queue=queue,
        ) from None

    now = now or datetime.now(UTC)
    meta = properties.get(META_OPTION)
    traceparent = headers.get("traceparent")  # W3C context Celery's instrumentation injected
    timelimit = headers.get("timelimit") or (None, None)
    if not isinstance(timelimit, list | tuple) or len(timelimit) != 2:
        raise JobOptionError(f"task {task_name!r}: timelimit header {timelimit!r} is not "
                             "[time_limit, soft_time_limit]", option="timelimit",
                             task_name=task_name, job_id=job_id, queue=queue)
    check_time_limits(*timelimit, task_name=task_name, job_id=job_id, queue=queue)
    eta = headers.get("eta")
    expires = headers.get("expires")
    x_celery = x_celery_of(headers, job_id=job_id, task_id=task_id, kwargs=kwargs, embed=embed)
    unique = unique_policy(properties.get(UNIQUE_OPTION), task_name=task_name, job_id=job_id,
                           queue=queue)
    key = idempotency_key(properties.get(IDEMPOTENCY_OPTION), task_name=task_name,
                          job_id=task_id, args=args, kwargs=kwargs or {})
    return build_job(
        job_id=job_id, job_type=job_type, queue=queue, args=args, task_name=task_name,
        now=now, created=format_time(now), meta=meta,
        traceparent=traceparent if isinstance(traceparent, str) else None,
        tracestate=headers.get("tracestate"),
        priority=properties.get("priority"), timeout=timelimit[0],
        retry_policy=retry_policy, per_call_retry=properties.get(RETRY_OPTION),
        scheduled_at=time_option(eta, "eta") if eta else None,
        expires_at=time_option(expires, "expires") if expires else None,
        attempt=int(headers.get("retries") or 0) + 1, x_celery=x_celery,
        reply_to=properties.get("reply_to"), max_job_bytes=max_job_bytes,
        unique=unique, idempotency_key=key,
    )


def build_job(
    *,
    job_id: str,
    job_type: str,
    queue: str,
    args: Any,
    task_name: str | None,
    now: datetime,
    created: str,
    meta: Any = None,
    traceparent: str | None = None,
    tracestate: Any = None,
    priority: int | None = None,
    timeout: float | None = None,
    retry_policy: RetryPolicy | None = None,
    per_call_retry: Any = None,
    scheduled_at: datetime | None = None,
    expires_at: datetime | None = None,
    attempt: int = 1,
    x_celery: dict[str, Any] | None = None,
    reply_to: str | None = None,
    max_job_bytes: int | None = None,
    unique: UniquePolicy | None = None,
    idempotency_key: str | None = None,
) -> OutgoingJob:
    """The OJS job message for already parsed values: the one place envelopes,
    properties and ``x-ojs-*`` headers are built, for single and batch publishes.

    ``created`` is ``format_time(now)``, passed in so that a batch formats it once.
    ``unique`` is written as the envelope's policy; ``idempotency_key`` goes into
    ``meta.idempotency_key`` and the ``x-ojs-idempotency-key`` header.
    A ``priority`` outside -100..100 (or not an integer) raises :class:`JobOptionError`;
    a body over ``max_job_bytes`` (``None``: no limit) raises :class:`JobTooLargeError`.
    """
    job: dict[str, Any] = {
        "specversion": SPEC_VERSION, "id": job_id, "type": job_type, "queue": queue,
        "args": args,
    }
    if meta and not isinstance(meta, Mapping):
        raise JobEncodeError(
            f"{META_OPTION} must be a mapping, got {type(meta).__name__}",
            job_id=job_id, queue=queue,
        )
    meta = dict(meta) if meta else {}
    meta.pop(TYPES_KEY, None)  # written below, from the values themselves
    if idempotency_key is not None:
        meta["idempotency_key"] = idempotency_key
    if traceparent is not None and "traceparent" not in meta:
        meta["traceparent"] = traceparent
        trace_id = trace_id_of(traceparent)
        if trace_id and "trace_id" not in meta:
            meta["trace_id"] = trace_id
    if meta:
        job["meta"] = meta
    if check_priority(priority, task_name=task_name, job_id=job_id, queue=queue):
        job["priority"] = priority
    if timeout:
        job["timeout"] = math.ceil(timeout)
    policy = retry_policy
    if per_call_retry is not None:
        from .retry import merge, policy_from

        try:
            override = policy_from(per_call_retry,
                                   source=f"{RETRY_OPTION} of task {task_name!r}")
        except OJSConfigurationError as exc:
            raise JobEncodeError(str(exc), job_id=job_id, queue=queue) from None
        policy = merge(policy or RetryPolicy(), override)
    if policy is not None:
        stated = _stated_policy(policy)
        if stated is not None or per_call_retry is not None:
            job["retry"] = stated or policy.model_dump(mode="json")
    delay_ms = 0
    if scheduled_at is not None:
        job["scheduled_at"] = format_time(scheduled_at)
        delay_ms = max(0, math.ceil((scheduled_at - now).total_seconds() * 1000))
    if expires_at is not None:
        job["expires_at"] = format_time(expires_at)
    job["created_at"] = created
    job["enqueued_at"] = created
    if unique is not None:
        job["unique"] = unique.model_dump(mode="json", exclude_unset=True)
    if x_celery:
        job[X_CELERY] = x_celery

    try:
        encoded = dumps_envelope(job)
    except (TypeError, ValueError, RecursionError):  # typed values: their natural forms
        encoded = dumps_envelope(_typed_job(job, meta, task_name=task_name, job_id=job_id,
                                            queue=queue))
    if max_job_bytes is not None and len(encoded) > max_job_bytes:
        raise JobTooLargeError(
            f"job {job_id} (task {task_name!r}, queue {queue!r}) is {len(encoded)} bytes as "
            f"an OJS envelope, more than ojs_max_job_bytes={max_job_bytes}; it was not sent "
            "(RabbitMQ refuses bodies over its max_message_size: pass a reference to the "
            "data, not the data)", size=len(encoded), limit=max_job_bytes, job_id=job_id,
            queue=queue)

    amqp_headers: dict[str, Any] = {
        "x-ojs-queue": queue,
        "x-ojs-attempt": attempt,
        "x-ojs-max-attempts": policy.max_attempts if policy else DEFAULT_MAX_ATTEMPTS,
        "x-ojs-created-at": created,
        "x-ojs-enqueued-at": created,
    }
    if "scheduled_at" in job:
        amqp_headers["x-ojs-scheduled-at"] = job["scheduled_at"]
    if meta:
        _meta_headers(meta, amqp_headers)
    if isinstance(tracestate, str) and tracestate and "x-ojs-trace-id" in amqp_headers:
        amqp_headers["x-ojs-trace-state"] = tracestate

    props: dict[str, Any] = {
        "message_id": job_id,
        "type": job_type,
        "content_type": CONTENT_TYPE,
        "content_encoding": "utf-8",
        "timestamp": int(now.timestamp()),
        "delivery_mode": 2,
        "app_id": "ojs",
        "correlation_id": job_id,
        "application_headers": amqp_headers,
    }
    if "priority" in job:
        props["priority"] = amqp_priority(job["priority"])
    if reply_to:
        props["reply_to"] = reply_to
    return OutgoingJob(job_id=job_id, job_type=job_type, queue=queue, body=encoded,
                       properties=props, delay_ms=delay_ms)


def _typed_job(job: dict[str, Any], meta: dict[str, Any], *, task_name: str | None,
               job_id: str, queue: str) -> dict[str, Any]:
    """``job`` with its values in their natural JSON forms (:mod:`.typed_values`) and
    their types in ``meta.x_celery_types``; a :class:`NonJSONArgumentError` names the
    first value JSON cannot carry."""
    types: dict[str, str] = {}
    try:
        for root in ("args", X_CELERY):
            if root in job:
                job[root] = natural(job[root], (root,), types)
        meta_types: dict[str, str] = {}
        if meta:
            natural(meta, ("meta",), meta_types)
    except UnencodableValue as exc:
        raise NonJSONArgumentError(
            f"task {task_name!r}: {python_path(exc.path)} is a {type(exc.value).__name__}: "
            f"{exc.advice}", job_id=job_id, queue=queue, path=python_path(exc.path),
        ) from None
    except RecursionError:
        raise NonJSONArgumentError(
            f"task {task_name!r}: an argument refers to itself or is nested too deeply for "
            "JSON", job_id=job_id, queue=queue) from None
    if meta_types:
        where, kind = next(iter(meta_types.items()))
        path = python_path(tuple(parse_pointer(where)))
        raise NonJSONArgumentError(
            f"task {task_name!r}: {path} is a {kind}; ojs_meta carries JSON values only "
            "(pass it as a string)", job_id=job_id, queue=queue, path=path)
    if types:
        job["meta"] = {**meta, TYPES_KEY: types}
    return job


#: A task's policy is one object for all its jobs: what its envelopes state, by id.
_STATED: dict[int, tuple[RetryPolicy, dict[str, Any] | None]] = {}


def _stated_policy(policy: RetryPolicy) -> dict[str, Any] | None:
    """``policy`` as envelopes state it (``None``: the OJS default, not stated), computed
    once per policy object."""
    known = _STATED.get(id(policy))
    if known is None or known[0] is not policy:
        if len(_STATED) > 1024:
            _STATED.clear()
        stated = None if policy == _DEFAULT_POLICY else policy.model_dump(mode="json")
        known = _STATED[id(policy)] = (policy, stated)
    return known[1]


def _meta_headers(meta: Mapping[str, Any], headers: dict[str, Any]) -> None:
    tags = meta.get("tags")
    if isinstance(tags, list) and tags:
        headers["x-ojs-tags"] = ",".join(str(t) for t in tags)
    key = meta.get("idempotency_key")
    if isinstance(key, str):
        headers["x-ojs-idempotency-key"] = key
    traceparent = meta.get("traceparent")
    if isinstance(traceparent, str):
        headers["x-ojs-trace-id"] = traceparent
