"""The ``ojs_*`` settings as data.

Settings come from Celery config (``app.conf.ojs_prefix`` ...) through
:func:`ojs_kombu.install`, or from kombu transport options with the same
``ojs_`` names when kombu is used without Celery.  An ``ojs_*`` key that is
not a setting is an error, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .backpressure import (
    ProducerBackpressure,
    QueueConfig,
    check_config,
    merged_config,
)
from .errors import OJSConfigurationError
from .naming import DEFAULT_QUEUE_ALIASES, check_queue_name
from .typed_values import DEFAULT_MAX_TYPE_MAP_ENTRIES

logger = logging.getLogger("ojs_kombu")

OPTION_PREFIX = "ojs_"
#: Transport option naming a ready-made :class:`~ojs_kombu.amqp.binding.Binding` of
#: this process by its :func:`~ojs_kombu.amqp.binding.register_binding` key
#: (``install()`` sets it on every connection of the app).
#: A string, not the object: Celery reports a connection's transport options as JSON
#: (``celery inspect stats``, Flower's worker page).  The transport itself also accepts
#: the :class:`~ojs_kombu.amqp.binding.Binding` object.
BINDING_OPTION = "ojs_binding"
#: Celery's setting that makes every queue a priority queue; it stands for
#: ``ojs_max_priority`` when that is not given (:meth:`OJSSettings.from_options`).
CELERY_MAX_PRIORITY = "task_queue_max_priority"


class OJSSettings(BaseModel):
    """Every setting, with its default; ``app.conf.ojs_<name>`` sets ``<name>``."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)

    #: Multi-tenancy prefix: ``tenant1`` gives ``tenant1.ojs.queue.email``.
    prefix: str = ""
    #: Celery queue name -> OJS queue name; Celery's ``celery`` is OJS's ``default``.
    queue_aliases: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_QUEUE_ALIASES))
    #: Celery task name -> OJS job type, for names that do not fit the OJS grammar.
    job_types: dict[str, str] = Field(default_factory=dict)
    #: Extra ``Queue.Declare`` arguments per OJS queue (``{"email": {"x-max-length": 1000}}``).
    queue_arguments: dict[str, dict[str, Any]] = Field(default_factory=dict)
    #: ``x-max-priority`` of every classic job queue (AMQP-030), as Celery's
    #: ``task_queue_max_priority``, which sets it when this is not given.  ``None``
    #: (the default): priority queues only where the app asks (``ojs_queues[q]
    #: ["priority"]``, a Celery ``Queue``'s ``x-max-priority``/``max_priority``).
    #: Not applied to queues given an ``x-queue-type`` (quorum and stream queues
    #: refuse ``x-max-priority``).
    max_priority: int | None = Field(default=None, ge=1, le=255)
    #: Seconds to wait for a publisher confirm before raising ``PublishConfirmTimeout``.
    confirm_timeout: float = Field(default=30.0, gt=0)
    #: How a job's publish waits for its publisher confirm (AMQP-014).  ``"wait"``: it
    #: returns once the broker confirmed the job, and raises if it did not.
    #: ``"deferred"`` (opt-in): it returns once the job is written; its confirm is read
    #: later on the same channel (next publishes, a full window, ``flush_confirms()``,
    #: the connection's close, worker shutdown, process exit).  A refused job is
    #: written again with backoff for up to ``confirm_timeout``; a returned one, or one
    #: refused or unconfirmed for good, goes to ``on_publish_error`` or is raised by the
    #: channel's next publish (``DeferredPublishError``).  Batches always wait.
    publish_confirms: Literal["wait", "deferred"] = "wait"
    #: ``"deferred"`` mode: most jobs one channel has written and not yet seen confirmed;
    #: a publish beyond it waits for confirms first.  A process that dies can lose at
    #: most this many jobs per publishing channel (the broker may or may not hold them).
    unconfirmed_window: int = Field(default=1000, ge=1)
    #: ``"deferred"`` mode: called with the ``JobPublishError`` of each job that was not
    #: accepted (``UnroutableJobError``, ``JobNackedError``, ``PublishConfirmTimeout``),
    #: in the publishing thread.  ``None``: they are raised instead (see above).
    on_publish_error: Any = None
    #: Largest job body (the envelope's JSON, in bytes) a producer publishes and a worker
    #: reads: a bigger one raises ``JobTooLargeError`` before anything is sent, and a
    #: worker dead-letters one it consumes as ``JOB_TOO_LARGE`` before parsing it (a
    #: parse costs about twenty times the body in memory).  The default is RabbitMQ's
    #: default ``max_message_size`` (128 MiB); ``None``: no check.
    max_job_bytes: int | None = Field(default=134_217_728, ge=1)
    #: Most entries of a consumed job's type map (``meta.x_celery_types``); a job with
    #: more is dead-lettered as ``TYPE_MAP_TOO_LARGE`` before any entry is read (a map
    #: may never hold more entries than ``args`` and ``x_celery`` hold values, either).
    max_type_map_entries: int = Field(default=DEFAULT_MAX_TYPE_MAP_ENTRIES, ge=0)
    #: How many times Celery's ``celery.chord_unlock`` polls a chord's header (each poll
    #: one retry, Celery's ``result_chord_retry_interval`` apart) when the chord gives no
    #: ``max_retries`` (Celery's default: forever); then the chord fails with
    #: ``ChordError`` and the job is dead-lettered.  A job naming a chord that never
    #: completes (forged, or its header lost) thus ends.
    chord_unlock_max_retries: int = Field(default=3600, ge=0)
    #: How a worker sends its acks (see :mod:`ojs_kombu.amqp.wire.acks`).  ``"batched"``: the
    #: acks of jobs that end in the same event-loop iteration go out in one write,
    #: one ``Basic.Ack(multiple=false)`` per job (the binding's section 5.3).
    #: ``"multiple"``: as batched, but where the oldest deliveries still open are all
    #: among them one ``Basic.Ack(multiple=true)`` settles them (cheaper for the
    #: broker; section 5.3 asks for ``multiple=false``, see docs/conformance.rst).
    #: ``"each"``: one write per ack, as plain kombu.
    acks: Literal["each", "batched", "multiple"] = "batched"
    #: Prefetch applied when a job queue is consumed before ``Basic.Qos`` was set.
    default_prefetch: int = Field(default=1, ge=1)
    #: Schedule through ``ojs.exchange.delayed`` (needs RabbitMQ's delayed-message
    #: plugin) instead of the TTL ladder.
    delayed_exchange: bool = False
    #: ``nack`` (the default, AMQP-009 as written): a discarded job is
    #: ``Basic.Nack(requeue=false)``; the broker dead-letters it as it was delivered,
    #: without its last error (the dead-letter tools read that from the result
    #: backend).  ``republish`` (an opt-in deviation from AMQP-009): it is published to
    #: the DLX with its last error in ``x-ojs-error-*`` and its history, confirmed, then
    #: acked, so that the dead letter itself says why.  Invalid messages are always
    #: republished with headers.
    dead_letter_mode: Literal["republish", "nack"] = "nack"
    #: ``Queue.Declare`` arguments of the scheduling ladder's queues; empty: those of
    #: ``queue_defaults``' type (see :meth:`schedule_arguments`).
    schedule_queue_arguments: dict[str, Any] = Field(default_factory=dict)
    #: Where OJS events go: ``"amqp"``, ``"file:/path.jsonl"``,
    #: ``{"webhook": url, "secret": ...}``, a callable, or a dict of these with a
    #: ``"filter"`` (see :func:`ojs_kombu.celery.events.sink_from_spec`).
    event_sinks: list[Any] = Field(default_factory=list)
    #: ``{service}`` of event sources ``ojs://{service}/{component}/{instance}``
    #: (default: the Celery app's name).
    event_service: str | None = None
    #: Seconds between ``worker.heartbeat`` events (0: none).
    worker_heartbeat: float = Field(default=30.0, ge=0)
    #: A job running longer than this many seconds gets an ``ojs.control.heartbeat``
    #: (and a ``job.heartbeat`` event) every as many seconds (0: none).
    job_heartbeat: float = Field(default=30.0, ge=0)
    #: Seconds a running job has, after a CANCEL, to stop on its own (a task that checks
    #: ``self.ojs.cancelled``) before its worker ends it as Celery's ``revoke(terminate=
    #: True)`` does: the prefork pool ends the job's process, gevent and eventlet kill its
    #: greenlet.  The threads and solo pools cannot stop a running job (it runs to its
    #: end, and INFO says so).  ``None``: cancel running jobs cooperatively only.
    cancel_grace: float | None = Field(default=10.0, ge=0)
    #: Whether workers consume the control queues of their queues (CANCEL, INFO).
    control_queues: bool = True
    #: Celery's eager mode (``task_always_eager``, ``Task.apply``) runs a call without a
    #: message, so nothing checks that it could be published.  ``True`` (opt-in, for
    #: test suites): each eager call is first encoded as its publish would be, raising
    #: the same ``JobEncodeError`` subclass a publish raises (docs/testing.rst).
    eager_encode: bool = False
    #: Broker users whose CANCEL and INFO requests a worker honours, besides its own
    #: broker user (always honoured): a list (for every queue) or a mapping of OJS queue
    #: (``"*"``: every queue) to a list.  A request names its sender in the ``user_id``
    #: property, which RabbitMQ checks against the connection's user; one without it,
    #: or from a user not listed for the queue, is refused (see :ref:`control-plane`).
    control_users: list[str] | dict[str, list[str]] = Field(default_factory=list)
    #: OpenTelemetry ``MeterProvider`` for ojs_kombu's metrics (default: the global one).
    meter_provider: Any = None
    #: Per OJS queue: bounds and backpressure strategy, priorities, queue type
    #: (``{"email": {"max_depth": 10000, "strategy": "reject", "warn_at": 0.8}}``,
    #: see :class:`~ojs_kombu.spec.backpressure.QueueConfig`).
    queues: dict[str, QueueConfig] = Field(default_factory=dict)
    #: Defaults of every queue's ``ojs_queues`` entry; ``{"type": "quorum"}`` (the
    #: production setting) makes every job, retry, scheduling and dead-letter queue
    #: a quorum queue.
    queue_defaults: QueueConfig = Field(default_factory=QueueConfig)
    #: Producer retries, circuit breaker and depth sampling
    #: (:class:`~ojs_kombu.spec.backpressure.ProducerBackpressure`).
    backpressure: ProducerBackpressure = Field(default_factory=ProducerBackpressure)
    #: ``celery beat`` does not send an entry again while its previous job is unfinished
    #: (needs a result backend); each skip is a ``cron.skipped`` event.
    beat_skip_overlapping: bool = False
    #: Which rules decide whether a failed Celery job is retried (see
    #: :func:`ojs_kombu.celery.retries.failure_retryable`).  ``"celery"``: as under plain
    #: Celery, only ``autoretry_for`` exceptions and ``self.retry()`` are retried, within
    #: ``max_retries``, with Celery's delays; a task without ``autoretry_for`` publishes
    #: ``retry: {"max_attempts": 1}``.  ``"ojs"``: every failure (hard time limits and
    #: lost pool processes too) is retried under the OJS default policy merged with the
    #: task's Celery options.  A task with an ``ojs_retry`` option, and every job from
    #: another producer (no ``x_celery`` in its envelope), follow ``"ojs"`` either way.
    retry_semantics: Literal["celery", "ojs"] = "celery"
    #: The store of unique jobs and idempotency keys (``redis://127.0.0.1:6379/0``; needs
    #: ``pip install ojs-kombu[dedup]``).  ``None``: a job that asks for ``ojs_unique`` or
    #: ``ojs_idempotency_key`` is refused at publish (``DedupNotConfigured``).
    dedup_url: str | None = None
    #: Seconds a completed idempotency key, and a unique record without ``period``,
    #: are kept (every record expires; a key seen again later runs again).
    dedup_retention: float = Field(default=86_400.0, gt=0)
    #: A keyed job while the store is unreachable: ``"run"`` it (at least once, as
    #: without a key) or ``"retry"`` it later through the broker.  Never acked as a
    #: duplicate; either way ``ojs.dedup.degraded`` counts it and a warning says so.
    dedup_when_down: Literal["run", "retry"] = "run"

    @field_validator("on_publish_error")
    @classmethod
    def _callable_or_none(cls, value: Any) -> Any:
        if value is not None and not callable(value):
            raise ValueError(f"ojs_on_publish_error must be callable, not {value!r}")
        return value

    def control_users_of(self, queue: str) -> frozenset[str]:
        """The users ``control_users`` authorises for CANCEL and INFO on OJS ``queue``."""
        users = self.control_users
        if isinstance(users, list):
            return frozenset(users)
        return frozenset((*users.get("*", ()), *users.get(queue, ())))

    def schedule_arguments(self) -> dict[str, Any]:
        """``Queue.Declare`` arguments of the scheduling ladder, which every queue shares:
        ``schedule_queue_arguments`` as given, else quorum queues with at-least-once
        dead-lettering when ``queue_defaults`` makes job queues quorum (a scheduled job
        moving down the ladder is then never dropped while a cluster node is away)."""
        if self.schedule_queue_arguments:
            return dict(self.schedule_queue_arguments)
        if self.queue_defaults.type != "quorum":
            return {}
        return {"x-queue-type": "quorum", "x-dead-letter-strategy": "at-least-once",
                "x-overflow": "reject-publish"}

    def unroutable_dead_letter_arguments(self) -> dict[str, Any]:
        """``Queue.Declare`` arguments of ``ojs.queue.dlx.unroutable``, which every queue
        shares: a quorum queue when ``queue_defaults`` makes job queues (and their
        DLQs) quorum."""
        return {"x-queue-type": "quorum"} if self.queue_defaults.type == "quorum" else {}

    @classmethod
    def from_options(cls, options: Mapping[str, Any], *, source: str) -> OJSSettings:
        """Build from the ``ojs_*`` keys of ``options`` (and Celery's
        :data:`CELERY_MAX_PRIORITY`); ``source`` names them in errors."""
        values = {
            key[len(OPTION_PREFIX):]: value
            for key, value in options.items()
            if isinstance(key, str) and key.startswith(OPTION_PREFIX) and key != BINDING_OPTION
        }
        if "max_priority" not in values and options.get(CELERY_MAX_PRIORITY) is not None:
            values["max_priority"] = options[CELERY_MAX_PRIORITY]
        unknown = sorted(set(values) - set(cls.model_fields))
        if unknown:
            known = ", ".join(OPTION_PREFIX + name for name in cls.model_fields)
            raise OJSConfigurationError(
                f"unknown ojs_kombu setting(s) in {source}: "
                f"{', '.join(OPTION_PREFIX + u for u in unknown)} (known: {known})"
            )
        try:
            settings = cls(**values)
        except ValidationError as exc:
            raise OJSConfigurationError(f"invalid ojs_kombu setting in {source}: {exc}") from None
        for queue in settings.queue_arguments:
            check_queue_name(queue)
        if isinstance(settings.control_users, dict):
            for queue in settings.control_users:
                if queue != "*":
                    check_queue_name(queue)
        check_config("ojs_queue_defaults", settings.queue_defaults,
                     where="ojs_queue_defaults")
        for queue, config in settings.queues.items():
            check_queue_name(queue)
            merged_config(queue, settings.queue_defaults, config)
        return settings
