"""Celery's side of OJS failures: retries by the broker, dead letters with the error.

Every failed attempt follows the job's retry rules: its OJS retry policy
(:func:`job_retry_policy`: the task's, then the envelope's own ``retry``) and
the app's ``ojs_retry_semantics`` (:func:`failure_retryable`).  Under
``"celery"`` (the default) a Celery job is retried only where Celery would
retry it (``autoretry_for``, ``self.retry()``, within ``max_retries``, after
Celery's delay); under ``"ojs"``, and for a task with an ``ojs_retry`` option
or a job from another producer, every failure is a failed OJS attempt:

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
from functools import cached_property
from typing import Any, Literal

from billiard.einfo import ExceptionWithTraceback
from celery import Task
from celery.exceptions import Ignore, Reject, Retry, TimeLimitExceeded, WorkerLostError
from celery.utils.serialization import raise_with_context
from celery.worker import state as worker_state
from celery.worker.request import Request

from ..amqp.delivery import JobMessage
from ..events.emitter import JobEvents, JobInfo
from ..spec.decode import CELERY_JOB_HEADER, RETRY_HEADER
from ..spec.envelope import RetryPolicy
from ..spec.errors import OJSConfigurationError
from ..spec.failures import (
    EXPIRED,
    HANDLER_ERROR,
    Action,
    Delivered,
    Happened,
    JobFailure,
    Outcome,
    decide,
)
from ..spec.retry import Backoff, matches, merge, policy_from
from .control import cancel_requested, cancellations, outcomes
from .events import count_completed
from .publish import apply_async_direct, direct_refusal

logger = logging.getLogger(__name__)

#: ``Retry.message`` of a retry whose new message Celery already published.
REPUBLISHED = "ojs_kombu: published by Celery's retry"
#: ``max_retries=None`` (retry forever) as an OJS ``max_attempts``: the largest
#: value an ``x-ojs-max-attempts`` header (int32) can carry.
UNBOUNDED_ATTEMPTS = 2**31 - 1
_ATTEMPT_HEADER = "x-ojs-attempt"
#: ``ojs_retry_semantics``: whose rules decide which failures are retried.
RetrySemantics = Literal["celery", "ojs"]
RETRY_SEMANTICS: tuple[RetrySemantics, ...] = ("celery", "ojs")


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


def app_retry_semantics(app: Any) -> RetrySemantics:
    """The app's ``ojs_retry_semantics``: ``"celery"`` unless set."""
    value = app.conf.get("ojs_retry_semantics") or "celery"
    if value not in RETRY_SEMANTICS:
        raise OJSConfigurationError(
            f"ojs_retry_semantics must be 'celery' or 'ojs', not {value!r}")
    return value  # type: ignore[no-any-return]


def task_retry_policy(task: Task, semantics: RetrySemantics | None = None) -> RetryPolicy:
    """The OJS retry policy of a Celery task: what its jobs' envelopes say.

    ``semantics`` defaults to the app's ``ojs_retry_semantics``.

    ``"celery"`` states what Celery itself retries.  A task without
    ``autoretry_for``: ``max_attempts=1`` (a failure is not retried; an explicit
    ``self.retry()`` still is, within ``max_retries``).  With ``autoretry_for``:
    ``max_attempts = max_retries + 1`` (``retry_kwargs["max_retries"]`` first,
    Celery's default 3; ``None``: unbounded); ``retry_backoff=f`` ->
    ``initial_interval`` of Celery's factor ``int(f)`` s, coefficient 2,
    ``max_interval=retry_backoff_max``, ``jitter=retry_jitter``; otherwise
    ``retry_kwargs["countdown"]`` or ``default_retry_delay`` (Celery's 180 s) as a
    constant delay without jitter; ``dont_autoretry_for`` -> ``non_retryable_errors``.

    ``"ojs"``: OJS defaults, then Celery's retry options where the task sets them:
    ``max_retries=n`` -> ``max_attempts=n+1`` (``None``: unbounded);
    ``retry_backoff=f`` -> ``initial_interval=f`` s, coefficient 2,
    ``max_interval=retry_backoff_max``, ``jitter=retry_jitter``; otherwise
    ``default_retry_delay=d`` -> a constant ``d`` s; ``dont_autoretry_for`` ->
    ``non_retryable_errors`` (class names).

    Last, the task option ``ojs_retry={...}`` (an OJS retry-policy object) merges
    over the result.  A task that sets it follows OJS semantics, so it gets the
    ``"ojs"`` policy whatever ``semantics`` says.
    """
    option = getattr(task, "ojs_retry", None)
    if option is not None:
        semantics = "ojs"
    elif semantics is None:
        semantics = app_retry_semantics(task.app)
    cache: dict[str, RetryPolicy] | None = getattr(task, "_ojs_policies", None)
    if cache is None:
        cache = task._ojs_policies = {}  # type: ignore[attr-defined]
    cached = cache.get(semantics)
    if cached is not None:
        return cached
    fields = _celery_fields(task) if semantics == "celery" else _ojs_fields(task)
    policy = policy_from(fields, source=f"the retry options of task {task.name!r}")
    if option is not None:
        policy = merge(policy, policy_from(option, source=f"ojs_retry of task {task.name!r}"))
    cache[semantics] = policy
    return policy


