"""The dead letters of an app's queue, through the app's own broker connection."""

from __future__ import annotations

from contextlib import AbstractContextManager

from celery import Celery

from ..amqp.broker.connection import connect_on_demand
from ..amqp.broker.dead_letters import DeadLetterQueue, open_dead_letter_queue


def dead_letter_queue(app: Celery, queue: str) -> AbstractContextManager[DeadLetterQueue]:
    """The dead letters of ``queue``: ``with dead_letter_queue(app, "email") as dlq: ...``.

    ``dlq.list()``, ``dlq.get(ident)``, ``dlq.replay(ident)``, ``dlq.delete(ident)``,
    ``dlq.replay_all()``, ``dlq.purge()``, ``len(dlq)``; ``ident`` is a dead letter's
    OJS job id, the caller's Celery task id (``AsyncResult.id``, whatever it is) or its
    :attr:`~ojs_kombu.amqp.broker.dead_letters.DeadLetter.key`.  Each dead letter says
    why it died (``error_code``, ``error_type``, ``error_message``) and what makes it
    no job, if anything (``problems``).
    """
    connection = connect_on_demand(app.connection_for_write(), "dead letters")
    return open_dead_letter_queue(connection, queue)
