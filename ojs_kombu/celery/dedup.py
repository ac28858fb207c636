"""Unique jobs at enqueue and idempotent execution in the pool, on the dedup store.

Publish side: :func:`check_unique` runs in ``OJSTask.apply_async`` before the
job is sent, whichever path sends it.  It resolves the call's (or the task's)
``ojs_idempotency_key`` and ``ojs_unique``, refuses both without
``ojs_dedup_url`` (:class:`~ojs_kombu.spec.errors.DedupNotConfigured`), and
claims the job's fingerprint; a conflict is handled by ``on_conflict``
(``reject`` raises :class:`~ojs_kombu.spec.errors.DuplicateJobError`,
``ignore`` hands back the existing job, ``replace`` cancels it through the
control plane first, ``replace_except_schedule`` also keeps its schedule).

Worker side: :func:`guard` wraps the run of a job that carries a key or a
unique policy (any producer's).  A key runs at most once per retention window:
a completed key is acked without running, and the caller's result is the
first run's; a key another attempt holds is retried later through the broker.
A unique job marks its record ``active`` when it starts and ``completed``,
``retryable`` or ``discarded`` when it ends.  With the store down a keyed job
is never taken for a duplicate: it runs (``ojs_dedup_when_down = "run"``) or is
retried later (``"retry"``), and ``ojs.dedup.degraded`` counts it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from celery.app.task import Task
from celery.backends.base import DisabledBackend
from celery.exceptions import Ignore, Reject, Retry

from ..amqp.broker.control import ControlClient
from ..events.metrics import OJSMetrics, labels
from ..spec.envelope import UniquePolicy
from ..spec.errors import DedupUnavailable, DuplicateJobError
from ..spec.job_ids import new_job_id
from ..spec.job_options import META_OPTION, time_option
from ..spec.times import parse_time
from ..spec.unique import (
    ACTIVE,
    AVAILABLE,
    COMPLETED,
    IDEMPOTENCY_HEADER,
    IDEMPOTENCY_OPTION,
    SCHEDULED,
    UNIQUE_HEADER,
    UNIQUE_OPTION,
    Resolution,
    RunVerdict,
    checked_states,
    fingerprint,
    idempotency_key,
    period_ms,
    resolve,
    unique_policy,
)
from .dedup_store import REPLACED, DedupStore, UniqueRecord, store_for

logger = logging.getLogger(__name__)

#: Seconds a delivery waits in the pool for the attempt that holds its key (it
#: completes: a duplicate; it fails: this one runs), then the broker retries it.
BUSY_WAIT_S = 30.0
#: Seconds a duplicate waits for the first run's result to reach the result backend.
RESULT_WAIT_S = 5.0
#: Seconds before a delivery that could not be decided is tried again.
BUSY_RETRY_S = 2.0


class DuplicateSkipped(Ignore):
    """The job was not run: a job with its fingerprint holds the unique record
    (``ignore``, or it was replaced); acked, not failed."""


@dataclass
class UniqueVerdict:
    """What :func:`check_unique` decided for one ``apply_async`` call."""

    job_id: str
    options: dict[str, Any]
    #: The job that stands for this call (``ignore``): publish nothing.
    existing: str | None = None
    _release: Callable[[], None] | None = field(default=None, repr=False)

    def release(self) -> None:
        """The publish failed: give the fingerprint back."""
        if self._release is not None:
            try:
                self._release()
            except DedupUnavailable:
                logger.warning("job %s: could not release its unique record", self.job_id)


def check_unique(task: Task, args: Any, kwargs: Any, task_id: str | None,
                 options: Mapping[str, Any]) -> UniqueVerdict | None:
    """The dedup decision for an ``apply_async`` call (``None``: the call asks for
    neither a key nor uniqueness, the common case, decided without I/O)."""
    key_value = options.get(IDEMPOTENCY_OPTION, getattr(task, "ojs_idempotency_key", None))
    unique_value = options.get(UNIQUE_OPTION, getattr(task, "ojs_unique", None))
    if key_value in (None, False) and unique_value in (None, False):
        return None
    app = task.app
    binding = app.amqp.binding
    store = store_for(binding.settings)
    job_id = task_id or new_job_id()
    opts = dict(options)
    args, kwargs = list(args or ()), dict(kwargs or {})
    key = idempotency_key(key_value, task_name=task.name, job_id=job_id, args=args,
                          kwargs=kwargs)
    if key is not None:
        opts[IDEMPOTENCY_OPTION] = key
    policy = unique_policy(unique_value, task_name=task.name, job_id=job_id)
    if policy is None:  # a call that turns the task's ojs_unique off says so
        if getattr(task, "ojs_unique", None) is None:
            opts.pop(UNIQUE_OPTION, None)
        else:
            opts[UNIQUE_OPTION] = False
        return UniqueVerdict(job_id, opts)
    opts[UNIQUE_OPTION] = policy.model_dump(mode="json", exclude_unset=True)
    from .batch import JobEncoder  # the batch's routing, for the job's OJS queue

    queue = JobEncoder(app)._queue_for(task.name, opts.get("queue"), args, kwargs)
    print_ = fingerprint(policy, job_type=binding.job_types.type_for(task.name), queue=queue,
                         args=args, kwargs=kwargs, meta=opts.get(META_OPTION))
    due = _due(opts)
    claim = _Claim(store, print_, policy, job_id, queue, due,
                   store.retention_ms / 1000)
    existing = claim.take()
    resolution = resolve(policy, existing.state if existing else None)
    if existing is None or resolution is Resolution.ENQUEUE:
        return UniqueVerdict(job_id, opts, _release=claim.release)
    if resolution is Resolution.REJECT:
        raise DuplicateJobError(
            f"task {task.name!r}: job {existing.job_id} ({existing.state}, queue "
            f"{existing.queue!r}) has the same unique fingerprint; nothing was sent "
            f"(on_conflict: reject)", existing_job_id=existing.job_id, fingerprint=print_,
            job_id=job_id, queue=queue)
    if resolution is Resolution.IGNORE:
        return UniqueVerdict(job_id, opts, existing=existing.job_id)
    cancel_replaced(app, existing, job_id)
    if resolution is Resolution.REPLACE_KEEP_SCHEDULE and existing.scheduled_at:
        opts.pop("countdown", None)
        opts["eta"] = parse_time(existing.scheduled_at)
        claim.due = opts["eta"]
    claim.take(take_over_from=existing.job_id)
    return UniqueVerdict(job_id, opts, _release=claim.release)


@dataclass
class _Claim:
    store: DedupStore
    fingerprint: str
    policy: UniquePolicy
    job_id: str
    queue: str
    due: datetime | None
    retention_s: float

    def take(self, take_over_from: str = "") -> UniqueRecord | None:
        scheduled = self.due is not None and self.due > datetime.now(UTC)
        return self.store.claim_unique(
            self.fingerprint, job_id=self.job_id, state=SCHEDULED if scheduled else AVAILABLE,
            queue=self.queue, scheduled_at=self.due.isoformat() if scheduled and self.due
            else None, checked=checked_states(self.policy),
            ttl_ms=period_ms(self.policy, self.retention_s), take_over_from=take_over_from)

    def release(self) -> None:
        self.store.release_unique(self.fingerprint, self.job_id)


def _due(opts: Mapping[str, Any]) -> datetime | None:
    if opts.get("eta") is not None:
        return time_option(opts["eta"], "eta")
    countdown = opts.get("countdown")
    if isinstance(countdown, int | float) and countdown > 0:
        return datetime.now(UTC) + timedelta(seconds=countdown)
    return None


def cancel_replaced(app: Any, existing: UniqueRecord, by: str) -> None:
    """CANCEL the job a unique job replaces, through the control plane (section 5.7)."""
    with ControlClient(app) as client:
        client.cancel(existing.job_id, existing.queue, reason=f"replaced by job {by} "
                      "(unique, on_conflict: replace)", cancelled_by="ojs_kombu.unique")


# -- worker side ------------------------------------------------------------------


def guard(task: Task, request: Any, run: Callable[[], Any]) -> Any:
    """Run the job in the pool under its idempotency key and unique record (the job
    carries at least one of them)."""
    settings = task.app.amqp.binding.settings
    key = getattr(request, IDEMPOTENCY_HEADER, None)
    unique = getattr(request, UNIQUE_HEADER, None)
    attempt = getattr(request, "x-ojs-attempt", 1) or 1
    try:
        store = store_for(settings)
    except Exception as exc:  # no URL on this worker, or no redis package
        return _degraded(task, request, settings, exc, run)
    try:
        if unique is not None:
            _start_unique(task, request, store, unique)
        if key is not None:
            verdict, owner = _claim_key(store, key, request, attempt)
            if verdict is RunVerdict.DUPLICATE:
                logger.info("job %s: idempotency key %r already ran (job %s): acked without "
                            "running", request.id, key, owner)
                return first_result(task, request, owner)
            if verdict is RunVerdict.BUSY:
                raise Retry(f"idempotency key {key!r} is held by job {owner}",
                            when=BUSY_RETRY_S)
    except DedupUnavailable as exc:
        return _degraded(task, request, settings, exc, run)
    ended = "discarded"
    try:
        result = run()
        ended = COMPLETED
        return result
    except Retry:
        ended = "retryable"
        raise
    except DuplicateSkipped:
        ended = "cancelled"
        raise
    finally:
        _finish(store, request, key, unique, attempt, ended)


def _claim_key(store: DedupStore, key: str, request: Any, attempt: int
               ) -> tuple[RunVerdict, str]:
    """Claim the key, waiting up to :data:`BUSY_WAIT_S` while another attempt holds it
    (two copies delivered at once: the second waits for the first's outcome)."""
    redelivered = bool((request.delivery_info or {}).get("redelivered"))
    deadline, pause = time.monotonic() + BUSY_WAIT_S, 0.02
    while True:
        verdict, owner = store.claim_key(key, job_id=request.id, attempt=attempt,
                                         redelivered=redelivered)
        if verdict is not RunVerdict.BUSY or time.monotonic() >= deadline:
            return verdict, owner
        time.sleep(pause)
        pause = min(pause * 2, 0.5)


def _finish(store: DedupStore, request: Any, key: str | None, unique: Any, attempt: int,
            ended: str) -> None:
    try:
        if key is not None:
            store.finish_key(key, job_id=request.id, attempt=attempt,
                             completed=ended == COMPLETED)
        if unique is not None:
            store.set_unique_state(unique["fingerprint"], request.id, ended)
    except DedupUnavailable as exc:
        logger.warning("job %s: dedup degraded, could not record %s: %s", request.id,
                       ended, exc)


def _start_unique(task: Task, request: Any, store: DedupStore, unique: Mapping[str, Any]
                  ) -> None:
    """Mark the record ``active``; a record another job holds means this job was
    replaced (an ojs_kombu producer claimed before sending), or, for another
    producer's job, a conflict its own ``on_conflict`` settles here."""
    policy = UniquePolicy.model_validate(unique["policy"])
    queue = (request.delivery_info or {}).get("routing_key") or ""
    claim = _Claim(store, unique["fingerprint"], policy, request.id, queue, None,
                   store.retention_ms / 1000)
    existing = store.claim_unique(claim.fingerprint, job_id=request.id, state=ACTIVE,
                                  queue=queue, scheduled_at=None,
                                  checked=checked_states(policy),
                                  ttl_ms=period_ms(policy, claim.retention_s))
    if existing is None:
        return
    if existing.state == REPLACED:  # its CANCEL has not reached this worker (yet)
        why = f"job {request.id}: replaced by job {existing.job_id} (unique, on_conflict: " \
              "replace); not run"
        logger.info(why)
        raise DuplicateSkipped(why)
    resolution = resolve(policy, existing.state)
    if getattr(request, "ojs_celery_job", False) or resolution is Resolution.IGNORE:
        raise DuplicateSkipped(f"job {request.id}: job {existing.job_id} holds its unique "
                               f"fingerprint ({existing.state})")
    if resolution is Resolution.REJECT:
        raise Reject(f"job {request.id}: job {existing.job_id} ({existing.state}) has the same "
                     "unique fingerprint (on_conflict: reject)", requeue=False)
    cancel_replaced(task.app, existing, request.id)
    store.claim_unique(claim.fingerprint, job_id=request.id, state=ACTIVE, queue=queue,
                       scheduled_at=None, checked=checked_states(policy),
                       ttl_ms=period_ms(policy, claim.retention_s),
                       take_over_from=existing.job_id)


def first_result(task: Task, request: Any, owner: str) -> Any:
    """The first run's result, where a result backend holds one (``None`` otherwise).

    The key is marked completed as the run returns, a moment before Celery stores
    its result: wait up to :data:`RESULT_WAIT_S` for it."""
    backend = task.backend
    if isinstance(backend, DisabledBackend) or request.ignore_result:
        return None
    deadline, pause = time.monotonic() + RESULT_WAIT_S, 0.01
    while True:
        try:
            meta = backend.get_task_meta(owner)
        except Exception:
            logger.exception("job %s: could not read the first run's result (job %s)",
                             request.id, owner)
            return None
        if meta.get("status") == "SUCCESS":
            return meta.get("result")
        if owner == request.id or time.monotonic() >= deadline:
            return None
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


def _degraded(task: Task, request: Any, settings: Any, exc: BaseException,
              run: Callable[[], Any]) -> Any:
    """The store is down: never a duplicate; run it or leave it for a later delivery."""
    queue = (request.delivery_info or {}).get("routing_key") or ""
    job_type = task.app.amqp.binding.job_types.type_for(task.name)
    OJSMetrics(settings.meter_provider).dedup_degraded.add(1, labels(job_type, queue))
    if settings.dedup_when_down == "retry":
        logger.warning("job %s: dedup degraded (%s): retried later through the broker",
                       request.id, exc)
        raise Retry(f"dedup store unavailable: {exc}", when=BUSY_RETRY_S)
    logger.warning("job %s: dedup degraded (%s): run without its idempotency record",
                   request.id, exc)
    return run()