def _celery_fields(task: Task) -> dict[str, Any]:
    """Celery's own retries of ``task`` as OJS policy fields (Celery's autoretry wrapper)."""
    if not tuple(getattr(task, "autoretry_for", ()) or ()):
        return {"max_attempts": 1}
    retry_kwargs = dict(getattr(task, "retry_kwargs", None) or {})
    max_retries = retry_kwargs.get("max_retries")
    if max_retries is None:
        max_retries = task.max_retries
    fields: dict[str, Any] = {
        "max_attempts": UNBOUNDED_ATTEMPTS if max_retries is None else max_retries + 1}
    backoff = getattr(task, "retry_backoff", False)
    if backoff:
        factor = int(max(1.0, float(backoff)))  # what celery.app.autoretry computes
        maximum = int(getattr(task, "retry_backoff_max", 600))
        fields.update(initial_interval=_duration(factor), backoff_coefficient=2.0,
                      max_interval=_duration(max(maximum, factor)),
                      jitter=bool(getattr(task, "retry_jitter", True)))
    else:
        countdown = retry_kwargs.get("countdown")
        delay = task.default_retry_delay if countdown is None else countdown
        delay = max(float(delay or 0), 0.001)
        fields.update(initial_interval=_duration(delay), backoff_coefficient=1.0,
                      max_interval=_duration(delay), jitter=False)
    return _with_dont_autoretry_for(task, fields)


def _ojs_fields(task: Task) -> dict[str, Any]:
    """The OJS default policy with the Celery retry options ``task`` sets."""
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
    return _with_dont_autoretry_for(task, fields)


def _with_dont_autoretry_for(task: Task, fields: dict[str, Any]) -> dict[str, Any]:
    dont = tuple(getattr(task, "dont_autoretry_for", ()) or ())
    if dont:
        fields["non_retryable_errors"] = sorted({cls.__name__ for cls in dont})
    return fields


def _policy_semantics(task: Task, request: Mapping[str, Any]) -> RetrySemantics:
    """``"celery"`` for a job a Celery producer published (``x_celery`` in its
    envelope) when the app keeps Celery's retry semantics; ``"ojs"`` otherwise."""
    if request.get(CELERY_JOB_HEADER) and app_retry_semantics(task.app) == "celery":
        return "celery"
    return "ojs"


def job_retry_policy(task: Task, request_headers: Mapping[str, Any]) -> RetryPolicy:
    """The task's policy with the consumed job's own ``retry`` merged over it.

    The task's policy is its ``"celery"`` one for a Celery job under
    ``ojs_retry_semantics="celery"``, else its ``"ojs"`` one: a job from another
    producer that carries no policy gets the OJS default (unless the task's own
    options say otherwise), one that carries a policy gets that policy.
    """
    policy = task_retry_policy(task, _policy_semantics(task, request_headers))
    own = request_headers.get(RETRY_HEADER)
    if own:
        policy = merge(policy, policy_from(own, source="the job's retry policy"))
    return policy


