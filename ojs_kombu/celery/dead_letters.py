"""Dead-letter queues of a Celery app, each dead letter saying why it died.

A job discarded with ``Basic.Nack`` (``ojs_dead_letter_mode="nack"``, the default,
AMQP-009) reaches its DLQ as it was delivered: the broker adds no reason.  Its
last error is where Celery keeps it, the app's result backend (``FAILURE`` with
the exception, or ``REVOKED`` for a job that expired), so :func:`explained`
reads it there and names it with the error code the worker decided for it,
decided again by the one failure decision (:func:`ojs_kombu.spec.failures.decide`)
from what the backend stored and what the dead letter carries (its attempt, its
task's and its own retry policy).  Without a backend that keeps the failure the
dead letter stays ``not recorded`` (:data:`~ojs_kombu.spec.dead_letter.NOT_RECORDED`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

from celery import Celery
from celery.backends.base import DisabledBackend
from celery.backends.rpc import RPCBackend

from ..amqp.broker.connection import connect_on_demand
from ..amqp.broker.dead_letters import (
    DeadLetter,
    DeadLetterQueue,
    Explain,
    open_dead_letter_queue,
)
from ..spec.dead_letter import NOT_RECORDED, Why
from ..spec.decode import decode_job_message
from ..spec.failures import (
    EXPIRED,
    HANDLER_ERROR,
    Action,
    Delivered,
    Happened,
    JobFailure,
    decide,
)
from .retries import failure_retryable, happened_of, job_retry_policy

logger = logging.getLogger(__name__)

#: ``Why.source`` of a dead letter whose last error the result backend gave.
RESULT_BACKEND = "result backend"


def dead_letter_queue(app: Celery, queue: str) -> AbstractContextManager[DeadLetterQueue]:
    """The dead letters of ``queue``: ``with dead_letter_queue(app, "email") as dlq: ...``.

    ``dlq.list()``, ``dlq.get(ident)``, ``dlq.replay(ident)``, ``dlq.delete(ident)``,
    ``dlq.replay_all()``, ``dlq.purge()``, ``len(dlq)``; ``ident`` is a dead letter's
    OJS job id, the caller's Celery task id (``AsyncResult.id``, whatever it is) or its
    :attr:`~ojs_kombu.amqp.broker.dead_letters.DeadLetter.key`.  Each dead letter says
    why it died (``error_code``, ``error_type``, ``error_message``; a nacked one from
    ``app``'s result backend, see :func:`explained`) and what makes it no job, if
    anything (``problems``).
    """
    connection = connect_on_demand(app.connection_for_write(), "dead letters")
    return open_dead_letter_queue(connection, queue, explained(app))


def explained(app: Celery) -> Explain:
    """Completes the ``why`` of a nacked dead letter from ``app``'s result backend.

    A dead letter that says why already (its headers, ``x-death``) is left as it is;
    so is one whose failure the backend does not keep (none, ``rpc://``: its result
    went to the caller, ``task_ignore_result``, or a backend that cannot be read)."""
    def explain(dead: DeadLetter) -> DeadLetter:
        why = dead.why
        if why.source not in (NOT_RECORDED, "expires_at") or not dead.task_id:
            return dead
        meta = _stored(app, dead.task_id)
        if meta is None:
            return dead
        exc = _exception(meta.get("result"))
        if exc is None:
            return dead
        if meta.get("status") == "REVOKED":  # how Celery records a job that expired
            if why.code != EXPIRED:
                return dead
            return replace(dead, why=replace(why, type=_type_name(exc)))
        if meta.get("status") != "FAILURE" or why.code is not None:
            return dead
        failure = JobFailure.from_exception(exc, failure_code(app, dead, exc))
        return replace(dead, why=Why(failure.code, failure.message, failure.type,
                                     RESULT_BACKEND, why.earlier))
    return explain


def failure_code(app: Celery, dead: DeadLetter, exc: BaseException) -> str:
    """The error code the worker gave the discarded job whose last attempt raised ``exc``:
    :func:`~ojs_kombu.spec.failures.decide` under the job's retry policy, as the worker
    decided it (``HANDLER_TIMEOUT``, ``NON_RETRYABLE_ERROR``, ``HANDLER_ERROR``)."""
    attempt = dead.attempt or 1
    task, request = _task_and_request(app, dead)
    failure = JobFailure.from_exception(exc)
    happened = happened_of(exc)
    if happened is not Happened.HANDLER_ERROR:  # a time limit or a lost pool process
        delivered = Delivered(happened, failure, retryable=False)
        max_attempts = attempt
    elif task is None:  # its task is not in the app: no policy to judge it by
        return HANDLER_ERROR
    else:
        policy = job_retry_policy(task, request)
        delivered = Delivered(Happened.HANDLER_ERROR, failure,
                              retryable=failure_retryable(task, exc, policy, request))
        max_attempts = policy.max_attempts
    outcome = decide(delivered, attempt, max_attempts)
    # a failure the policy would still retry was discarded for want of attempts
    if outcome.action is Action.DEAD_LETTER and outcome.failure is not None:
        return outcome.failure.code
    return HANDLER_ERROR


def _task_and_request(app: Celery, dead: DeadLetter) -> tuple[Any, Mapping[str, Any]]:
    """The task that ran the job and the Celery request headers its delivery made."""
    try:
        job = decode_job_message(
            dead.body, {"content_type": dead.content_type,
                        "application_headers": dead.headers},
            resolve_task=app.amqp.binding.job_types.task_for)
    except Exception:  # not a job this app runs: judged without a policy
        return None, {}
    return app.tasks.get(job.task_name), job.headers


def _stored(app: Celery, task_id: str) -> dict[str, Any] | None:
    backend = app.backend
    if isinstance(backend, DisabledBackend | RPCBackend):
        return None
    try:
        meta: dict[str, Any] = backend.get_task_meta(task_id)
    except Exception:  # a backend that is down must not stop the dead-letter tools
        logger.warning("cannot read the result of %s from the result backend", task_id,
                       exc_info=True)
        return None
    return meta


def _exception(result: object) -> BaseException | None:
    """The stored exception (a backend that could not rebuild it keeps its type name)."""
    if isinstance(result, BaseException):
        return result
    if isinstance(result, dict) and result.get("exc_type"):
        kind = type(str(result["exc_type"]), (Exception,), {})
        message = result.get("exc_message")
        return kind(*message) if isinstance(message, list | tuple) else kind(message or "")
    return None


def _type_name(exc: BaseException) -> str:
    return getattr(exc, "exc_cls_name", None) or type(exc).__name__
