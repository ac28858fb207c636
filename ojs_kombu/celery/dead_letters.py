"""The dead letters of an app's queue, through the app's own broker connection."""

from __future__ import annotations

from contextlib import AbstractContextManager

from celery import Celery

from ..amqp.broker.connection import connect_on_demand
from ..amqp.broker.dead_letters import DeadLetterQueue, open_dead_letter_queue


def dead_letter_queue(app: Celery, queue: str) -> AbstractContextManager[DeadLetterQueue]:
    """The dead letters of ``queue``: ``with dead_letter_queue(app, "email") as dlq: ...``.

    ``dlq.list()``, ``dlq.get(job_id)``, ``dlq.replay(job_id)``,
    ``dlq.replay_all()``, ``dlq.purge()``, ``len(dlq)``.
    """
    connection = connect_on_demand(app.connection_for_write(), "dead letters")
    return open_dead_letter_queue(connection, queue)