def follows_celery_retries(task: Task, request: Mapping[str, Any]) -> bool:
    """Whether failures of this delivered job follow Celery's retry rules.

    True for a Celery job (``x_celery`` in its envelope) under
    ``ojs_retry_semantics="celery"``, unless the task sets ``ojs_retry`` or the
    job carries a policy other than the task's Celery one (``apply_async(ojs_retry=...)``):
    those follow OJS semantics, as every job does under ``"ojs"``.
    """
    if getattr(task, "ojs_retry", None) is not None or \
            _policy_semantics(task, request) != "celery":
        return False
    own = request.get(RETRY_HEADER)
    if not own:
        return True
    base = task_retry_policy(task, "celery")
    return merge(base, policy_from(own, source="the job's retry policy")) == base


def failure_retryable(task: Task, exc: BaseException, policy: RetryPolicy,
                      request: Mapping[str, Any]) -> bool:
    """Whether a failure of a delivered job may be retried (its attempts left aside).

    ``policy`` is the job's (:func:`job_retry_policy`), ``request`` the Celery
    request as a mapping (``vars(task.request)``, ``Request._request_dict``).

    Celery semantics (:func:`follows_celery_retries`): what Celery would retry.
    An exception the task raised is retried only when it is one of
    ``autoretry_for`` and neither one of ``dont_autoretry_for`` nor matched by
    ``non_retryable_errors`` (Celery's autoretry wrapper already asked for that
    retry through ``self.retry()``; one that still reaches the failure path is
    out of ``max_retries``).  A hard time limit and a lost pool process are not
    retried; ``Reject(requeue=True)`` is, within the policy's ``max_attempts``.

    OJS semantics: any failure (hard time limits and lost pool processes too)
    unless ``non_retryable_errors`` match it (class name, a base class name or
    ``module.Class``; exactly, or by prefix for ``"auth.*"``) or it is one of
    ``dont_autoretry_for``; a task that sets ``autoretry_for`` retries only those.
    """
    if not follows_celery_retries(task, request):
        return is_retryable(task, exc, policy)
    if isinstance(exc, Retry):
        return True
    if isinstance(exc, Reject):
        return bool(exc.requeue)
    if isinstance(exc, (TimeLimitExceeded, WorkerLostError)):
        return False
    autoretry = tuple(getattr(task, "autoretry_for", ()) or ())
    dont = tuple(getattr(task, "dont_autoretry_for", ()) or ())
    return (bool(autoretry) and isinstance(exc, autoretry)
            and not (dont and isinstance(exc, dont))
            and not _non_retryable(exc, policy))


def _non_retryable(exc: BaseException, policy: RetryPolicy) -> bool:
    """Whether ``policy.non_retryable_errors`` match ``exc``."""
    if not policy.non_retryable_errors:
        return False
    names = {cls.__name__ for cls in type(exc).__mro__}
    names.add(f"{type(exc).__module__}.{type(exc).__qualname__}")
    wrapped = getattr(exc, "exc_cls_name", None)
    if wrapped:
        names.add(wrapped)
    return any(matches(name, policy.non_retryable_errors) for name in names)


