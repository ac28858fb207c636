"""UUIDv7 job ids.

OJS job ids are UUIDv7 (time-ordered).  Celery mints task ids with
``kombu.utils.uuid.uuid``, a UUIDv4 factory whose generator is a default
argument, so :func:`use_uuid7_task_ids` can switch every Celery id in the
process to UUIDv7 in one place: ``AsyncResult.id`` then *is* the OJS job id.
"""

from __future__ import annotations

import uuid

import uuid_utils
from kombu.utils.uuid import uuid as kombu_task_id

from .naming import is_job_id

__all__ = ["is_job_id", "new_job_id", "use_uuid7_task_ids"]


def new_job_id() -> str:
    return str(uuid_utils.uuid7())


def _uuid7() -> uuid.UUID:
    return uuid.UUID(bytes=uuid_utils.uuid7().bytes)


def use_uuid7_task_ids() -> None:
    """Make kombu's (and so Celery's) task-id factory return UUIDv7 strings; idempotent."""
    kombu_task_id.__defaults__ = (_uuid7,)
