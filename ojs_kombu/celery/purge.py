"""``celery purge`` under ojs_kombu: its queue names are the app's Celery queue names.

Celery's command passes the names of the app's queue table (``celery``, ``email``)
or ``-Q``'s to ``channel.queue_purge`` one by one; under ojs_kombu the jobs of
``email`` are in ``ojs.queue.email``.  The command, and only it, runs inside
:func:`~ojs_kombu.amqp.channel.celery_queue_names`, so that the ``ojs`` channel
purges the job queue of each name (a name without a job queue, a plain Celery
queue not yet migrated, as named).  Every other call, kombu's
``channel.queue_purge('pq')`` and ``Queue('pq').purge()`` included, purges the
queue it names; ``app.control.purge()`` purges the app's job queues by their
AMQP names (``ojs.queue.email``) and needs nothing here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..amqp.channel import celery_queue_names
from .celery_seam import around_purge_command


def _with_celery_queue_names(callback: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(callback)
    def purge(*args: Any, **kwargs: Any) -> Any:
        with celery_queue_names():
            return callback(*args, **kwargs)
    return purge


def wire_purge_command() -> None:
    """Make ``celery purge`` purge the job queues of the Celery queue names it gets."""
    around_purge_command(_with_celery_queue_names)