def is_retryable(task: Task, exc: BaseException, policy: RetryPolicy) -> bool:
    """The OJS-semantics half of :func:`failure_retryable` (which the failure path calls):
    OJS ``non_retryable_errors``, then Celery's ``autoretry_for``/``dont_autoretry_for``."""
    if _non_retryable(exc, policy):
        return False
    dont = tuple(getattr(task, "dont_autoretry_for", ()) or ())
    if dont and isinstance(exc, dont):
        return False
    only = tuple(getattr(task, "autoretry_for", ()) or ())
    return not (only and task_sets(task, "autoretry_for") and not isinstance(exc, only))


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
        return JobInfo.from_headers(request.id, binding.job_types.type_for(self.task.name),
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
        events = self.task.app.amqp.binding.events
        if events.active:
            events.progress(self.info(), self.task.request.hostname or "", percent, message)


class OJSTask(Task):
    """Base of every task under ojs_kombu (``install()`` makes it the app's ``Task``)."""

    Request = "ojs_kombu.celery.task:JobRequest"
    #: Task option: an OJS retry-policy object merged over the Celery-derived one;
    #: giving it (``{}`` too) puts the task under OJS retry semantics.
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
            result = self.run(*args, **kwargs)
        except (Retry, Ignore, Reject):
            raise
        except Exception as exc:
            if getattr(request, "ojs_cancel_seen", False):
                raise self._stopped_on_cancel(request) from exc
            headers = vars(request)
            # Under Celery's semantics the retries Celery makes (autoretry_for,
            # self.retry()) were asked for already: what reaches here fails the job.
            if follows_celery_retries(self, headers) or not failure_retryable(
                    self, exc, job_retry_policy(self, headers), headers):
                raise
            raise self.retry(exc=exc) from exc
        if getattr(request, "ojs_cancel_seen", False):
            raise self._stopped_on_cancel(request)
        return result

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

    def apply_async(self, args: Any = None, kwargs: Any = None, task_id: str | None = None,
                    producer: Any = None, link: Any = None, link_error: Any = None,
                    shadow: str | None = None, **options: Any) -> Any:
        """Celery's ``apply_async``; a plain call goes straight to the OJS channel
        (:mod:`ojs_kombu.celery.publish`: the same job, a third less CPU)."""
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
        if args is not None or kwargs is not None or options:
            # Celery publishes the new message itself; mark the Retry so the worker
            # only acks this delivery instead of republishing it too.
            try:
                ret = super().retry(args, kwargs, exc, throw, eta, countdown, max_retries,
                                    **options)
            except Retry as retry:
                raise Retry(REPUBLISHED, retry.exc, retry.when) from exc
            return Retry(REPUBLISHED, ret.exc, ret.when)
        if follows_celery_retries(self, vars(request)):
            return self._celery_retry(request, exc, throw, eta, countdown, max_retries)
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

    def _celery_retry(self, request: Any, exc: BaseException | None, throw: bool,
                      eta: datetime | None, countdown: float | None,
                      max_retries: int | None) -> Retry:
        """``Task.retry``'s limit and delay, as a broker-side retry (nothing published)."""
        retries = (request.retries or 0) + 1
        if max_retries is not None:
            self.override_max_retries = max_retries  # read by Celery's autoretry wrapper
        limit = self.max_retries if max_retries is None else max_retries
        if limit is not None and retries > limit:
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
                delay = _seconds_until(getattr(retry, "when", None))
            except Exception:
                logger.exception("job %s: could not describe its retry", self.id)
                failure, delay = JobFailure(HANDLER_ERROR, "Retry", "retry requested"), 1.0
            outcome = self._decide(message, Delivered(Happened.RETRY_REQUESTED, failure,
                                                      delay_s=delay))
            self._settle(message, outcome)
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
            outcome = self._decide(message, self._what_failed(requeue))
        except Exception as exc:  # never leave the delivery unsettled
            logger.exception("job %s: could not decide its retry; dead-lettering it", self.id)
            outcome = Outcome(Action.DEAD_LETTER, JobFailure.from_exception(exc, HANDLER_ERROR))
        self._settle(message, outcome)
        self.send_event("task-rejected", requeue=False)
        return None

    def on_timeout(self, soft: bool, timeout: float) -> None:
        """A hard time limit that the job's policy retries is a retry, not a ``FAILURE``:
        the result backend says ``RETRY`` until the last attempt (Celery's own handler
        marks every hard time limit as a failure before the job is requeued)."""
        message = self._message
        if soft or not isinstance(message, JobMessage) or worker_state.should_terminate:
            return super().on_timeout(soft, timeout)
        outcome = message.ojs_outcome  # billiard may have reported the failure first
        if outcome is None and not self.acknowledged:
            try:
                outcome = self._decide(message, self._what_failed(requeue=True))
            except Exception:
                logger.exception("job %s: could not decide its retry", self.id)
                return super().on_timeout(soft, timeout)
            if outcome.action is Action.RETRY:
                worker_state.task_ready(self)
                self._settle(message, outcome)
        if outcome is None or outcome.action is not Action.RETRY:
            return super().on_timeout(soft, timeout)
        exc = TimeLimitExceeded(timeout)
        logger.error("Hard time limit (%ss) exceeded for %s[%s]: attempt %d failed, the "
                     "broker retries it", timeout, self.name, self.id, message.ojs.attempt)
        if self.store_errors:
            self.task.backend.mark_as_retry(self.id, exc, request=self._context)
        self.send_event("task-retried", exception=repr(exc), traceback="")
        return None

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
        exc_info = self._ojs_exc_info
        if exc_info is not None and isinstance(_unwrap(exc_info.exception), JobCancelled) \
                and not self.acknowledged and isinstance(message, JobMessage):
            outcome = self._decide(message, Delivered(Happened.CANCELLED))  # an ack
            assert outcome.action is Action.ACK
            self._remember("cancelled", message)
            why, by = cancellations.get(self.id, (None, None))
            self._ojs_events.cancelled(message.ojs.info(), cancelled_by=by,
                                       reason=why or "cancelled while running")
            return super().acknowledge()
        if self._ojs_expired and not self.acknowledged and isinstance(message, JobMessage):
            failure = JobFailure(EXPIRED, EXPIRED, "job expired before it started")
            self._settle(message, self._decide(message, Delivered(Happened.EXPIRED, failure)))
            expires = self.expires
            self._ojs_events.expired(message.ojs.info(), None,
                                     expires if isinstance(expires, datetime) else
                                     datetime.now(UTC))
            return
        super().acknowledge()

    @cached_property
    def _ojs_policy(self) -> RetryPolicy:
        """The job's retry policy (the task's, then the envelope's), read once: the
        decision, the events and the retry check of one failure all need it."""
        return job_retry_policy(self.task, self._request_dict)

    def _decide(self, message: JobMessage, what: Delivered) -> Outcome:
        """The failure decision (:func:`ojs_kombu.spec.failures.decide`) under the job's policy."""
        if what.happened in (Happened.EXPIRED, Happened.CANCELLED):
            return decide(what, message.ojs.attempt)
        backoff = Backoff.of(self._ojs_policy)
        return decide(what, message.ojs.attempt, backoff.max_attempts, backoff.delay)

    def _settle(self, message: JobMessage, outcome: Outcome) -> None:
        """Emit the failure's events and hand the outcome to the transport (Celery's
        reject runs in the event loop's thread and never waits there)."""
        message.ojs_outcome = outcome
        self._emit_failure(message, outcome)
        self._on_reject(logger, self._connection_errors, False)
        self.acknowledged = True

    def _emit_failure(self, message: JobMessage, outcome: Outcome) -> None:
        """``job.failed``, then ``job.retrying`` or ``job.discarded`` (lifecycle order)."""
        retry = outcome.action is Action.RETRY
        self._remember("retryable" if retry else "discarded", message)
        failure = outcome.failure
        if failure is None:
            return
        events = self._ojs_events
        job = message.ojs.info()
        if failure.code == EXPIRED:
            return  # job.expired, not a failed attempt
        events.failed(job, failure.code, failure.message, retryable=retry,
                      stack_trace="\n".join(failure.backtrace) or None)
        if retry:
            policy = self._ojs_policy
            events.retrying(job, failure.code, failure.message,
                            max_attempts=policy.max_attempts, delay_s=outcome.delay_s)
        else:
            events.discarded(job, failure.code, failure.message)

    def _what_failed(self, requeue: bool) -> Delivered:
        """What Celery's rejection of the attempt means, for :meth:`_decide`.

        ``requeue=True`` without an exception comes from a hard time limit; a
        lost pool process (OOM kill, SIGKILL) comes as ``WorkerLostError``.
        """
        exc_info = self._ojs_exc_info
        exc = _unwrap(exc_info.exception) if exc_info is not None else None
        timed_out = isinstance(exc, TimeLimitExceeded) or (requeue and exc is None)
        if exc is None:
            exc = (TimeLimitExceeded(self.time_limits[0]) if timed_out
                   else RuntimeError("rejected by Celery"))
        happened = (Happened.TIME_LIMIT if timed_out else
                    Happened.WORKER_LOST if isinstance(exc, WorkerLostError) else
                    Happened.HANDLER_ERROR)
        policy = self._ojs_policy
        failure = JobFailure.from_exception(exc, HANDLER_ERROR,
                                            exc_info.traceback if exc_info else None)
        # The pool already turned a retryable exception of the task into a Retry
        # (OJSTask.__call__): one that reaches here is not retried, unless Celery
        # asks to requeue it (``Reject(requeue=True)``), which OJS retries instead.
        retryable = ((requeue or happened is not Happened.HANDLER_ERROR)
                     and failure_retryable(self.task, exc, policy, self._request_dict))
        return Delivered(happened, failure, retryable=retryable)
