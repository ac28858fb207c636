"""Whether an app can run under ojs_kombu: :func:`check_app`, and the worker's preflight.

A worker whose tasks, queues or ``ojs_*`` settings cannot be mapped onto OJS
does not start; a project's own test suite can run the same checks.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, bootsteps

from ..amqp.broker.entities import JobQueue
from ..spec.errors import OJSConfigurationError
from .celery_seam import verify_result_backend
from .conf import pickle_settings
from .events import consumed_queues
from .expired import ExpiredResults
from .retries import RETRY_SEMANTICS, task_retry_policy, task_sets
from .task import OJSTask

logger = logging.getLogger(__name__)


def check_app(app: Celery) -> dict[str, str]:
    """Check that ``app`` can run under ojs_kombu; return ``{task name: OJS type}``.

    Raises the :class:`~ojs_kombu.spec.errors.OJSConfigurationError` subclass that
    names the first problem: pickle in ``accept_content``/``result_accept_content``
    or as the result or event serializer (set again after ``install()`` removed
    it), an unknown or invalid ``ojs_*`` setting, a queue that cannot be an OJS
    queue, a task without a valid OJS type, or two tasks claiming one type.
    """
    app.finalize(auto=True)
    insisting = pickle_settings(app.conf)
    if insisting:
        raise OJSConfigurationError(
            f"{', '.join(insisting)} name(s) pickle: ojs_kombu.install() removes it (a pickled "
            "message runs code in the worker), but it was set again after the app was "
            "configured; remove 'pickle' from accept_content/result_accept_content and use "
            "'json' as result_serializer/event_serializer")
    binding = app.amqp.binding
    queues = app.amqp.queues
    for queue in queues.values():  # bad ojs_queues / argument combinations fail here
        if isinstance(queue, JobQueue):
            binding.bounds(queue.ojs_queue)
    types = binding.job_types.validate()
    for name, task in app.tasks.items():
        for semantics in RETRY_SEMANTICS:  # raises RetryPolicyError for an invalid ojs_retry
            task_retry_policy(task, semantics)
        _check_acks(name, task)
        if not isinstance(task, OJSTask) and not name.startswith("celery."):
            logger.warning(
                "task %r does not derive from the app's Task (ojs_kombu.OJSTask): its "
                "failures are dead-lettered without OJS retries; derive its base class "
                "from app.Task", name)
    return types


def _check_acks(name: str, task: Any) -> None:
    """Per-task ack options that would ack a job before it succeeded lose it."""
    if getattr(task, "acks_late", True) is False:
        raise OJSConfigurationError(
            f"task {name!r} sets acks_late=False: an OJS job is acked only after it ran "
            "(a failed one is retried or dead-lettered); remove the option")
    for option in ("acks_on_failure_or_timeout", "acks_on_failure", "acks_on_timeout"):
        if getattr(task, option, None) is True and task_sets(task, option):
            raise OJSConfigurationError(
                f"task {name!r} sets {option}=True: a failed OJS job is retried or "
                "dead-lettered, never acked and dropped; remove the option")


class OJSPreflight(bootsteps.Step):
    """Worker bootstep: a worker that cannot speak OJS does not start; one that does
    tells callers of expired jobs (:class:`~ojs_kombu.celery.expired.ExpiredResults`)."""

    name = "ojs_kombu.preflight"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        check_app(parent.app)
        verify_result_backend(parent.app.backend)  # a Redis backend's hook, checked here
        # one line for the queues this worker consumes (-Q), not the app's whole table
        binding = parent.app.amqp.binding
        binding.warn_unbounded(consumed_queues(parent.app))
        binding.hook.add(ExpiredResults(parent.app))
        super().__init__(parent, **kwargs)
