"""Celery task protocol v2 <-> OJS job envelope and AMQP properties/headers.

Pure code: bytes and dicts in, bytes and dicts out.  The transport calls
:func:`encode_task_message` on publish and :func:`decode_job_message` on
consume; the worker's pool turns the envelope back into Celery's
``(args, kwargs, embed)`` with :func:`celery_payload`.

What Celery needs and OJS has no attribute for travels in one extension
attribute, ``x_celery`` (unknown top-level attributes are preserved by every
OJS consumer):

* ``kwargs``, and the canvas element ``callbacks``, ``errbacks``, ``chain``, ``chord``;
* every Celery header that is not mapped onto an OJS attribute (``root_id``,
  ``parent_id``, ``group``, ``group_index``, ``retries``, ``timelimit``,
  ``shadow``, ``argsrepr``, ``kwargsrepr``, ``origin``, ``ignore_result``,
  ``stamps``, custom headers ...), leaving out ``None`` and Celery's defaults
  (:data:`HEADER_DEFAULTS`, and a ``root_id`` equal to the job id), which the
  consumer restores.

Mapped onto OJS attributes: ``id`` (UUIDv7), ``task`` -> ``type``, ``eta`` ->
``scheduled_at``, ``expires`` -> ``expires_at``, the hard time limit ->
``timeout`` (whole seconds, rounded up), ``priority`` -> ``priority``.

Both directions are strict.  Publishing, an option no envelope can carry
raises a :class:`~ojs_kombu.spec.errors.JobEncodeError` subclass naming it
(:func:`check_time_limits`, :func:`check_priority`, ``max_job_bytes``).
Consuming, the body must be strict JSON (:func:`check_strict_json`), the
envelope valid and on its own queue, ``x_celery`` valid
(:func:`check_x_celery`), and a job from another producer may not name one of
Celery's built-in tasks; anything else is a :class:`JobRejected` with its code.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import TypeAdapter, ValidationError

from .envelope import CONTENT_TYPE, SPEC_VERSION, JobEnvelope, RetryPolicy
from .errors import (
    InvalidJobIdError,
    JobEncodeError,
    JobOptionError,
    JobRejected,
    JobTooLargeError,
    NonJSONArgumentError,
    OJSConfigurationError,
    UnsupportedSerializerError,
)
from .job_types import JobTypeRegistry
from .naming import is_job_id

X_CELERY = "x_celery"
EMBED_KEYS = ("callbacks", "errbacks", "chain", "chord")
#: Celery headers that become OJS attributes instead of ``x_celery`` entries.
MAPPED_HEADERS = frozenset({"lang", "task", "id", "eta", "expires"})
#: Celery header values that need not travel: the consumer restores them.
HEADER_DEFAULTS: dict[str, Any] = {
    "retries": 0,
    # None, not False: Celery's worker then applies the task's own ignore_result
    # (send_task without ignore_result); an explicit False or True travels.
    "ignore_result": None,
    "replaced_task_nesting": 0,
    "stamps": {},
    "kwargsrepr": "{}",
}
#: apply_async option carrying the OJS ``meta`` object (``apply_async(ojs_meta={...})``).
META_OPTION = "ojs_meta"
#: apply_async option carrying a per-call retry policy (``apply_async(ojs_retry={...})``).
RETRY_OPTION = "ojs_retry"
#: Celery header through which a consumed job's own retry policy reaches the task.
RETRY_HEADER = "ojs_retry"
#: Celery header set (``True``) on a consumed job that carries Celery's own data
#: (``x_celery``): a job a Celery producer published, whose failures may follow
#: Celery's retry rules (see ``ojs_retry_semantics``).  Absent on other producers' jobs.
CELERY_JOB_HEADER = "ojs_celery_job"
CELERY_JSON = "application/json"
DEFAULT_MAX_ATTEMPTS = 3
#: Message property through which the Celery wiring hands the app's ``ojs_max_job_bytes``
#: to :func:`encode_task_message` (set on every task message Celery publishes).
MAX_JOB_BYTES_PROPERTY = "ojs_max_job_bytes"
#: The OJS priorities a producer may publish (the range the spec says every
#: implementation must support; Celery's 0..9 fall inside it).
PRIORITY_MIN, PRIORITY_MAX = -100, 100
#: Task names of Celery's built-in tasks (``celery.chord_unlock``, ``celery.accumulate``,
#: ``celery.group``, ``celery.chain``, ``celery.chord``, ``celery.map``, ``celery.starmap``,
#: ``celery.chunks``, ``celery.backend_cleanup``) start with this.
CELERY_BUILTIN_PREFIX = "celery."

# Consume-side error codes (``x-ojs-error-code`` on dead-lettered messages).
INVALID_PAYLOAD = "INVALID_PAYLOAD"
INVALID_ENVELOPE = "INVALID_ENVELOPE"
UNKNOWN_JOB_TYPE = "UNKNOWN_JOB_TYPE"
UNSUPPORTED_CONTENT_TYPE = "UNSUPPORTED_CONTENT_TYPE"

_datetime = TypeAdapter(datetime)
_DEFAULT_POLICY = RetryPolicy()


def format_time(value: datetime) -> str:
    """RFC 3339 in UTC with ``Z``: milliseconds, or microseconds when they are not zero."""
    utc = value.astimezone(UTC)
    spec = "milliseconds" if utc.microsecond % 1000 == 0 else "microseconds"
    return utc.replace(tzinfo=None).isoformat(timespec=spec) + "Z"


def parse_time(value: Any, field: str) -> datetime:
    """Parse Celery's ``eta``/``expires`` (ISO 8601 string or datetime); naive means UTC."""
    try:
        parsed = _datetime.validate_python(value)
    except ValidationError as exc:
        raise JobEncodeError(f"{field} {value!r} is not an ISO 8601 timestamp") from exc
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def amqp_priority(priority: int) -> int:
    """OJS priority -> AMQP 0..9: ``clamp(priority, 0, 9)``.

    Celery's priorities (0..9, higher first on RabbitMQ) keep their value;
    OJS ``HIGH`` (10) is 9; ``NORMAL`` and ``LOW`` are 0, because RabbitMQ
    treats a message without priority as 0 and nothing can sort below it.
    """
    return max(0, min(9, priority))


