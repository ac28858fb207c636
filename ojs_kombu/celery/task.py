"""The task base under ojs_kombu: what a task does for its OJS job in the pool.

A failed attempt is settled by the broker, never by waiting in the worker.  The
pool runs the task and reports how it ended; the worker's main process decides
what becomes of the job, once (:mod:`ojs_kombu.celery.request`).  One verdict
must be reached here, because Celery's tracer acts on it in the pool before the
main process hears of the attempt: whether a task's exception is retried.  A
``Retry`` makes the result backend say ``RETRY`` and fires ``task_retry`` and the
task's ``on_retry``; any other exception says ``FAILURE``, fires ``task_failure``,
``on_failure``, the ``link_error`` errbacks and fails a chord.  So
:class:`OJSTask` turns an exception the job's rules retry
(:mod:`ojs_kombu.celery.retries`) into Celery's ``Retry`` *without* publishing
anything, ``self.retry()`` checks its limit where Celery's API raises
``MaxRetriesExceededError`` (in the task), and an exception it does not retry
carries the reason (:func:`not_retried_code`).  ``self.ojs`` (:class:`JobContext`)
is what a running job tells the world: its progress, and whether a CANCEL
reached it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from celery import Task
from celery.exceptions import Ignore, Reject, Retry
from celery.utils.serialization import raise_with_context
from celery.worker import state as worker_state

from ..events.job_info import JobInfo
from ..spec.decode import CHORD_UNLOCK
from ..spec.envelope import RetryPolicy
from ..spec.failures import HANDLER_ERROR, NON_RETRYABLE_ERROR
from ..spec.job_ids import JOB_ID_HEADER
from ..spec.retry import Backoff
from ..spec.unique import IDEMPOTENCY_HEADER, UNIQUE_HEADER
from .control import cancel_requested
from .dedup import check_unique, guard
from .eager import eager_encode, encode_eager_call
from .retries import failure_retryable, follows_celery_retries, job_retry_policy

logger = logging.getLogger(__name__)

#: ``Retry.message`` of a retry whose new message Celery already published.
REPUBLISHED = "ojs_kombu: published by Celery's retry"
_ATTEMPT_HEADER = "x-ojs-attempt"
_KEY_HEADER = IDEMPOTENCY_HEADER
#: Attribute of an exception the pool did not retry: why (the error code its dead
#: letter carries); it travels with the pickled exception to the main process.
_NOT_RETRIED = "ojs_error_code"
#: Request flag: ``self.retry()`` ran out of retries in this attempt.
_EXHAUSTED = "ojs_retries_exhausted"


def not_retried_code(exc: BaseException) -> str | None:
    """The pool's reason for not retrying ``exc`` (``HANDLER_ERROR``: no attempt or
    retry left; ``NON_RETRYABLE_ERROR``: the job's rules do not retry it), or ``None``
    when the report lost it (an exception Celery could only send as its repr, or one
    without a ``__dict__``)."""
    code = getattr(exc, _NOT_RETRIED, None)
    return code if code in (HANDLER_ERROR, NON_RETRYABLE_ERROR) else None


class JobCancelled(Ignore):
    """The running job saw a CANCEL (``self.ojs.cancelled``) and stopped: acked, not
    failed (Celery's ``Ignore``), reported as cancelled."""


class JobContext:
    """``self.ojs`` inside a task: what the running job can tell the world."""

    def __init__(self, task: Task) -> None:
        self.task = task

    def info(self) -> JobInfo:
        request = self.task.request
        queue = (request.delivery_info or {}).get("routing_key") or ""
        binding = self.task.app.amqp.binding
        job_id = getattr(request, JOB_ID_HEADER, None) or request.id  # the OJS id
        return JobInfo.from_headers(job_id, binding.job_types.type_for(self.task.name),
                                    queue, vars(request))

    @property
    def cancelled(self) -> bool:
        """Whether a CANCEL reached the running job (cooperative cancelling: check it in
        long loops and return early; any pool: prefork processes are signalled).

        A job that saw ``True`` here ends as cancelled however it ends (returns or
        raises): ``REVOKED`` in the result backend, ``job.cancelled``, INFO
        ``cancelled``; its return value is dropped.
        """
        request = self.task.request
        if request.id in worker_state.revoked or cancel_requested.is_set():
            request.ojs_cancel_seen = True
            return True
        return False

    def progress(self, percent: float, message: str | None = None) -> None:
        """Emit ``job.progress`` (0 to 100 percent, and an optional message)."""
        if not 0 <= percent <= 100:
            raise ValueError(f"progress must be between 0 and 100, not {percent}")
        self.task.app.amqp.binding.hook.job_progress(
            self.info(), self.task.request.hostname or "", percent, message)


class OJSTask(Task):
    """Base of every task under ojs_kombu (``install()`` makes it the app's ``Task``)."""

    Request = "ojs_kombu.celery.request:JobRequest"
    #: Task option: an OJS retry-policy object merged over the Celery-derived one;
    #: giving it (``{}`` too) puts the task under OJS retry semantics.
    ojs_retry: Mapping[str, Any] | None = None
    #: Task option: an OJS unique policy (``{"keys": ["type", "args"], "period":
    #: "PT1H"}``) for every job of the task (``apply_async(ojs_unique=...)`` per call).
    ojs_unique: Mapping[str, Any] | None = None
    #: Task option: ``True`` (the job id is the key) or ``staticmethod(lambda args,
    #: kwargs: ...)``; a job with a key runs at most once per key
    #: (``apply_async(ojs_idempotency_key="...")`` per call).
    ojs_idempotency_key: Any = None

    @property
    def ojs(self) -> JobContext:
        """``self.ojs.progress(50, "halfway")`` in a bound task."""
        return JobContext(self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly:
            return super().__call__(*args, **kwargs)
        # A cooperative cancel of the pool process's previous job must not reach
        # this one.  Here rather than in a task_prerun receiver: with a receiver
        # Celery sends that signal for every job (a few microseconds each).
        cancel_requested.clear()
        if not _delivered_by_ojs(request):
            return super().__call__(*args, **kwargs)
        if getattr(request, _KEY_HEADER, None) is not None or \
                getattr(request, UNIQUE_HEADER, None) is not None:
            return guard(self, request, lambda: self._run_job(request, args, kwargs))
        return self._run_job(request, args, kwargs)

    def _run_job(self, request: Any, args: Any, kwargs: Any) -> Any:
        try:
            result = self.run(*args, **kwargs)
        except (Retry, Ignore, Reject):
            raise
        except Exception as exc:
            if getattr(request, "ojs_cancel_seen", False):
                raise self._stopped_on_cancel(request) from exc
            retry = self._broker_retry(request, exc)
            if retry is not None:
                raise retry from exc
            # Never lose the task's own exception over its reason (an exception without
            # a __dict__ reports none; the main process then names it by the attempts left).
            with contextlib.suppress(Exception):
                setattr(exc, _NOT_RETRIED, self._why_not_retried(request))
            raise
        if getattr(request, "ojs_cancel_seen", False):
            raise self._stopped_on_cancel(request)
        return result

    def _broker_retry(self, request: Any, exc: Exception) -> Retry | None:
        """The retry of a failed attempt, if the job's rules give it one.

        Under Celery's semantics the retries Celery makes (``autoretry_for``,
        ``self.retry()``) were asked for already: what reaches here is not retried;
        neither is what ``self.retry()`` raised out of retries (its verdict stands)."""
        headers = vars(request)
        if follows_celery_retries(self, headers) or getattr(request, _EXHAUSTED, False):
            return None
        policy = job_retry_policy(self, headers)
        if not failure_retryable(self, exc, policy, headers):
            return None
        return self._ojs_retry(request, policy, exc, None, None)

    def _why_not_retried(self, request: Any) -> str:
        """``HANDLER_ERROR`` when the attempts (or ``self.retry()``'s retries) are used
        up, else ``NON_RETRYABLE_ERROR``: the job's rules do not retry this failure."""
        attempt = (request.retries or 0) + 1
        if getattr(request, _EXHAUSTED, False) or \
                attempt >= job_retry_policy(self, vars(request)).max_attempts:
            return HANDLER_ERROR
        return NON_RETRYABLE_ERROR

    def _stopped_on_cancel(self, request: Any) -> JobCancelled:
        """The job saw a CANCEL and stopped: ``REVOKED`` in the result backend (as Celery
        records a job revoked before it started), then :class:`JobCancelled`."""
        if not request.ignore_result:
            try:
                self.backend.mark_as_revoked(request.id, "cancelled while running",
                                             request=request)
            except Exception:
                logger.exception("job %s: could not record its cancellation", request.id)
        return JobCancelled(f"job {request.id} stopped on a CANCEL")

    def apply(self, args: Any = None, kwargs: Any = None, link: Any = None,
              link_error: Any = None, task_id: str | None = None, *rest: Any,
              **options: Any) -> Any:
        """Celery's eager run; with ``ojs_eager_encode`` the call is first encoded as its
        publish would be (:mod:`ojs_kombu.celery.eager`), raising what a publish raises."""
        if eager_encode(self.app):
            encode_eager_call(self, args, kwargs, task_id, link, link_error, options)
        return super().apply(args, kwargs, link, link_error, task_id, *rest, **options)

    def apply_async(self, args: Any = None, kwargs: Any = None, task_id: str | None = None,
                    producer: Any = None, link: Any = None, link_error: Any = None,
                    shadow: str | None = None, **options: Any) -> Any:
        """Celery's ``apply_async``; a unique or keyed call is checked against the dedup
        store first (:func:`~ojs_kombu.celery.dedup.check_unique`).  Eager with
        ``ojs_eager_encode``: encoded first, before Celery serialises the arguments
        itself (its ``EncodeError`` would hide the publish's typed error)."""
        if self.app.conf.task_always_eager and eager_encode(self.app):
            encode_eager_call(self, args, kwargs, task_id, link, link_error, options)
        unique = check_unique(self, args, kwargs, task_id, options)
        if unique is None:
            return super().apply_async(args, kwargs, task_id, producer, link, link_error,
                                       shadow, **options)
        if unique.existing is not None:
            return self.AsyncResult(unique.existing)
        try:
            return super().apply_async(args, kwargs, unique.job_id, producer, link, link_error,
                                       shadow, **unique.options)
        except BaseException:
            unique.release()
            raise

    def retry(self, args: Any = None, kwargs: Any = None, exc: BaseException | None = None,
              throw: bool = True, eta: datetime | None = None, countdown: float | None = None,
              max_retries: int | None = None, **options: Any) -> Any:
        """Ask for a broker-side retry; nothing is published from the task.

        New ``args``/``kwargs`` or routing options make it a new message, which
        Celery's own ``retry`` publishes (the broker still holds it until due).
        Under Celery's retry semantics (:func:`follows_celery_retries`) the limit
        and the delay are Celery's: ``max_retries`` (the argument, else the task's;
        ``None``: unbounded), then ``eta``, ``countdown`` or ``default_retry_delay``;
        out of retries it re-raises ``exc`` or raises ``MaxRetriesExceededError``,
        as Celery does.  Under OJS semantics the job's policy gives both.
        """
        request = self.request
        if request.called_directly or not _delivered_by_ojs(request):
            return super().retry(args, kwargs, exc, throw, eta, countdown, max_retries,
                                 **options)
        if max_retries is None and self.max_retries is None and self.name == CHORD_UNLOCK:
            # Celery polls a chord's header forever; a job naming a chord that never
            # completes (forged by a producer, or its header lost) must end.
            max_retries = self.app.amqp.binding.settings.chord_unlock_max_retries
        if args is not None or kwargs is not None or options:
            # Celery publishes the new message itself; mark the Retry so the worker
            # only acks this delivery instead of republishing it too.
            try:
                ret = super().retry(args, kwargs, exc, throw, eta, countdown, max_retries,
                                    **options)
            except Retry as retry:
                raise Retry(REPUBLISHED, retry.exc, retry.when) from exc
            except BaseException:  # out of retries (Celery raised exc or its own error)
                setattr(request, _EXHAUSTED, True)
                raise
            return Retry(REPUBLISHED, ret.exc, ret.when)
        if follows_celery_retries(self, vars(request)):
            return self._celery_retry(request, exc, throw, eta, countdown, max_retries)
        policy = job_retry_policy(self, vars(request))
        if max_retries is not None:
            policy = policy.model_copy(update={"max_attempts": max_retries + 1})
        ret = self._ojs_retry(request, policy, exc, eta, countdown)
        if ret is None:
            setattr(request, _EXHAUSTED, True)
            if exc is not None:
                raise exc
            raise self.MaxRetriesExceededError(
                f"Can't retry {self.name}[{request.id}]: {(request.retries or 0) + 1} of "
                f"{policy.max_attempts} attempts used")
        if throw:
            raise ret
        return ret

    @staticmethod
    def _ojs_retry(request: Any, policy: RetryPolicy, exc: BaseException | None,
                   eta: datetime | None, countdown: float | None) -> Retry | None:
        """The OJS retry of this attempt under ``policy``; ``None`` when it was the last."""
        attempt = (request.retries or 0) + 1
        if attempt >= policy.max_attempts:
            return None
        when: float | datetime
        if eta is not None:
            when = eta
        elif countdown is not None:
            when = countdown
        else:
            when = Backoff.of(policy).delay(attempt)
        return Retry(exc=exc, when=when)

    def _celery_retry(self, request: Any, exc: BaseException | None, throw: bool,
                      eta: datetime | None, countdown: float | None,
                      max_retries: int | None) -> Retry:
        """``Task.retry``'s limit and delay, as a broker-side retry (nothing published)."""
        retries = (request.retries or 0) + 1
        if max_retries is not None:
            self.override_max_retries = max_retries  # read by Celery's autoretry wrapper
        limit = self.max_retries if max_retries is None else max_retries
        if limit is not None and retries > limit:
            setattr(request, _EXHAUSTED, True)
            if exc is not None:
                raise_with_context(exc)
            raise self.MaxRetriesExceededError(
                f"Can't retry {self.name}[{request.id}] args:{request.args} "
                f"kwargs:{request.kwargs}", task_args=request.args, task_kwargs=request.kwargs)
        if not eta and countdown is None:
            countdown = self.default_retry_delay
        ret = Retry(exc=exc, when=eta or countdown)
        if throw:
            raise ret
        return ret


def _delivered_by_ojs(request: Any) -> bool:
    return getattr(request, _ATTEMPT_HEADER, None) is not None
