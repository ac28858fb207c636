"""Celery task ids as UUIDv7 OJS job ids.

Celery mints task ids with ``kombu.utils.uuid.uuid``, a UUIDv4 factory whose
generator is a default argument, so :func:`use_uuid7_task_ids` switches every
Celery id of the process to UUIDv7 in one place.  ``install()`` calls it; an
import changes nothing.
"""

from __future__ import annotations

import uuid

import uuid_utils
from kombu.utils.uuid import uuid as kombu_task_id


def _uuid7() -> uuid.UUID:
    return uuid.UUID(bytes=uuid_utils.uuid7().bytes)


def use_uuid7_task_ids() -> None:
    """Make kombu's (and so Celery's) task-id factory return UUIDv7 strings; idempotent."""
    kombu_task_id.__defaults__ = (_uuid7,)
