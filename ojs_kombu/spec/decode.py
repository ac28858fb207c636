"""OJS job message -> Celery task protocol v2: the consume side.

Pure code.  The transport calls :func:`decode_job_message` on every consumed
message; the worker's pool turns the envelope back into Celery's
``(args, kwargs, embed)`` with :func:`celery_payload`.

Consuming is strict: the message must be an OJS job in strict JSON on its own
queue (:mod:`ojs_kombu.spec.strict_input`), ``x_celery`` valid
(:func:`~ojs_kombu.spec.x_celery.check_x_celery`), and a job from another
producer may not name one of Celery's built-in tasks; anything else is a
:class:`~ojs_kombu.spec.errors.JobRejected` with its code.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .envelope import JobEnvelope
from .errors import JobRejected
from .job_ids import JOB_ID_HEADER, TASK_ID_KEY
from .job_types import JobTypeRegistry
from .strict_input import INVALID_ENVELOPE, check_body_size, check_content_type, parse_envelope
from .times import celery_time
from .typed_values import (
    DEFAULT_MAX_TYPE_MAP_ENTRIES,
    TYPES_KEY,
    TypeMapError,
    check_type_map,
    check_type_map_size,
    restore,
)
from .unique import UNIQUE_HEADER, fingerprint
from .x_celery import EMBED_KEYS, HEADER_DEFAULTS, X_CELERY, check_x_celery, retypable

UNKNOWN_JOB_TYPE = "UNKNOWN_JOB_TYPE"
#: Celery header through which a consumed job's own retry policy reaches the task.
RETRY_HEADER = "ojs_retry"
#: Celery header set (``True``) on a consumed job that carries Celery's own data
#: (``x_celery``): a job a Celery producer published, whose failures may follow
#: Celery's retry rules (see ``ojs_retry_semantics``).  Absent on other producers' jobs.
CELERY_JOB_HEADER = "ojs_celery_job"
#: Task names of Celery's built-in tasks (``celery.chord_unlock``, ``celery.accumulate``,
#: ``celery.group``, ``celery.chain``, ``celery.chord``, ``celery.map``, ``celery.starmap``,
#: ``celery.chunks``, ``celery.backend_cleanup``) start with this.
CELERY_BUILTIN_PREFIX = "celery."
#: Celery's built-in task that polls a chord's header, retrying itself until the header
#: is ready (forever by Celery's default; ``ojs_chord_unlock_max_retries`` bounds it).
CHORD_UNLOCK = "celery.chord_unlock"


@dataclass(slots=True)
class IncomingJob:
    """A consumed OJS job, in the shape Celery's worker reads."""

    envelope: JobEnvelope
    task_name: str
    headers: dict[str, Any]
    payload: tuple[list[Any], dict[str, Any], dict[str, Any]]


