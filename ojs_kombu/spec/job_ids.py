"""UUIDv7 job ids, and how a Celery task id relates to the OJS job id.

OJS job ids are UUIDv7 (time-ordered).  Celery's ids become UUIDv7 too
(:mod:`ojs_kombu.celery.task_ids`), so ``AsyncResult.id`` *is* the OJS job id.
Celery accepts any string as a task id (``apply_async(task_id="report-42")``,
``str(uuid.uuid4())``); the one rule (:func:`job_id_for`): a task id that is a
lowercase UUIDv7 is the OJS id; any other is carried as ``x_celery.id`` of
a job whose OJS id is a new UUIDv7.  Celery (results, revoke, events, Flower)
sees the task id; OJS (``message_id``, CANCEL, INFO, dead letters) the job id,
and CANCEL and INFO take either.
"""

from __future__ import annotations

import uuid_utils

from .naming import is_job_id

__all__ = ["JOB_ID_HEADER", "TASK_ID_KEY", "is_job_id", "is_task_id", "job_id_for",
           "new_job_id"]

#: ``x_celery`` entry: the Celery task id of a job whose task id is not its OJS id (Celery's
#: own ``id`` header, which the envelope's ``id`` carries otherwise).
TASK_ID_KEY = "id"
#: Celery header of a consumed job whose task id is not its OJS id: the OJS id, so that
#: ``self.retry(args=...)`` (Celery forwards the request's headers) keeps it.
JOB_ID_HEADER = "ojs_job_id"


#: The longest task id CANCEL and INFO take (an AMQP short string holds 255 bytes).
TASK_ID_MAX = 255


def is_task_id(value: object) -> bool:
    """Whether ``value`` can name a job in CANCEL and INFO: its OJS id, or any Celery task
    id (a non-empty string of printable characters, at most :data:`TASK_ID_MAX`)."""
    return isinstance(value, str) and 0 < len(value) <= TASK_ID_MAX and value.isprintable()


def new_job_id() -> str:
    return str(uuid_utils.uuid7())


def job_id_for(task_id: str, carried: object = None) -> str:
    """The OJS id of a job with Celery task id ``task_id``: ``carried`` (the id of the job a
    retry with new arguments replaces, when its ids differ) when it is a UUIDv7, else the
    task id when it is a lowercase UUIDv7, else a new UUIDv7."""
    if isinstance(carried, str) and is_job_id(carried):
        return carried
    if is_job_id(task_id):
        return task_id
    return new_job_id()
