"""Batch enqueue: many Celery jobs on one channel with pipelined confirms.

``enqueue_many(app, jobs)`` is the OJS batch PUSH (binding section 5) for
Celery callers.  It builds each OJS job straight from the task name,
arguments and options, without going through Celery's per-call message
machinery, publishes every job on one channel without waiting between them,
and returns only when the broker has confirmed all of them; anything refused,
returned or left unconfirmed raises one :class:`~ojs_kombu.spec.errors.BatchPublishError`
that names each such job id.

What it takes: task signatures (``task.s(...)``, ``signature(...)``, with
options set by ``.set(...)``), groups of them, and ``(task, args, kwargs,
options)`` tuples (``task`` a task or a task name; ``kwargs`` and ``options``
optional).  Options: ``queue``, ``priority``, ``countdown``, ``eta``,
``expires``, ``task_id``, ``time_limit``, ``soft_time_limit``,
``ignore_result``, ``ojs_meta``, ``ojs_retry``, ``ojs_idempotency_key``.
Chains, chords, ``link``/``link_error`` callbacks and unique jobs
(``ojs_unique``: each needs its own claim first) are refused (send those with
``apply_async``).  Not sent per job: Celery's ``before_task_publish`` /
``after_task_publish`` signals and ``task-sent`` monitoring events.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any, TypeAlias

from celery import Celery
from celery.canvas import Signature, chord, group
from celery.result import AsyncResult
from celery.utils.nodenames import anon_nodename

from ..amqp.job_channel import JobChannel
from ..amqp.publishing.publisher import job_queue_for
from ..amqp.wire.kombu_seam import library_errors
from ..events.tracing import with_current_trace
from ..spec.encode import OutgoingJob, build_job
from ..spec.errors import BatchPublishError, InvalidJobIdError, JobEncodeError
from ..spec.job_ids import job_id_for, new_job_id
from ..spec.job_options import META_OPTION, RETRY_OPTION, check_time_limits, time_option
from ..spec.times import format_time
from ..spec.unique import IDEMPOTENCY_OPTION, UNIQUE_OPTION, idempotency_key
from ..spec.x_celery import x_celery_of
from .celery_seam import Chain, exec_options
from .dedup_store import store_for
from .scheduled import forget_scheduled, record_scheduled, wants_record

#: Options a batch job may carry; everything else is refused by name.
BATCH_OPTIONS = frozenset({
    "queue", "priority", "countdown", "eta", "expires", "task_id", "time_limit",
    "soft_time_limit", "ignore_result", META_OPTION, RETRY_OPTION, IDEMPOTENCY_OPTION,
})
#: Task execution defaults that carry nothing for an OJS job when unset or default.
_INERT_DEFAULTS = {"serializer": "json", "routing_key": None, "exchange": None,
                   "delivery_mode": None, "compression": None, "immediate": None,
                   "mandatory": None}

JobSpec: TypeAlias = Signature | tuple[Any, ...]


def inert_option(option: str, value: Any) -> bool:
    """An option an OJS job carries nothing for at this value (Celery's default)."""
    return option in _INERT_DEFAULTS and _INERT_DEFAULTS[option] == value


def unsupported_options(options: Mapping[str, Any]) -> list[str]:
    """The options (sorted) :class:`JobEncoder` cannot encode: neither in
    :data:`BATCH_OPTIONS` nor inert at their value."""
    if options.keys() <= BATCH_OPTIONS:  # the usual batch job: nothing to look at
        return []
    return sorted(k for k, v in options.items()
                  if k not in BATCH_OPTIONS and not inert_option(k, v))


def enqueue_many(app: Celery, jobs: Iterable[JobSpec] | group, *,
                 confirm_timeout: float | None = None) -> list[AsyncResult]:
    """Publish ``jobs`` as OJS jobs, every one confirmed; one result per job, in order.

    Every job is checked and encoded before the first is sent, so a bad
    argument or option (:class:`~ojs_kombu.spec.errors.JobEncodeError` naming the
    job's position) sends nothing.
    """
    specs = list(_flatten(jobs))
    if app.conf.task_always_eager:
        return [_signature(app, spec).apply_async() for spec in specs]
    encoder = JobEncoder(app)
    outgoing = [encoder.encode(index, spec) for index, spec in enumerate(specs)]
    seen: set[str] = set()
    for job, task_id in zip(outgoing, encoder.task_ids, strict=True):
        if task_id in seen:
            raise InvalidJobIdError(f"task_id {task_id} appears twice in the batch",
                                    job_id=job.job_id, queue=job.queue)
        seen.add(task_id)
    with app.producer_or_acquire() as producer, \
            library_errors(producer.connection):
        backend = app.backend
        recorded: list[str] = []
        for job, task_id, wants_result in zip(outgoing, encoder.task_ids,
                                              encoder.wants_result, strict=True):
            if wants_result:
                backend.on_task_call(producer, task_id)
                if job.delay_ms and wants_record(app, False):  # before the publish
                    scheduled_at = job.properties["application_headers"]["x-ojs-scheduled-at"]
                    if record_scheduled(app, task_id, scheduled_at):
                        recorded.append(task_id)
        channel: JobChannel = producer.channel
        results: list[AsyncResult] = []

        def make_results() -> None:  # while the broker confirms the batch's tail
            result_cls = app.AsyncResult
            results.extend(result_cls(task_id) for task_id in encoder.task_ids)

        try:
            channel.publish_jobs(outgoing, confirm_timeout=confirm_timeout,
                                 meanwhile=make_results)
        except BatchPublishError as exc:
            _by_task_id(exc, {job.job_id: task_id
                              for job, task_id in zip(outgoing, encoder.task_ids, strict=True)})
            forget_scheduled(app, [task_id for task_id in recorded if task_id in exc.rejected])
            raise
        except BaseException:
            forget_scheduled(app, recorded)
            raise
    return results


def _by_task_id(exc: BatchPublishError, task_ids: Mapping[str, str]) -> None:
    """Name the jobs of a failed batch by their task ids, as its results are (a task id
    that is not a UUIDv7 is not its job's OJS id)."""
    if all(job_id == task_id for job_id, task_id in task_ids.items()):
        return
    exc.rejected = {task_ids.get(k, k): why for k, why in exc.rejected.items()}
    exc.unconfirmed = tuple(task_ids.get(k, k) for k in exc.unconfirmed)
    exc.accepted = tuple(task_ids.get(k, k) for k in exc.accepted)


def _flatten(jobs: Iterable[JobSpec] | group) -> Iterable[JobSpec]:
    if isinstance(jobs, group):
        jobs = jobs.tasks
    for spec in jobs:
        if isinstance(spec, group):
            yield from _flatten(spec)
        elif isinstance(spec, Chain | chord):
            raise JobEncodeError(
                f"enqueue_many takes task signatures and groups of them, not a "
                f"{type(spec).__name__.strip('_')}: send chains and chords with apply_async"
            )
        else:
            yield spec


def _signature(app: Celery, spec: JobSpec) -> Signature:
    if isinstance(spec, Signature):
        return spec
    name, args, kwargs, options = _unpack(spec, 0)
    return app.signature(name, args=args, kwargs=kwargs, **options)


def _unpack(spec: JobSpec, index: int) -> tuple[str, Any, Any, Mapping[str, Any]]:
    if isinstance(spec, Signature):  # a dict: its keys, not its four properties
        return spec.get("task"), spec.get("args"), spec.get("kwargs"), \
            spec.get("options") or {}
    if not isinstance(spec, tuple) or not 1 <= len(spec) <= 4:
        raise JobEncodeError(
            f"batch job #{index} is {type(spec).__name__}: give a task signature or a "
            "(task, args, kwargs, options) tuple"
        )
    task, args, kwargs, options = (*spec, (), {}, {})[:4]
    name = task if isinstance(task, str) else getattr(task, "name", None)
    if not isinstance(name, str):
        raise JobEncodeError(f"batch job #{index}: {task!r} is neither a task nor a task name")
    return name, args, kwargs, options


def origin_nodename() -> str:
    """Celery's ``origin`` header of a job sent from this process (``gen{pid}@{host}``,
    as ``as_task_v2`` writes it), computed once per process."""
    return _origin_of(os.getpid())


@lru_cache(maxsize=1)
def _origin_of(pid: int) -> str:  # the pid keys it: a forked child gets its own
    return anon_nodename()


class JobEncoder:
    """The OJS jobs of a batch: one clock reading, one trace context, cached routes
    and types; each job is written by :func:`~ojs_kombu.spec.encode.build_job`, as
    every ``apply_async`` is."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.binding = app.amqp.binding
        self.now = datetime.now(UTC)
        self.created = format_time(self.now)
        self.trace = with_current_trace({})
        self.reply_to = app.thread_oid
        parent = app.current_worker_task
        self.parent_ids = ((parent.request.root_id or parent.request.id, parent.request.id)
                           if parent else None)
        self.wants_result: list[bool] = []
        #: The Celery task id of each job, in order (its OJS id when a UUIDv7).
        self.task_ids: list[str] = []
        # the same for every job of the batch: read once, not per job
        self._origin = origin_nodename()
        self._max_job_bytes = self.binding.settings.max_job_bytes
        self._router = app.amqp.router
        self._routes: dict[Any, str] = {}
        self._task_defaults: dict[str, tuple[Mapping[str, Any], Any, bool, str]] = {}

    def encode(self, index: int, spec: JobSpec) -> OutgoingJob:
        name, args, kwargs, options = _unpack(spec, index)
        unknown = unsupported_options(options)
        if unknown:
            raise JobEncodeError(
                f"batch job #{index} ({name}): option(s) {', '.join(unknown)} cannot be "
                "sent in a batch; use apply_async for callbacks, chains and custom routing"
            )
        try:
            return self.encode_call(name, args, kwargs, options)
        except JobEncodeError as exc:
            exc.args = (f"batch job #{index} ({name}): {exc}",)
            raise

    def encode_call(self, name: str, args: Any, kwargs: Any,
                    options: Mapping[str, Any]) -> OutgoingJob:
        """One job from ``options`` that :data:`BATCH_OPTIONS` (or inert values) only."""
        defaults, policy, ignore_default, job_type = self._defaults_for(name)
        opts = {**defaults, **options} if defaults else options
        if opts.get(UNIQUE_OPTION) not in (None, False):
            raise JobEncodeError(f"task {name!r} is unique ({UNIQUE_OPTION}): send it with "
                                 "apply_async, which claims its fingerprint first")
        task_id = opts.get("task_id") or new_job_id()
        queue = self._queue_for(name, opts.get("queue"), args, kwargs)
        if not isinstance(task_id, str):
            raise InvalidJobIdError(f"task_id {task_id!r} is not a string", job_id=None,
                                    queue=queue)
        job_id = job_id_for(task_id)
        self.task_ids.append(task_id)
        ignore_result = opts.get("ignore_result", ignore_default)
        self.wants_result.append(not ignore_result)
        hard, soft = opts.get("time_limit"), opts.get("soft_time_limit")
        check_time_limits(hard, soft, task_name=name, job_id=job_id, queue=queue)
        key = idempotency_key(opts.get(IDEMPOTENCY_OPTION), task_name=name, job_id=task_id,
                              args=args or (), kwargs=kwargs or {})
        if key is not None and not self.binding.settings.dedup_url:
            store_for(self.binding.settings)  # DedupNotConfigured, naming the setting
        root_id, parent_id = self.parent_ids or (None, None)
        # The Celery headers apply_async would send, in its order; ignore_result as
        # apply_async states it (False too).
        x_celery = x_celery_of({
            "timelimit": [hard, soft] if hard or soft else None, "root_id": root_id,
            "parent_id": parent_id, "origin": self._origin,
            "ignore_result": None if ignore_result is None else bool(ignore_result),
        }, job_id=job_id, task_id=task_id, kwargs=dict(kwargs) if kwargs else None)
        return build_job(
            job_id=job_id, job_type=job_type, queue=queue,
            args=list(args or ()), task_name=name, now=self.now, created=self.created,
            meta=opts.get(META_OPTION), traceparent=self.trace.get("traceparent"),
            tracestate=self.trace.get("tracestate"), priority=opts.get("priority"),
            timeout=hard, retry_policy=policy, per_call_retry=opts.get(RETRY_OPTION),
            scheduled_at=self._due(opts, job_id), expires_at=self._expires(opts, job_id),
            x_celery=x_celery, reply_to=self.reply_to,
            max_job_bytes=self._max_job_bytes, idempotency_key=key,
        )

    def _defaults_for(self, name: str) -> tuple[Mapping[str, Any], Any, bool, str]:
        """The task's own options, retry policy, ``ignore_result`` and OJS job type."""
        cached = self._task_defaults.get(name)
        if cached is None:
            task = self.app.tasks.get(name)
            defaults: Mapping[str, Any] = {}
            ignore = False
            if task is not None:
                defaults = {k: v for k, v in exec_options(task).items()
                            if v is not None and not inert_option(k, v)}
                for option in (IDEMPOTENCY_OPTION, UNIQUE_OPTION):  # the task's own
                    if getattr(task, option, None) is not None:
                        defaults = {**defaults, option: getattr(task, option)}
                ignore = bool(task.ignore_result)
            policy = self.binding.retry_policy_for(name) if self.binding.retry_policy_for \
                else None
            cached = self._task_defaults[name] = (defaults, policy, ignore,
                                                  self.binding.job_types.type_for(name))
        return cached

    def _queue_for(self, name: str, queue: Any, args: Any, kwargs: Any) -> str:
        router = self._router
        cacheable = not router.routes and (queue is None or isinstance(queue, str))
        if cacheable and queue in self._routes:
            return self._routes[queue]
        routed = router.route({"queue": queue} if queue else {}, name, args, kwargs)
        target = routed.get("queue")
        exchange = routed.get("exchange") or (target.exchange.name if target else "")
        routing_key = routed.get("routing_key") or (target.routing_key if target else "")
        ojs_queue = job_queue_for(self.binding.names, name, getattr(exchange, "name", exchange),
                                  routing_key)
        if cacheable:
            self._routes[queue] = ojs_queue
        return ojs_queue

    def _due(self, opts: Mapping[str, Any], job_id: str) -> datetime | None:
        eta, countdown = opts.get("eta"), opts.get("countdown")
        if eta is not None:
            return time_option(eta, "eta")
        if countdown:
            if not isinstance(countdown, int | float) or math.isnan(countdown):
                raise JobEncodeError(f"countdown {countdown!r} is not a number of seconds",
                                     job_id=job_id)
            return self.now + timedelta(seconds=countdown) if countdown > 0 else None
        return None

    def _expires(self, opts: Mapping[str, Any], job_id: str) -> datetime | None:
        expires = opts.get("expires")
        if expires is None:
            return None
        if isinstance(expires, int | float) and not isinstance(expires, bool):
            return self.now + timedelta(seconds=max(0, expires))
        return time_option(expires, "expires")