def check_priority(priority: Any, *, task_name: str | None, job_id: str | None = None,
                   queue: str | None = None) -> int | None:
    """The call's ``priority`` as an OJS priority, or :class:`JobOptionError`: an
    integer from -100 to 100 (``None``: unset).  Nothing is clamped: a value out of
    range is refused, as one of the wrong type is."""
    if priority is None:
        return None
    if isinstance(priority, bool) or not isinstance(priority, int):
        reason = "is not an integer"
    elif not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        reason = "is out of range"
    else:
        return priority
    raise JobOptionError(
        f"task {task_name!r}: priority={priority!r} {reason}; OJS priorities are integers "
        f"from {PRIORITY_MIN} to {PRIORITY_MAX} (HIGH=10, NORMAL=0, LOW=-10; Celery's 0..9 "
        "keep their meaning)", option="priority", task_name=task_name, job_id=job_id,
        queue=queue)


def check_time_limits(hard: Any, soft: Any, *, task_name: str | None,
                      job_id: str | None = None, queue: str | None = None) -> None:
    """Refuse time limits an OJS job cannot carry (:class:`JobOptionError`): each is
    ``None`` or a finite number of seconds >= 0 (0: none), and a soft limit never
    exceeds the hard one."""
    for option, value in (("time_limit", hard), ("soft_time_limit", soft)):
        if value is None:
            continue
        if (isinstance(value, bool) or not isinstance(value, int | float)
                or not math.isfinite(value) or value < 0):
            raise JobOptionError(
                f"task {task_name!r}: {option}={value!r} is not a number of seconds >= 0 "
                "(0 or None: no limit)", option=option, task_name=task_name, job_id=job_id,
                queue=queue)
    if hard and soft and soft > hard:
        raise JobOptionError(
            f"task {task_name!r}: soft_time_limit={soft!r} is greater than time_limit={hard!r}; "
            "the soft limit must not exceed the hard one", option="soft_time_limit",
            task_name=task_name, job_id=job_id, queue=queue)


