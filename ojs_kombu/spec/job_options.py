"""The ``apply_async`` options an OJS job states, and the checks no envelope can fail.

Publishing is strict: a ``priority``, time limit, ``eta`` or ``expires`` an OJS
job cannot carry raises a :class:`~ojs_kombu.spec.errors.JobEncodeError`
subclass naming the option and the task, for a direct, batch or CLI publish alike.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from .errors import JobEncodeError, JobOptionError
from .times import parse_time

#: apply_async option carrying the OJS ``meta`` object (``apply_async(ojs_meta={...})``).
META_OPTION = "ojs_meta"
#: apply_async option carrying a per-call retry policy (``apply_async(ojs_retry={...})``).
RETRY_OPTION = "ojs_retry"
#: The OJS priorities a producer may publish (the range the spec says every
#: implementation must support; Celery's 0..9 fall inside it).
PRIORITY_MIN, PRIORITY_MAX = -100, 100


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


def time_option(value: Any, option: str) -> datetime:
    """Celery's ``eta``/``expires`` (ISO 8601 string or datetime; naive means UTC) as an
    aware datetime, or :class:`JobEncodeError` naming ``option``."""
    try:
        return parse_time(value)
    except (TypeError, ValueError) as exc:
        raise JobEncodeError(f"{option} {value!r} is not an ISO 8601 timestamp") from exc
