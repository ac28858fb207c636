"""Celery's side of OJS failures: retries by the broker, dead letters with the error.

Every failed attempt follows the job's OJS retry policy (:func:`task_retry_policy`,
then the envelope's own ``retry``):

* in the pool, :class:`OJSTask` turns a retryable exception into Celery's
  ``Retry`` (so the result backend says ``RETRY``, not ``FAILURE``) *without*
  publishing anything; ``self.retry(countdown=...)`` and ``autoretry_for`` do
  the same;
* in the worker's main process, :class:`JobRequest` makes the broker hold the
  job: a confirmed republish through ``ojs.exchange.retry`` into a delay queue,
  then ``Basic.Ack`` (section 5.4); a job out of attempts, or with a
  non-retryable error, goes to ``ojs.queue.dlx.{q}`` with its last error in
  ``x-ojs-error-*`` headers and its history in the envelope.

Nothing waits in the worker's memory.
"""

from __future__ import annotations

import ast
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from billiard.einfo import ExceptionWithTraceback
from celery import Task
from celery.exceptions import Ignore, Reject, Retry, TimeLimitExceeded, WorkerLostError
from celery.worker import state as worker_state
from celery.worker.request import Request

from .celery_control import cancel_requested, cancellations, outcomes
from .celery_events import count_completed
from .celery_publish import apply_async_direct, direct_refusal
from .codec import RETRY_HEADER
from .delivery import JobAction, JobMessage
from .envelope import RetryPolicy
from .events.emitter import JobEvents, JobInfo
from .failures import EXPIRED, HANDLER_ERROR, HANDLER_TIMEOUT, NON_RETRYABLE_ERROR, JobFailure
from .retry import Backoff, matches, merge, policy_from

logger = logging.getLogger(__name__)

#: ``Retry.message`` of a retry whose new message Celery already published.
REPUBLISHED = "ojs_kombu: published by Celery's retry"
#: ``max_retries=None`` (retry forever) as an OJS ``max_attempts``: the largest
#: value an ``x-ojs-max-attempts`` header (int32) can carry.
UNBOUNDED_ATTEMPTS = 2**31 - 1
_ATTEMPT_HEADER = "x-ojs-attempt"


def task_sets(task: Task, name: str) -> bool:
    """Whether ``name`` was set on this task (decorator option or subclass), not inherited
    from Celery's ``Task``."""
    for cls in task.__class__.__mro__:  # __class__: a task proxy reports the task's class
        if cls is Task or cls.__module__.startswith("celery."):
            return False
        if name in vars(cls):
            return True
    return False


def _duration(seconds: float) -> str:
    return f"PT{seconds:g}S"


def task_retry_policy(task: Task) -> RetryPolicy:
    """The OJS retry policy of a Celery task.

    OJS defaults, then Celery's retry options where the task sets them:
    ``max_retries=n`` -> ``max_attempts=n+1`` (``None``: unbounded);
    ``retry_backoff=f`` -> ``initial_interval=f`` s, coefficient 2,
    ``max_interval=retry_backoff_max``, ``jitter=retry_jitter``; otherwise
    ``default_retry_delay=d`` -> a constant ``d`` s; ``dont_autoretry_for`` ->
    ``non_retryable_errors`` (class names).  Last, the task option
    ``ojs_retry={...}`` (an OJS retry-policy object) merges over the result.
    """
    cached = getattr(task, "_ojs_policy", None)
    if cached is not None:
        return cached
    fields: dict[str, Any] = {}
    if task_sets(task, "max_retries"):
        fields["max_attempts"] = (UNBOUNDED_ATTEMPTS if task.max_retries is None
                                  else task.max_retries + 1)
    backoff = getattr(task, "retry_backoff", False)
    if task_sets(task, "retry_backoff") and backoff:
        maximum = float(getattr(task, "retry_backoff_max", 600))
        factor = max(1.0, float(backoff))
        fields.update(initial_interval=_duration(factor), backoff_coefficient=2.0,
                      max_interval=_duration(max(maximum, factor)),
                      jitter=bool(getattr(task, "retry_jitter", True)))
    elif task_sets(task, "default_retry_delay"):
        delay = max(float(task.default_retry_delay), 0.001)
        fields.update(initial_interval=_duration(delay), backoff_coefficient=1.0,
                      max_interval=_duration(delay))
    dont = tuple(getattr(task, "dont_autoretry_for", ()) or ())
    if dont:
        fields["non_retryable_errors"] = sorted({cls.__name__ for cls in dont})
    policy = policy_from(fields, source=f"the retry options of task {task.name!r}")
    option = getattr(task, "ojs_retry", None)
    if option is not None:
        policy = merge(policy, policy_from(option, source=f"ojs_retry of task {task.name!r}"))
    task._ojs_policy = policy  # type: ignore[attr-defined]
    return policy