def _reject_kombu_type(obj: dict[str, Any]) -> dict[str, Any]:
    # kombu's JSON encoder writes datetime, Decimal, UUID and bytes as tagged
    # objects that only a Python/kombu consumer can read back.
    if "__type__" in obj and "__value__" in obj and len(obj) == 2:
        raise NonJSONArgumentError(
            f"a task argument of type {obj['__type__']!r} is not a JSON-native value; "
            "OJS args/kwargs carry only strings, numbers, booleans, null, arrays and "
            "objects (pass an ISO 8601 string or a number instead)"
        )
    return obj


def _reject_constant(name: str) -> Any:
    raise NonJSONArgumentError(f"a task argument is {name}, which JSON cannot carry")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_CHECKING_DECODER = json.JSONDecoder(object_hook=_reject_kombu_type,
                                     parse_constant=_reject_constant)


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


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
    body: bytes | str,
    content_type: str | None,
    properties: Mapping[str, Any],
    headers: Mapping[str, Any],
    job_type: str,
    queue: str,
    retry_policy: RetryPolicy | None = None,
    now: datetime | None = None,
    max_job_bytes: int | None = None,
) -> OutgoingJob:
    """Turn a serialised Celery protocol v2 task message into an OJS job message.

    ``retry_policy`` is the task's effective policy; an ``ojs_retry`` option of
    the call merges over it.  The envelope carries the policy when it is not
    the OJS default, and ``x-ojs-max-attempts`` always does.  ``max_job_bytes``
    bounds the body (:class:`JobTooLargeError`); when it is ``None`` the
    ``ojs_max_job_bytes`` message property the Celery wiring sets gives it.
    A time limit, priority or argument no OJS envelope can carry raises a
    :class:`JobEncodeError` subclass naming the option and the task.
    """
    task_name = headers.get("task")
    job_id = headers.get("id")
    if not isinstance(job_id, str) or not is_job_id(job_id):
        raise InvalidJobIdError(
            f"task {task_name!r} has id {job_id!r}, which is not a lowercase UUIDv7; "
            "OJS job ids are UUIDv7: leave task_id unset (ojs_kombu.install() makes "
            "Celery mint UUIDv7 ids) or pass ojs_kombu.new_job_id()",
            job_id=job_id if isinstance(job_id, str) else None, queue=queue,
        )
    if content_type != CELERY_JSON:
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
        # kombu tags non-JSON values as {"__type__": ..., "__value__": ...}; only a
        # body that mentions the tag needs the (slower) per-object check.
        text = body.decode() if isinstance(body, bytes) else body
        payload = (_CHECKING_DECODER if '"__type__"' in text else _DECODER).decode(text)
        args, kwargs, embed = payload
    except NonJSONArgumentError as exc:
        exc.job_id, exc.queue = job_id, queue
        exc.args = (f"task {task_name!r}: {exc}",)
        raise exc.with_traceback(None) from None
    except (ValueError, TypeError) as exc:
        raise JobEncodeError(
            f"task {task_name!r}: body is not Celery protocol v2 JSON ({exc})",
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
    if max_job_bytes is None:
        max_job_bytes = properties.get(MAX_JOB_BYTES_PROPERTY)
    eta = headers.get("eta")
    expires = headers.get("expires")
    x_celery = {
        k: v for k, v in headers.items()
        if k not in MAPPED_HEADERS and v is not None
        and (k not in HEADER_DEFAULTS or HEADER_DEFAULTS[k] != v)
    }
    if x_celery.get("root_id") == job_id:
        del x_celery["root_id"]
    if x_celery.get("timelimit") == [None, None]:
        del x_celery["timelimit"]
    if kwargs:
        x_celery["kwargs"] = kwargs
    for key in EMBED_KEYS:
        value = (embed or {}).get(key)
        if value is not None:
            x_celery[key] = value
    return build_job(
        job_id=job_id, job_type=job_type, queue=queue, args=args, task_name=task_name,
        now=now, created=format_time(now), meta=meta,
        traceparent=traceparent if isinstance(traceparent, str) else None,
        tracestate=headers.get("tracestate"),
        priority=properties.get("priority"), timeout=timelimit[0],
        retry_policy=retry_policy, per_call_retry=properties.get(RETRY_OPTION),
        scheduled_at=parse_time(eta, "eta") if eta else None,
        expires_at=parse_time(expires, "expires") if expires else None,
        attempt=int(headers.get("retries") or 0) + 1, x_celery=x_celery,
        reply_to=properties.get("reply_to"), max_job_bytes=max_job_bytes,
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
) -> OutgoingJob:
    """The OJS job message for already parsed values: the one place envelopes,
    properties and ``x-ojs-*`` headers are built, for single and batch publishes.

    ``created`` is ``format_time(now)``, passed in so that a batch formats it once.
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
    if traceparent is not None and "traceparent" not in meta:
        meta["traceparent"] = traceparent
        trace_id = traceparent.split("-")[1] if traceparent.count("-") == 3 else None
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
    if policy is not None and (per_call_retry is not None or policy != _DEFAULT_POLICY):
        job["retry"] = policy.model_dump(mode="json")
    delay_ms = 0
    if scheduled_at is not None:
        job["scheduled_at"] = format_time(scheduled_at)
        delay_ms = max(0, math.ceil((scheduled_at - now).total_seconds() * 1000))
    if expires_at is not None:
        job["expires_at"] = format_time(expires_at)
    job["created_at"] = created
    job["enqueued_at"] = created
    if x_celery:
        job[X_CELERY] = x_celery

    try:
        encoded = _dumps(job)
    except (TypeError, ValueError) as exc:
        raise NonJSONArgumentError(
            f"task {task_name!r}: {exc}; OJS jobs carry JSON-native values only",
            job_id=job_id, queue=queue,
        ) from None
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


@dataclass(slots=True)
class IncomingJob:
    """A consumed OJS job, in the shape Celery's worker reads."""

    envelope: JobEnvelope
    task_name: str
    headers: dict[str, Any]
    payload: tuple[list[Any], dict[str, Any], dict[str, Any]]


def check_content_type(content_type: str | None, content_encoding: str | None) -> None:
    base = (content_type or "").split(";", 1)[0].strip().lower()
    if base != CONTENT_TYPE:
        raise JobRejected(
            UNSUPPORTED_CONTENT_TYPE,
            f"content_type is {content_type!r}; OJS job queues carry {CONTENT_TYPE!r}",
        )
    if content_encoding and content_encoding.lower().replace("_", "-") not in ("utf-8", "utf8"):
        raise JobRejected(
            UNSUPPORTED_CONTENT_TYPE,
            f"content_encoding is {content_encoding!r}; OJS job bodies are utf-8",
        )


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise JobRejected(
                    INVALID_PAYLOAD,
                    f"message body has the object key {key!r} twice; the JSON objects of an "
                    "OJS job have unique keys (parsers disagree on which value wins)")
            seen.add(key)
    return obj


def _refuse_constant(name: str) -> Any:
    raise JobRejected(INVALID_PAYLOAD,
                      f"message body contains {name}, which is not JSON (RFC 8259 has no "
                      "NaN, Infinity or -Infinity)")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise JobRejected(INVALID_PAYLOAD,
                          f"message body has the number {text[:40]}, beyond the range of a "
                          "JSON number (it would read as Infinity)")
    return value


_STRICT_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys,
                                   parse_constant=_refuse_constant, parse_float=_finite_float)


