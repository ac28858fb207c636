"""The worker's request of an OJS job: Celery's ``Request``, for a job the broker holds.

In the worker's main process :class:`JobRequest` decides each failed attempt
once, with :func:`~ojs_kombu.spec.failures.decide`, from what the pool reports
(a ``Retry`` and its delay, an exception it did not retry and why, ``Reject``)
or what happened here (a hard time limit, a lost pool process), and settles it on
the broker: a retry is a confirmed republish through ``ojs.exchange.retry``
into a delay queue, then ``Basic.Ack`` (section 5.4); a job out of attempts,
or with a non-retryable error, goes to ``ojs.queue.dlx.{q}`` with its last
error in ``x-ojs-error-*`` headers and its history in the envelope.  Nothing
waits in the worker's memory.  The request also emits the job's lifecycle
events (started, completed, failed, retrying, discarded, cancelled, expired).
"""

from __future__ import annotations

import ast
import logging
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

from billiard.einfo import ExceptionWithTraceback
from celery.exceptions import Retry, TimeLimitExceeded
from celery.worker import state as worker_state
from celery.worker.request import Request

from ..amqp.consuming.delivery import JobMessage
from ..events.hook import Hook
from ..spec.envelope import RetryPolicy
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
from ..spec.retry import Backoff
from .celery_seam import request_context, request_hooks
from .control import JobRecord, cancellations, job_ids_of, outcomes, queue_of
from .events import count_completed
from .retries import failure_retryable, happened_of, job_retry_policy
from .task import REPUBLISHED, JobCancelled, not_retried_code

logger = logging.getLogger(__name__)

_REPR_CONSTANTS = {"None": None, "True": True, "False": False}


def pool_result(retval: Any) -> Any:
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


