"""UUIDv7 job ids.

OJS job ids are UUIDv7 (time-ordered).  Celery's ids become UUIDv7
too (:mod:`ojs_kombu.celery.task_ids`), so ``AsyncResult.id`` *is* the OJS job id.
"""

from __future__ import annotations

import uuid_utils

from .naming import is_job_id

__all__ = ["is_job_id", "new_job_id"]


def new_job_id() -> str:
    return str(uuid_utils.uuid7())