def check_strict_json(body: bytes | str) -> None:
    """Refuse, as ``INVALID_PAYLOAD``, a body that only lenient parsers read: not UTF-8,
    not JSON, ``NaN``/``Infinity``/``-Infinity`` or a number that overflows to them, or
    an object (at any depth) with a key twice."""
    try:
        text = body if isinstance(body, str) else bytes(body).decode()
    except UnicodeDecodeError:
        raise JobRejected(INVALID_PAYLOAD, "message body is not valid JSON (not UTF-8)") from None
    try:
        _STRICT_DECODER.decode(text)
    except RecursionError:
        raise JobRejected(INVALID_PAYLOAD, "message body is nested too deeply") from None
    except ValueError:
        raise JobRejected(INVALID_PAYLOAD, "message body is not valid JSON") from None


def parse_envelope(body: bytes | str) -> JobEnvelope:
    """Validate a message body as an OJS job, or raise :class:`JobRejected`.

    The body must be strict JSON (:func:`check_strict_json`).  A body without
    ``specversion`` is read as ``"1.0"``: the binding's own producer example
    (section 15.1) omits it, and the binding has one version.
    """
    check_strict_json(body)
    try:
        return JobEnvelope.model_validate_json(body)
    except ValidationError as exc:
        if _lacks_specversion(exc):
            return parse_envelope(_with_specversion(body))
        errors = exc.errors(include_url=False, include_input=False)
        if any(e["type"] == "json_invalid" for e in errors):
            raise JobRejected(INVALID_PAYLOAD, "message body is not valid JSON") from None
        summary = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in errors[:5]
        )
        raise JobRejected(INVALID_ENVELOPE, f"not a valid OJS job envelope ({summary})") from None


