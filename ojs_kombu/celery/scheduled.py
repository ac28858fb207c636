"""A delayed job the producer recorded as it published it: Celery's ``PENDING`` with
the job's ``scheduled_at``.

A job published with ``countdown``/``eta`` waits in the broker's schedule
(:mod:`ojs_kombu.spec.delays`), in no worker's memory and in no result
backend, so INFO (section 5.8) could not tell it from a job nobody sent.  With
a result backend, and a task that keeps its result, the producer writes
``PENDING`` (the state Celery shows for such a job) with the job's
``scheduled_at`` as its result *before* publishing it: a worker
can only write its own states after the job exists, so the producer never
overwrites them, even for a delay of a millisecond.  A failed publish forgets
the record again.  A failing backend never stops a publish: the job matters
more than its status, and the warning says what INFO will miss.

Retries (``retries`` > 0) are not recorded: the worker that retried the job
already wrote ``RETRY`` and remembers it as ``retryable``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from celery import Celery, states
from celery.backends.base import DisabledBackend
from celery.backends.rpc import RPCBackend

from ..spec.job_options import time_option
from ..spec.times import format_time

logger = logging.getLogger(__name__)

#: The key of a ``PENDING`` record's result that makes it a job waiting for its
#: ``scheduled_at`` in the broker.
SCHEDULED_AT = "ojs_scheduled_at"


def recorded_scheduled_at(state: str | None, result: Any) -> str | None:
    """The ``scheduled_at`` of a job its producer recorded as scheduled, from the state
    and result a result backend holds for it; ``None`` for any other record."""
    if state == states.PENDING and isinstance(result, dict):
        value = result.get(SCHEDULED_AT)
        return value if isinstance(value, str) else None
    return None


def wants_record(app: Celery, ignore_result: bool | None) -> bool:
    """Whether a job's states are kept in a result backend a worker can look up: not
    ``rpc://``, whose states travel only to the caller's reply queue."""
    if ignore_result is None:
        ignore_result = bool(app.conf.task_ignore_result)
    return not ignore_result and not isinstance(app.backend, DisabledBackend | RPCBackend)


def scheduled_at_of(headers: Mapping[str, Any]) -> str | None:
    """The ``scheduled_at`` (RFC 3339, as the envelope carries it) of a first attempt
    that is still in the future, from Celery's task message headers; else ``None``."""
    eta = headers.get("eta")
    if not eta or headers.get("retries"):
        return None
    try:
        due = time_option(eta, "eta")
    except ValueError:  # the encoder refuses it with its own error
        return None
    return format_time(due) if due > datetime.now(UTC) else None


def record_scheduled(app: Celery, job_id: str, scheduled_at: str) -> bool:
    """Record ``job_id`` as scheduled; ``False`` (with a warning) when the backend
    failed, so there is nothing to forget."""
    try:
        app.backend.store_result(job_id, {SCHEDULED_AT: scheduled_at}, states.PENDING)
    except Exception as exc:
        logger.warning("job %s: the result backend did not record it as scheduled (%s); "
                       "INFO will not know it until a worker holds it", job_id, exc)
        return False
    return True


def forget_scheduled(app: Celery, job_ids: list[str]) -> None:
    """Drop the scheduled records of jobs whose publish failed, unless a worker wrote a
    state of its own since (a publish can fail after the broker took it)."""
    backend = app.backend
    for job_id in job_ids:
        try:
            meta = backend.get_task_meta(job_id, cache=False)
            if recorded_scheduled_at(meta.get("status"), meta.get("result")) is not None:
                backend.forget(job_id)
        except Exception as exc:
            logger.warning("job %s was not published, but its scheduled record could not "
                           "be removed (%s): INFO may answer scheduled for it", job_id, exc)
