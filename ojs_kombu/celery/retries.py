"""Which failures of a Celery task's jobs the broker retries, how often and how late.

A job's retry rules are its OJS retry policy (:func:`job_retry_policy`: the
task's, then the envelope's own ``retry``) and the app's
``ojs_retry_semantics`` (:func:`failure_retryable`).  Under ``"celery"`` (the
default) a Celery job is retried only where Celery would retry it
(``autoretry_for``, ``self.retry()``, within ``max_retries``, after Celery's
delay); under ``"ojs"``, and for a task with an ``ojs_retry`` option or a job
from another producer, every failure is a failed OJS attempt.

These are decisions only: the task acts on them in the pool
(:mod:`ojs_kombu.celery.task`), the job's request in the worker's main process
(:mod:`ojs_kombu.celery.request`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from celery import Task
from celery.exceptions import Reject, Retry, TimeLimitExceeded, WorkerLostError

from ..spec.decode import CELERY_JOB_HEADER, RETRY_HEADER
from ..spec.envelope import RetryPolicy
from ..spec.errors import OJSConfigurationError
from ..spec.failures import Happened
from ..spec.retry import matches, merge, policy_from

#: ``max_retries=None`` (retry forever) as an OJS ``max_attempts``: the largest
#: value an ``x-ojs-max-attempts`` header (int32) can carry.
UNBOUNDED_ATTEMPTS = 2**31 - 1
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
    return value


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
        cache = task._ojs_policies = {}
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


def happened_of(exc: BaseException) -> Happened:
    """What a failed attempt's exception says happened: a time limit, a lost pool
    process, or the handler's own error (the worker's rejection and the dead-letter
    tools' reading of a stored failure judge it the same way)."""
    if isinstance(exc, TimeLimitExceeded):
        return Happened.TIME_LIMIT
    if isinstance(exc, WorkerLostError):
        return Happened.WORKER_LOST
    return Happened.HANDLER_ERROR


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