def _lacks_specversion(exc: ValidationError) -> bool:
    return any(e["type"] == "missing" and e["loc"] == ("specversion",) for e in exc.errors())


def _with_specversion(body: bytes | str) -> bytes:
    job = json.loads(body)
    job["specversion"] = SPEC_VERSION
    return _dumps(job)


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_signature(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("task"), str)


def _is_signatures(value: Any) -> bool:
    return isinstance(value, list) and all(_is_signature(item) for item in value)


def _is_time_limit(value: Any) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool)
                             and math.isfinite(value) and value >= 0)


#: Every ``x_celery`` entry Celery reads, with what it must be (``null`` always means
#: unset).  Other entries are custom headers (``apply_async(headers=...)``, stamps) and
#: may be any JSON value.
X_CELERY_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "kwargs": (lambda v: isinstance(v, dict), "an object"),
    "callbacks": (_is_signatures, "an array of signatures (objects with a string task)"),
    "errbacks": (_is_signatures, "an array of signatures (objects with a string task)"),
    "chain": (_is_signatures, "an array of signatures (objects with a string task)"),
    "chord": (_is_signature, "a signature (an object with a string task)"),
    "root_id": (_is_str, "a string"),
    "parent_id": (_is_str, "a string"),
    "group": (_is_str, "a string"),
    "group_index": (_is_count, "an integer >= 0"),
    "retries": (_is_count, "an integer >= 0"),
    "replaced_task_nesting": (_is_count, "an integer >= 0"),
    "timelimit": (lambda v: isinstance(v, list) and len(v) == 2 and all(map(_is_time_limit, v)),
                  "[hard, soft]: an array of two numbers of seconds >= 0 or nulls"),
    "shadow": (_is_str, "a string"),
    "argsrepr": (_is_str, "a string"),
    "kwargsrepr": (_is_str, "a string"),
    "origin": (_is_str, "a string"),
    "ignore_result": (lambda v: isinstance(v, bool), "true or false"),
    "stamps": (lambda v: isinstance(v, dict), "an object"),
    "stamped_headers": (lambda v: isinstance(v, list) and all(map(_is_str, v)),
                        "an array of strings"),
    "periodic_task_name": (_is_str, "a string"),
    "traceparent": (_is_str, "a string"),
    "tracestate": (_is_str, "a string"),
}
#: ``x_celery`` entries that are not allowed: what the envelope itself carries, and
#: what Celery's worker sets on a task request (never a message header).
X_CELERY_RESERVED: dict[str, str] = {
    "lang": "the consumer sets it",
    "task": "the envelope's type carries it",
    "id": "the envelope's id carries it",
    "eta": "the envelope's scheduled_at carries it",
    "expires": "the envelope's expires_at carries it",
    **dict.fromkeys(("args", "called_directly", "children", "correlation_id", "delivery_info",
                     "headers", "hostname", "is_eager", "logfile", "loglevel", "properties",
                     "reply_to", "soft_time_limit", "taskset", "time_limit", "utc",
                     "_children", "_protected"),
                    "the worker sets it on the task request; it is not a message header"),
}


