"""The dead letters of an app's queue, through the app's own broker connection."""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from typing import Any

from celery import Celery
from celery.backends.base import DisabledBackend
from celery.backends.rpc import RPCBackend

from ..amqp.broker.connection import connect_on_demand
from ..amqp.broker.dead_letters import DeadLetterQueue, open_dead_letter_queue

logger = logging.getLogger(__name__)


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


def stored_failure(app: Celery, task_id: str) -> tuple[str, str] | None:
    """The exception type and message ``app``'s result backend keeps for ``task_id``.

    For a dead letter that does not say why (a job discarded with ``Basic.Nack``,
    ``ojs_dead_letter_mode="nack"``): the worker stored the failure as Celery does.
    ``None`` without a backend that keeps results (none, ``rpc://``: its result went
    to the caller), without a stored failure, or when the backend cannot be read.
    """
    backend = app.backend
    if isinstance(backend, DisabledBackend | RPCBackend):
        return None
    try:
        meta: dict[str, Any] = backend.get_task_meta(task_id)
    except Exception:  # a backend that is down must not stop the dead-letter tools
        logger.warning("cannot read the result of %s from the result backend", task_id,
                       exc_info=True)
        return None
    if meta.get("status") != "FAILURE":
        return None
    result = meta.get("result")
    if isinstance(result, BaseException):
        return type(result).__name__, str(result)
    if isinstance(result, dict) and result.get("exc_type"):
        return str(result["exc_type"]), str(result.get("exc_message") or "")
    return None