@request_hooks
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

    #: The hook, kept by each of the request classes Celery's worker builds per task
    #: (one task, one app): looked up through ``app.amqp`` once, not twice per job.
    _ojs_task_hook: Hook | None = None

    @property
    def _ojs_hook(self) -> Hook:
        cls = type(self)
        hook = cls._ojs_task_hook
        if hook is None:
            hook = self.app.amqp.binding.hook
            if cls is not JobRequest:  # a per-task class: its app is the task's
                cls._ojs_task_hook = hook
        return hook

    @cached_property
    def eta(self) -> datetime | None:
        """Celery's ETA of the job while it is still due (the transport sends back a job
        more than a moment early, and Celery's timer holds it that moment); ``None`` once
        due, so the worker runs it at once.  The task's ``request.eta`` keeps the due
        time either way.

        Decided once, at the first read: Celery's strategy reads ``eta`` several times
        (``if req.eta: ... req.eta.astimezone()``), and a job falling due between two
        reads must not turn a true ETA into ``None`` halfway (that stopped the worker)."""
        due: datetime | None = super().eta
        return due if due is not None and due > datetime.now(UTC) else None

    def revoked(self) -> bool:
        """Celery's check, by the job's OJS id too (a CANCEL by the OJS id of a job whose
        Celery task id differs may reach this worker before the job does), and for a
        CANCEL of a job of this job's queue that came before the job."""
        # Both sets are empty until a revoke or a CANCEL comes: then nothing to look up.
        if cancellations or worker_state.revoked:
            ids = job_ids_of(self)
            if self.id not in worker_state.revoked and (
                    (len(ids) > 1 and ids[1] in worker_state.revoked)
                    or self._ojs_cancel_here(ids)):
                worker_state.revoked.add(self.id)
        return bool(super().revoked())

    def _ojs_cancel_here(self, ids: tuple[str, ...]) -> bool:
        """A CANCEL that came through this job's own queue's control queue (one that
        came through another queue's names another queue's job: not this one)."""
        for job_id in ids:
            cancel = cancellations.get(job_id)
            if cancel is not None and cancel[2] is not None and cancel[2] == queue_of(self):
                return True
        return False

    def _ojs_cancellation(self) -> tuple[str | None, str | None]:
        """``(reason, cancelled_by)`` of the CANCEL that stopped this job, by either id."""
        for job_id in job_ids_of(self):
            if job_id in cancellations:
                reason, by, _ = cancellations[job_id]
                return reason, by
        return None, None

    def on_accepted(self, pid: Any, time_accepted: float) -> None:
        super().on_accepted(pid, time_accepted)
        message = self.message
        if isinstance(message, JobMessage):
            hook = self._ojs_hook
            if hook.listens("job_started"):  # else no JobInfo to build
                hook.job_started(message.ojs.info(), self.hostname)

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
        message = self.message
        if not failed and isinstance(message, JobMessage):
            count_completed()
            self._remember("completed", message)
            hook = self._ojs_hook
            if hook.listens("job_completed"):
                hook.job_completed(message.ojs.info(), runtime, pool_result(retval))

    def on_retry(self, exc_info: Any) -> None:
        message = self.message
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
        message = self.message
        if self.acknowledged or not isinstance(message, JobMessage):
            return super().reject(requeue)
        try:
            outcome = self._decide(message, self._what_failed(requeue))
        except Exception as exc:  # never leave the delivery unsettled
            logger.exception("job %s: could not decide its retry; dead-lettering it", self.id)
            outcome = decide(Delivered(Happened.HANDLER_ERROR,
                                       JobFailure.from_exception(exc, HANDLER_ERROR),
                                       retryable=False), message.ojs.attempt)
        self._settle(message, outcome)
        self.send_event("task-rejected", requeue=False)
        return None

    def on_timeout(self, soft: bool, timeout: float) -> None:
        """A hard time limit that the job's policy retries is a retry, not a ``FAILURE``:
        the result backend says ``RETRY`` until the last attempt (Celery's own handler
        marks every hard time limit as a failure before the job is requeued)."""
        message = self.message
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
            self.task.backend.mark_as_retry(self.id, exc, request=request_context(self))
        self.send_event("task-retried", exception=repr(exc), traceback="")
        return None

    def _remember(self, state: str, message: JobMessage) -> None:
        ids = job_ids_of(self)
        record = JobRecord.of(state, message.ojs.attempt, self.hostname, ids, message.ojs.queue)
        for job_id in ids:
            outcomes.remember(job_id, record)

    _ojs_expired = False

    def on_revoked(self, expired: Any) -> None:
        """Before Celery announces a revoke (its ``_announce_revoked``, :mod:`.celery_seam`).
        A cancelled job is acked, not dead-lettered, and emits ``job.cancelled``; one that
        expired while prefetched is dead-lettered as ``EXPIRED`` (see :meth:`acknowledge`)."""
        self._ojs_expired = bool(expired) and isinstance(self.message, JobMessage)

    def after_revoked(self, reason: Any, expired: Any) -> None:
        message = self.message
        if isinstance(message, JobMessage) and not expired:
            self._remember("cancelled", message)
            why, by = self._ojs_cancellation()
            self._ojs_hook.job_cancelled(message.ojs.info(), by, why or f"{reason} by Celery")

    def acknowledge(self) -> None:
        message = self.message
        exc_info = self._ojs_exc_info
        if exc_info is not None and isinstance(_unwrap(exc_info.exception), JobCancelled) \
                and not self.acknowledged and isinstance(message, JobMessage):
            outcome = self._decide(message, Delivered(Happened.CANCELLED))  # an ack
            assert outcome.action is Action.ACK
            self._remember("cancelled", message)
            why, by = self._ojs_cancellation()
            self._ojs_hook.job_cancelled(message.ojs.info(), by, why or "cancelled while running")
            return super().acknowledge()
        if self._ojs_expired and not self.acknowledged and isinstance(message, JobMessage):
            failure = JobFailure(EXPIRED, EXPIRED, "job expired before it started")
            self._settle(message, self._decide(message, Delivered(Happened.EXPIRED, failure)))
            expires = self.expires
            self._ojs_hook.job_expired(message.ojs.info(), None,
                                       expires if isinstance(expires, datetime) else
                                       datetime.now(UTC))
            return
        super().acknowledge()

    @cached_property
    def _ojs_policy(self) -> RetryPolicy:
        """The job's retry policy (the task's, then the envelope's), read once: the
        decision, the events and the retry check of one failure all need it."""
        return job_retry_policy(self.task, self.request_dict)

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
        self.on_reject(logger, self.connection_errors, False)
        self.acknowledged = True

    def _emit_failure(self, message: JobMessage, outcome: Outcome) -> None:
        """``job.failed``, then ``job.retrying`` or ``job.discarded`` (lifecycle order)."""
        retry = outcome.action is Action.RETRY
        self._remember("retryable" if retry else "discarded", message)
        failure = outcome.failure
        if failure is None:
            return
        hook = self._ojs_hook
        job = message.ojs.info()
        if failure.code == EXPIRED:
            return  # job.expired, not a failed attempt
        hook.job_failed(job, failure.code, failure.message, retry,
                        "\n".join(failure.backtrace) or None)
        if retry:
            policy = self._ojs_policy
            hook.job_retrying(job, failure.code, failure.message, policy.max_attempts,
                              outcome.delay_s)
        else:
            hook.job_discarded(job, failure.code, failure.message)

    def _what_failed(self, requeue: bool) -> Delivered:
        """What Celery's rejection of the attempt means, for :meth:`_decide`.

        An exception the task raised comes with the pool's verdict
        (:func:`~ojs_kombu.celery.task.not_retried_code`), taken as given.  The
        rest is judged here, the one process that sees it: ``requeue=True`` without
        an exception comes from a hard time limit, a lost pool process (OOM kill,
        SIGKILL) comes as ``WorkerLostError``, and ``Reject(requeue=True)`` is an
        OJS retry (Celery's tracer records nothing for a ``Reject``).
        """
        exc_info = self._ojs_exc_info
        exc = _unwrap(exc_info.exception) if exc_info is not None else None
        timed_out = isinstance(exc, TimeLimitExceeded) or (requeue and exc is None)
        if exc is None:
            exc = (TimeLimitExceeded(self.time_limits[0]) if timed_out
                   else RuntimeError("rejected by Celery"))
        happened = Happened.TIME_LIMIT if timed_out else happened_of(exc)
        traceback = exc_info.traceback if exc_info else None
        verdict = not_retried_code(exc) if happened is Happened.HANDLER_ERROR else None
        if verdict is not None:
            return Delivered(Happened.NOT_RETRIED,
                             JobFailure.from_exception(exc, verdict, traceback))
        failure = JobFailure.from_exception(exc, HANDLER_ERROR, traceback)
        # A task's exception that lost the pool's verdict (sent as its repr, or one
        # without a __dict__) or Reject(requeue=False): not retried, named by the
        # attempts left.
        retryable = ((requeue or happened is not Happened.HANDLER_ERROR)
                     and failure_retryable(self.task, exc, self._ojs_policy,
                                           self.request_dict))
        return Delivered(happened, failure, retryable=retryable)