#: ``x-ojs-*`` and ``ojs_*`` request headers are the consumer's own; a copy in
#: ``x_celery`` (Celery's ``self.retry(args=...)`` forwards a request's custom
#: headers) is stale and ignored.
_CONSUMER_PREFIXES = ("x-ojs-", "ojs_")
#: ``x_celery`` entries that are not Celery headers: its message body, and the task id
#: (the ``id`` header).
_CELERY_OWN = frozenset(("kwargs", *EMBED_KEYS, TASK_ID_KEY))


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
    max_type_map_entries: int = DEFAULT_MAX_TYPE_MAP_ENTRIES,
    max_job_bytes: int | None = None,
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
    ``TYPE_MAP_TOO_LARGE`` for a type map (``meta.x_celery_types``) of more than
    ``max_type_map_entries`` entries, or of more entries than values to type;
    ``JOB_TOO_LARGE`` for a body over ``max_job_bytes``, before it is parsed.
    """
    check_content_type(properties.get("content_type"), properties.get("content_encoding"))
    check_body_size(body, max_job_bytes)
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
    natural_kwargs = x_celery.get("kwargs") or {}
    args = envelope.args
    meta = envelope.meta
    if meta and TYPES_KEY in meta:  # values JSON has no type for: their Python types back
        try:
            types = meta[TYPES_KEY]
            members = {"args": args, X_CELERY: x_celery}
            check_type_map_size(types, members, max_type_map_entries)
            typed = restore(members, types, check_type_map(types, retypable))
        except TypeMapError as exc:
            raise JobRejected(INVALID_ENVELOPE, str(exc)) from None
        args, x_celery = typed["args"], typed[X_CELERY]
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
    task_id = x_celery.get(TASK_ID_KEY) or envelope.id

    headers: dict[str, Any] = {
        **HEADER_DEFAULTS,
        "lang": "py",
        "root_id": task_id,
        "parent_id": None,
        "group": None,
        "retries": (attempt - 1) if isinstance(attempt, int) and attempt > 0 else 0,
        "timelimit": [envelope.timeout or None, None],
        "stamps": {},  # a job's own: Celery's stamping writes into it
    }
    if x_celery.get("argsrepr") is None:
        headers["argsrepr"] = argsrepr(args)
    # Plain loops: this runs for every consumed job, on the worker's event-loop thread.
    for key, value in x_celery.items():
        if value is not None and key not in _CELERY_OWN and not key.startswith(_CONSUMER_PREFIXES):
            headers[key] = value
    for key, value in amqp_headers.items():
        if isinstance(key, str) and key.startswith("x-ojs-"):
            headers[key] = value
    own_retry: dict[str, Any] = {}
    if not celery_job and isinstance(amqp_headers.get("x-ojs-max-attempts"), int):
        # A foreign producer may state its budget in the header only (section 6.2).
        own_retry["max_attempts"] = amqp_headers["x-ojs-max-attempts"]
    retry = envelope.retry
    if retry is not None:  # the fields the job states (all of them JSON values already)
        stated, values = retry.model_fields_set, retry.__dict__
        own_retry.update(values if len(stated) == len(values)
                         else {name: values[name] for name in stated})
    if own_retry:
        headers[RETRY_HEADER] = own_retry
    if celery_job:
        headers[CELERY_JOB_HEADER] = True
    unique = envelope.unique
    if unique is not None:  # what the pool needs to keep the job's unique record current
        headers[UNIQUE_HEADER] = {
            "fingerprint": fingerprint(unique, job_type=envelope.type, queue=envelope.queue,
                                       args=envelope.args, kwargs=natural_kwargs,
                                       meta=envelope.meta),
            "policy": unique.model_dump(mode="json", exclude_unset=True),
            "scheduled_at": celery_time(envelope.scheduled_at),
        }
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
    headers["id"] = task_id
    if task_id != envelope.id:
        headers[JOB_ID_HEADER] = envelope.id
    # A scheduled job's due time, as Celery's request.eta shows it; the worker holds it
    # only while still due (JobRequest.eta): the broker delivered it when due.
    headers["eta"] = celery_time(envelope.scheduled_at)
    headers["expires"] = celery_time(envelope.expires_at)
    return IncomingJob(envelope=envelope, task_name=task_name, headers=headers,
                       payload=(args, kwargs, _embed(x_celery)))


def _embed(x_celery: dict[str, Any]) -> dict[str, Any]:
    """Celery's ``embed`` (callbacks, errbacks, chain, chord) from a job's ``x_celery``.

    :data:`EMBED_KEYS` spelt out: every consumed job builds one, and the literal
    is about four times faster than a comprehension over the keys."""
    get = x_celery.get
    return {"callbacks": get("callbacks"), "errbacks": get("errbacks"), "chain": get("chain"),
            "chord": get("chord")}


assert tuple(_embed({})) == tuple(EMBED_KEYS), "_embed spells out EMBED_KEYS, in order"


def celery_payload(body: bytes | str) -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
    """``(args, kwargs, embed)`` of an already validated OJS job body (the pool side)."""
    job = json.loads(body)
    args, x_celery = job["args"], job.get(X_CELERY) or {}
    meta = job.get("meta")
    if meta and TYPES_KEY in meta:
        typed = restore({"args": args, X_CELERY: x_celery}, meta[TYPES_KEY])
        args, x_celery = typed["args"], typed[X_CELERY]
    return (
        args,
        x_celery.get("kwargs") or {},
        _embed(x_celery),
    )