def job_retry_policy(task: Task, request_headers: Mapping[str, Any]) -> RetryPolicy:
    """The task's policy with the consumed job's own ``retry`` merged over it."""
    policy = task_retry_policy(task)
    own = request_headers.get(RETRY_HEADER)
    if own:
        policy = merge(policy, policy_from(own, source="the job's retry policy"))
    return policy


def is_retryable(task: Task, exc: BaseException, policy: RetryPolicy) -> bool:
    """OJS ``non_retryable_errors``, then Celery's ``autoretry_for``/``dont_autoretry_for``."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    names.add(f"{type(exc).__module__}.{type(exc).__qualname__}")
    wrapped = getattr(exc, "exc_cls_name", None)
    if wrapped:
        names.add(wrapped)
    if any(matches(name, policy.non_retryable_errors) for name in names):
        return False
    dont = tuple(getattr(task, "dont_autoretry_for", ()) or ())
    if dont and isinstance(exc, dont):
        return False
    only = tuple(getattr(task, "autoretry_for", ()) or ())
    return not (only and task_sets(task, "autoretry_for") and not isinstance(exc, only))


class JobContext:
    """``self.ojs`` inside a task: what the running job can tell the world."""

    def __init__(self, task: Task) -> None:
        self.task = task

    def info(self) -> JobInfo:
        request = self.task.request
        queue = (request.delivery_info or {}).get("routing_key") or ""
        binding = self.task.app.amqp.binding
        return JobInfo.from_headers(request.id, binding.job_types.type_for(self.task.name),
                                    queue, vars(request))

    @property
    def cancelled(self) -> bool:
        """Whether a CANCEL reached the running job (cooperative cancelling: check it in
        long loops and return early; any pool: prefork processes are signalled)."""
        return self.task.request.id in worker_state.revoked or cancel_requested.is_set()

    def progress(self, percent: float, message: str | None = None) -> None:
        """Emit ``job.progress`` (0 to 100 percent, and an optional message)."""
        if not 0 <= percent <= 100:
            raise ValueError(f"progress must be between 0 and 100, not {percent}")
        events = self.task.app.amqp.binding.events
        if events.active:
            events.progress(self.info(), self.task.request.hostname or "", percent, message)


class OJSTask(Task):
    """Base of every task under ojs_kombu (``install()`` makes it the app's ``Task``)."""

    Request = "ojs_kombu.worker:JobRequest"
    #: Task option: an OJS retry-policy object merged over the Celery-derived one.
    ojs_retry: Mapping[str, Any] | None = None

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
        try:
            return self.run(*args, **kwargs)
        except (Retry, Ignore, Reject):
            raise
        except Exception as exc:
            policy = job_retry_policy(self, vars(request))
            if not is_retryable(self, exc, policy):
                raise
            raise self.retry(exc=exc) from exc

    def apply_async(self, args: Any = None, kwargs: Any = None, task_id: str | None = None,
                    producer: Any = None, link: Any = None, link_error: Any = None,
                    shadow: str | None = None, **options: Any) -> Any:
        """Celery's ``apply_async``; a plain call goes straight to the OJS channel
        (:mod:`ojs_kombu.celery_publish`: the same job, a third less CPU)."""
        if producer is None and link is None and link_error is None and shadow is None \
                and direct_refusal(self, self._get_app(), task_id, options) is None:
            if self.soft_time_limit and self.time_limit and \
                    self.soft_time_limit > self.time_limit:
                raise ValueError("soft_time_limit must be less than or equal to time_limit")
            if self.typing and hasattr(self, "__header__"):
                self.__header__(*(args or ()), **(kwargs or {}))
            result = apply_async_direct(self, args, kwargs, task_id, options)
            if result is not None:
                return result
        return super().apply_async(args, kwargs, task_id, producer, link, link_error, shadow,
                                   **options)

    def retry(self, args: Any = None, kwargs: Any = None, exc: BaseException | None = None,
              throw: bool = True, eta: datetime | None = None, countdown: float | None = None,
              max_retries: int | None = None, **options: Any) -> Any:
        """Ask for a broker-side retry; nothing is published from the task.

        New ``args``/``kwargs`` or routing options make it a new message, which
        Celery's own ``retry`` publishes (the broker still holds it until due).
        """
        request = self.request
        if request.called_directly or not _delivered_by_ojs(request):
            return super().retry(args, kwargs, exc, throw, eta, countdown, max_retries,
                                 **options)
        if args is not None or kwargs is not None or options:
            # Celery publishes the new message itself; mark the Retry so the worker
            # only acks this delivery instead of republishing it too.
            try:
                ret = super().retry(args, kwargs, exc, throw, eta, countdown, max_retries,
                                    **options)
            except Retry as retry:
                raise Retry(REPUBLISHED, retry.exc, retry.when) from exc
            return Retry(REPUBLISHED, ret.exc, ret.when)
        policy = job_retry_policy(self, vars(request))
        if max_retries is not None:
            policy = policy.model_copy(update={"max_attempts": max_retries + 1})
        attempt = (request.retries or 0) + 1
        if attempt >= policy.max_attempts:
            if exc is not None:
                raise exc
            raise self.MaxRetriesExceededError(
                f"Can't retry {self.name}[{request.id}]: {attempt} of "
                f"{policy.max_attempts} attempts used")
        when: float | datetime
        if eta is not None:
            when = eta
        elif countdown is not None:
            when = countdown
        else:
            when = Backoff.of(policy).delay(attempt)
        ret = Retry(exc=exc, when=when)
        if throw:
            raise ret
        return ret


def _delivered_by_ojs(request: Any) -> bool:
    return getattr(request, _ATTEMPT_HEADER, None) is not None


_REPR_CONSTANTS = {"None": None, "True": True, "False": False}


def _pool_result(retval: Any) -> Any:
    """The task's return value from what the pool reports.

    Celery's pool hands the worker a ``saferepr`` of the result, not the value;
    a repr of JSON-like literals is read back, anything else stays its repr.
    """
    if not isinstance(retval, str):
        return retval
    if retval in _REPR_CONSTANTS:  # most tasks return None: no parse for that
        return _REPR_CONSTANTS[retval]
    try:
        return ast.literal_eval(retval)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return {"repr": retval}


def _unwrap(exc: Any) -> BaseException:
    """The task's exception, out of billiard's ``ExceptionWithTraceback`` wrapper."""
    return exc.exc if isinstance(exc, ExceptionWithTraceback) else exc


def _seconds_until(when: Any) -> float:
    if isinstance(when, datetime):
        aware = when if when.tzinfo else when.replace(tzinfo=UTC)
        return max((aware - datetime.now(UTC)).total_seconds(), 0.0)
    return max(float(when or 0), 0.0)


class JobRequest(Request):
    """Worker-side request of an OJS job: decides retry or dead letter for a failed attempt,
    and emits the job's lifecycle events.

    The decision is made here (pure); the I/O runs where Celery runs its acks,
    in the event loop's thread, through :meth:`JobMessage.reject`.
    """

    _ojs_exc_info: Any = None

    def __init__(self, message: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(message, JobMessage):
            # The transport already decoded the envelope into Celery's
            # ``(args, kwargs, embed)``: hand that to the pool instead of the
            # body, so no pool decodes the JSON a second time.
            kwargs["body"], kwargs["decoded"] = message.payload, True
        super().__init__(message, *args, **kwargs)

    @property
    def _ojs_events(self) -> JobEvents:
        return self._app.amqp.binding.events

    def on_accepted(self, pid: Any, time_accepted: float) -> None:
        super().on_accepted(pid, time_accepted)
        message = self._message
        if isinstance(message, JobMessage):
            self._ojs_events.started(message.ojs.info(), self.hostname)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Celery's worker builds a subclass per task whose on_success does not
        # call ours (celery.worker.request.create_request_cls): wrap it.
        super().__init_subclass__(**kwargs)
        generated = cls.__dict__.get("on_success")
        if generated is not None:
            def on_success(self: JobRequest, failed__retval__runtime: Any, **kw: Any) -> Any:
                self._ojs_succeeded(failed__retval__runtime)
                return generated(self, failed__retval__runtime, **kw)
            cls.on_success = on_success  # type: ignore[method-assign]

    def on_success(self, failed__retval__runtime: Any, **kwargs: Any) -> None:
        self._ojs_succeeded(failed__retval__runtime)
        super().on_success(failed__retval__runtime, **kwargs)

    def _ojs_succeeded(self, failed__retval__runtime: Any) -> None:
        failed, retval, runtime = failed__retval__runtime
        message = self._message
        if not failed and isinstance(message, JobMessage):
            count_completed()
            self._remember("completed", message)
            self._ojs_events.completed(message.ojs.info(), runtime,
                                       _pool_result(retval) if self._ojs_events.active else None)

    def on_retry(self, exc_info: Any) -> None:
        message = self._message
        retry = _unwrap(exc_info.exception)
        republished = isinstance(retry, Retry) and retry.message == REPUBLISHED
        if isinstance(message, JobMessage) and not self.acknowledged and not republished:
            try:
                cause = retry.exc if isinstance(retry, Retry) and retry.exc is not None else retry
                failure = JobFailure.from_exception(cause, HANDLER_ERROR, exc_info.traceback)
                action = JobAction(failure, retry=True,
                                   delay_s=_seconds_until(getattr(retry, "when", None)))
            except Exception:
                logger.exception("job %s: could not describe its retry", self.id)
                action = JobAction(JobFailure(HANDLER_ERROR, "Retry", "retry requested"),
                                   retry=True, delay_s=1.0)
            message.ojs_action = action
            self._emit_failure(message, action)
            self._on_reject(logger, self._connection_errors, False)
            self.acknowledged = True
        super().on_retry(exc_info)

    def on_failure(self, exc_info: Any, send_failed_event: bool = True,
                   return_ok: bool = False) -> None:
        self._ojs_exc_info = exc_info
        super().on_failure(exc_info, send_failed_event, return_ok)

    def reject(self, requeue: bool = False) -> None:
        message = self._message
        if self.acknowledged or not isinstance(message, JobMessage):
            return super().reject(requeue)
        try:
            message.ojs_action = self._failed_attempt(message.ojs.attempt, requeue)
        except Exception as exc:  # never leave the delivery unsettled
            logger.exception("job %s: could not decide its retry; dead-lettering it", self.id)
            message.ojs_action = JobAction(JobFailure.from_exception(exc, HANDLER_ERROR))
        self._emit_failure(message, message.ojs_action)
        self._on_reject(logger, self._connection_errors, False)
        self.acknowledged = True
        self.send_event("task-rejected", requeue=False)

    def _remember(self, state: str, message: JobMessage) -> None:
        outcomes.remember(self.id, {"state": state, "attempt": message.ojs.attempt,
                                    "worker_id": self.hostname})

    _ojs_expired = False

    def _announce_revoked(self, reason: Any, terminated: Any, signum: Any, expired: Any) -> None:
        """A cancelled job is acked, not dead-lettered, and emits ``job.cancelled``; one that
        expired while prefetched is dead-lettered as ``EXPIRED`` (see :meth:`acknowledge`)."""
        message = self._message
        self._ojs_expired = bool(expired) and isinstance(message, JobMessage)
        super()._announce_revoked(reason, terminated, signum, expired)
        if isinstance(message, JobMessage) and not expired:
            self._remember("cancelled", message)
            why, by = cancellations.get(self.id, (None, None))
            self._ojs_events.cancelled(message.ojs.info(), cancelled_by=by,
                                       reason=why or f"{reason} by Celery")

    def acknowledge(self) -> None:
        message = self._message
        if self._ojs_expired and not self.acknowledged and isinstance(message, JobMessage):
            failure = JobFailure(EXPIRED, EXPIRED, "job expired before it started")
            message.ojs_action = JobAction(failure)
            self._on_reject(logger, self._connection_errors, False)
            self.acknowledged = True
            self._remember("discarded", message)
            expires = self.expires
            self._ojs_events.expired(message.ojs.info(), None,
                                     expires if isinstance(expires, datetime) else
                                     datetime.now(UTC))
            return
        super().acknowledge()

    def _emit_failure(self, message: JobMessage, action: JobAction) -> None:
        """``job.failed``, then ``job.retrying`` or ``job.discarded`` (lifecycle order)."""
        self._remember("retryable" if action.retry else "discarded", message)
        events = self._ojs_events
        job, failure = message.ojs.info(), action.failure
        events.failed(job, failure.code, failure.message, retryable=action.retry,
                      stack_trace="\n".join(failure.backtrace) or None)
        if action.retry:
            policy = job_retry_policy(self.task, self._request_dict)
            events.retrying(job, failure.code, failure.message,
                            max_attempts=policy.max_attempts, delay_s=action.delay_s)
        else:
            events.discarded(job, failure.code, failure.message)

    def _failed_attempt(self, attempt: int, requeue: bool) -> JobAction:
        """Celery gave up on the attempt: retry it by the broker, or dead-letter it.

        ``requeue=True`` comes from a hard time limit (or a lost pool process):
        a failed attempt like any other, retried while attempts remain.  Other
        failures reach here only once :class:`OJSTask` decided not to retry.
        """
        exc_info = self._ojs_exc_info
        exc = _unwrap(exc_info.exception) if exc_info is not None else None
        # on_timeout() rejects with requeue=True before any exception is known
        timed_out = isinstance(exc, TimeLimitExceeded) or (requeue and exc is None)
        lost = isinstance(exc, WorkerLostError)  # OOM kill, SIGKILL of the pool process
        if exc is None:
            exc = (TimeLimitExceeded(self.time_limits[0]) if timed_out
                   else RuntimeError("rejected by Celery"))
        policy = job_retry_policy(self.task, self._request_dict)
        retryable = is_retryable(self.task, exc, policy)
        code = (NON_RETRYABLE_ERROR if not retryable
                else HANDLER_TIMEOUT if timed_out else HANDLER_ERROR)
        failure = JobFailure.from_exception(exc, code, exc_info.traceback if exc_info else None)
        backoff = Backoff.of(policy)
        if (requeue or lost) and retryable and backoff.allows_retry_after(attempt):
            return JobAction(failure, retry=True, delay_s=backoff.delay(attempt))
        return JobAction(failure)