def _consumer_computed(key: str) -> bool:
    """``x-ojs-*`` and ``ojs_*`` request headers are the consumer's own; a copy in
    ``x_celery`` (Celery's ``self.retry(args=...)`` forwards a request's custom
    headers) is stale and ignored."""
    return key.startswith(("x-ojs-", "ojs_"))


def check_x_celery(x_celery: Any) -> dict[str, Any]:
    """Validate the ``x_celery`` extension; return it, or raise ``INVALID_ENVELOPE``
    naming the entry, so that nothing unchecked reaches Celery's headers."""
    if not isinstance(x_celery, dict):
        raise JobRejected(INVALID_ENVELOPE, f"{X_CELERY} must be an object, "
                                            f"not {type(x_celery).__name__}")
    for key, value in x_celery.items():
        reserved = X_CELERY_RESERVED.get(key)
        if reserved is not None:
            raise JobRejected(INVALID_ENVELOPE, f"{X_CELERY}.{key} is not allowed: {reserved}")
        check = X_CELERY_FIELDS.get(key)
        if check is not None and value is not None and not check[0](value):
            raise JobRejected(INVALID_ENVELOPE,
                              f"{X_CELERY}.{key} must be {check[1]} (or null), got "
                              f"{_short_repr(value)}")
    return x_celery


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _builtin_refused(resolve_task: Callable[[str], str | None], job_type: str,
                     task_name: str) -> bool:
    """A job without ``x_celery`` (not Celery's own) that resolves to one of Celery's
    built-in tasks runs only where ``ojs_job_types`` maps that task onto its type."""
    if not task_name.startswith(CELERY_BUILTIN_PREFIX):
        return False
    registry = getattr(resolve_task, "__self__", None)
    if isinstance(registry, JobTypeRegistry):
        return not registry.maps_explicitly(task_name, job_type)
    return job_type == task_name


