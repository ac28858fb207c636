"""What a caller waiting on an expired job is told: Celery's ``REVOKED`` (``expired``).

A job whose ``expires_at`` passed before it started is dead-lettered as
``EXPIRED`` (section 5.5), by the transport when it arrives too late, before
Celery sees it.  Celery's own worker stores ``REVOKED`` for a task it finds
expired, so ``result.get()`` raises ``TaskRevokedError`` instead of waiting for
a result that never comes: :class:`ExpiredResults` stores the same.
"""

from __future__ import annotations

import logging
from datetime import datetime

from celery import Celery
from celery.backends.base import DisabledBackend
from celery.backends.rpc import RPCBackend

from ..events.job_info import JobInfo
from ..events.observer import Observer

logger = logging.getLogger(__name__)


class ExpiredResults(Observer):
    """Stores ``REVOKED`` (reason ``expired``) for each expired job of a task whose
    results are kept, in the app's result backend (not ``rpc://``: a revoked state
    there needs the caller's reply queue, which the dead-lettered job took along)."""

    def __init__(self, app: Celery) -> None:
        self._app = app

    def job_expired(self, job: JobInfo, created_at: datetime | None,
                    expired_at: datetime) -> None:
        app = self._app
        backend = app.backend
        if isinstance(backend, DisabledBackend | RPCBackend):
            return
        task = app.tasks.get(app.amqp.binding.job_types.task_for(job.job_type) or "")
        if task is None or (task.ignore_result and not task.store_errors_even_if_ignored):
            return
        backend.mark_as_revoked(job.job_id, "expired")
