"""``x_celery``: what Celery needs of a job and OJS has no attribute for.

One extension attribute of the envelope (unknown top-level attributes are
preserved by every OJS consumer) carries:

* ``kwargs``, and the canvas element ``callbacks``, ``errbacks``, ``chain``, ``chord``;
* every Celery header that is not mapped onto an OJS attribute (``root_id``,
  ``parent_id``, ``group``, ``group_index``, ``retries``, ``timelimit``,
  ``shadow``, ``argsrepr``, ``kwargsrepr``, ``origin``, ``ignore_result``,
  ``stamps``, custom headers ...), leaving out ``None`` and Celery's defaults
  (:data:`HEADER_DEFAULTS`, and a ``root_id`` equal to the job id), which the
  consumer restores.

:func:`x_celery_of` writes it for every publish path; :func:`check_x_celery`
validates a consumed one before anything of it reaches Celery's headers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from .errors import JobRejected
from .job_ids import JOB_ID_HEADER, TASK_ID_KEY
from .strict_input import INVALID_ENVELOPE

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


def x_celery_of(headers: Mapping[str, Any], *, job_id: str, task_id: str | None = None,
                kwargs: Any = None, embed: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``x_celery`` of a job: its Celery ``headers`` without what the envelope
    carries, ``None`` and the defaults the consumer restores, then ``kwargs`` and the
    canvas elements of ``embed`` that are set.  A ``task_id`` other than ``job_id``
    travels as ``task_id`` (:func:`~ojs_kombu.spec.job_ids.job_id_for`)."""
    x_celery = {
        k: v for k, v in headers.items()
        if k not in MAPPED_HEADERS and v is not None
        and (k not in HEADER_DEFAULTS or HEADER_DEFAULTS[k] != v)
    }
    x_celery.pop(JOB_ID_HEADER, None)  # the consumed job's own: its id is the envelope's
    if task_id is not None and task_id != job_id:
        x_celery[TASK_ID_KEY] = task_id
    if x_celery.get("root_id") == (task_id or job_id):
        del x_celery["root_id"]
    if x_celery.get("timelimit") == [None, None]:
        del x_celery["timelimit"]
    if kwargs:
        x_celery["kwargs"] = kwargs
    for key in EMBED_KEYS:
        value = (embed or {}).get(key)
        if value is not None:
            x_celery[key] = value
    return x_celery


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
    TASK_ID_KEY: (lambda v: isinstance(v, str) and v != "",
                  "a non-empty string (the Celery task id, when it is not the job's id)"),
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
    "eta": "the envelope's scheduled_at carries it",
    "expires": "the envelope's expires_at carries it",
    "compression": "OJS job bodies are plain JSON, never compressed",
    **dict.fromkeys(("args", "called_directly", "children", "correlation_id", "delivery_info",
                     "headers", "hostname", "is_eager", "logfile", "loglevel", "properties",
                     "reply_to", "soft_time_limit", "taskset", "time_limit", "utc",
                     "_children", "_protected"),
                    "the worker sets it on the task request; it is not a message header"),
}


#: Signature fields a type map may point into (a canvas signature's call).
_SIGNATURE_CALL = ("args", "kwargs", "options")


def retypable(parts: list[str]) -> bool:
    """Whether a type map may point at ``parts`` (a parsed JSON Pointer into the
    envelope): an argument (``args/i``), a keyword argument (``x_celery/kwargs/k``), a
    custom header (``x_celery/h``, not one Celery reads) or a canvas signature's args,
    kwargs or options (``x_celery/chain/i/args/j``, ``x_celery/chord/kwargs/k``), or
    anything inside them; never a field Celery reads, and never a whole container."""
    root, rest = parts[0], parts[1:]
    if root == "args":
        return len(rest) >= 1
    if root != X_CELERY or not rest:
        return False
    field, below = rest[0], rest[1:]
    if field == "kwargs":
        return len(below) >= 1
    if field in ("callbacks", "errbacks", "chain"):
        return len(below) >= 3 and below[1] in _SIGNATURE_CALL
    if field == "chord":
        return len(below) >= 2 and below[0] in _SIGNATURE_CALL
    return field not in X_CELERY_FIELDS and field not in X_CELERY_RESERVED


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