def decode_job_message(
    body: bytes | str,
    properties: Mapping[str, Any],
    *,
    resolve_task: Callable[[str], str | None],
    argsrepr: Callable[[Any], str] = repr,
    queue: str | None = None,
) -> IncomingJob:
    """Validate a consumed OJS job and build the Celery v2 headers and payload for it.

    Raises :class:`JobRejected`: ``UNSUPPORTED_CONTENT_TYPE``; ``INVALID_PAYLOAD`` for
    a body that is not strict JSON (:func:`check_strict_json`); ``INVALID_ENVELOPE``
    for an invalid envelope, an invalid ``x_celery`` (:func:`check_x_celery`) or, when
    ``queue`` (the OJS queue the message was consumed from) is given, an envelope
    naming another queue; ``UNKNOWN_JOB_TYPE`` for a type no task handles, and for a
    job without ``x_celery`` whose type is one of Celery's built-in tasks
    (``celery.group`` ...) unless ``ojs_job_types`` maps that task onto it
    (``resolve_task`` is then a :class:`~ojs_kombu.spec.job_types.JobTypeRegistry`'s
    ``task_for``; with any other callable, only a type other than the task's name does).
    """
    check_content_type(properties.get("content_type"), properties.get("content_encoding"))
    envelope = parse_envelope(body)
    if queue is not None and envelope.queue != queue:
        raise JobRejected(
            INVALID_ENVELOPE,
            f"the envelope's queue is {envelope.queue!r} but the job was consumed from queue "
            f"{queue!r}; a job runs only on the workers of its own queue (publish it with "
            f"routing key {envelope.queue!r})",
        )
    extra = envelope.model_extra or {}
    celery_job = X_CELERY in extra
    x_celery = check_x_celery(extra[X_CELERY]) if celery_job else {}
    task_name = resolve_task(envelope.type)
    if task_name is None:
        raise JobRejected(
            UNKNOWN_JOB_TYPE,
            f"no Celery task handles OJS type {envelope.type!r} on this worker",
        )
    if not celery_job and _builtin_refused(resolve_task, envelope.type, task_name):
        raise JobRejected(
            UNKNOWN_JOB_TYPE,
            f"OJS type {envelope.type!r} is Celery's built-in task {task_name!r}, which only "
            f"Celery's own canvas publishes (with {X_CELERY}); to let other producers run "
            f"it, map it: app.conf.ojs_job_types = {{{task_name!r}: 'your.type'}}",
        )

    amqp_headers = properties.get("application_headers") or {}
    attempt = amqp_headers.get("x-ojs-attempt")
    kwargs = x_celery.get("kwargs") or {}

    headers: dict[str, Any] = {
        **HEADER_DEFAULTS,
        "lang": "py",
        "root_id": envelope.id,
        "parent_id": None,
        "group": None,
        "retries": (attempt - 1) if isinstance(attempt, int) and attempt > 0 else 0,
        "timelimit": [envelope.timeout or None, None],
    }
    if x_celery.get("argsrepr") is None:
        headers["argsrepr"] = argsrepr(envelope.args)
    headers.update(
        (k, v) for k, v in x_celery.items()
        if v is not None and k != "kwargs" and k not in EMBED_KEYS and not _consumer_computed(k)
    )
    headers.update(
        (k, v) for k, v in amqp_headers.items() if isinstance(k, str) and k.startswith("x-ojs-")
    )
    own_retry: dict[str, Any] = {}
    if not celery_job and isinstance(amqp_headers.get("x-ojs-max-attempts"), int):
        # A foreign producer may state its budget in the header only (section 6.2).
        own_retry["max_attempts"] = amqp_headers["x-ojs-max-attempts"]
    retry = envelope.retry
    if retry is not None:  # the fields the job states (all of them JSON values already)
        own_retry.update((name, getattr(retry, name)) for name in retry.model_fields_set)
    if own_retry:
        headers[RETRY_HEADER] = own_retry
    if celery_job:
        headers[CELERY_JOB_HEADER] = True
    if "traceparent" not in headers:  # continue a producer's trace (AMQP-023)
        meta = envelope.meta or {}
        traceparent = (amqp_headers.get("x-ojs-trace-id") or amqp_headers.get("x-ojs-traceparent")
                       or meta.get("traceparent"))
        if isinstance(traceparent, str):
            headers["traceparent"] = traceparent
            tracestate = amqp_headers.get("x-ojs-trace-state") or meta.get("tracestate")
            if isinstance(tracestate, str):
                headers["tracestate"] = tracestate
    headers["task"] = task_name
    headers["id"] = envelope.id
    # Only a job still due later keeps an eta (the transport sends back any job
    # more than a moment early); a past scheduled_at would just cost Celery's ETA path.
    due = envelope.scheduled_at
    headers["eta"] = due.isoformat() if due is not None and due > datetime.now(UTC) else None
    headers["expires"] = envelope.expires_at.isoformat() if envelope.expires_at else None
    embed = {key: x_celery.get(key) for key in EMBED_KEYS}
    return IncomingJob(envelope=envelope, task_name=task_name, headers=headers,
                       payload=(envelope.args, kwargs, embed))


def celery_payload(body: bytes | str) -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
    """``(args, kwargs, embed)`` of an already validated OJS job body (the pool side)."""
    job = json.loads(body)
    x_celery = job.get(X_CELERY) or {}
    return (
        job["args"],
        x_celery.get("kwargs") or {},
        {key: x_celery.get(key) for key in EMBED_KEYS},
    )
