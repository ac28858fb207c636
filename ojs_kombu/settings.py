"""ojs_kombu settings, and the binding the transport works from.

Settings come from Celery config (``app.conf.ojs_prefix`` ...) through
:func:`ojs_kombu.install`, or from kombu transport options with the same
``ojs_`` names when kombu is used without Celery.  An ``ojs_*`` key that is
not a setting is an error, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import itertools
import logging
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .backpressure import (
    BackpressureMonitor,
    Bounds,
    ProducerBackpressure,
    QueueConfig,
    check_arguments,
    check_config,
    merged_config,
    queue_arguments,
)
from .envelope import RetryPolicy
from .errors import OJSConfigurationError
from .events.bus import EventBus
from .events.emitter import JobEvents
from .job_types import JobTypeRegistry, TaskLookup
from .naming import DEFAULT_QUEUE_ALIASES, TopologyNames, check_queue_name

logger = logging.getLogger("ojs_kombu")

OPTION_PREFIX = "ojs_"
RetryPolicyLookup = Callable[[str], "RetryPolicy | None"]
#: Transport option naming a ready-made :class:`Binding` of this process by its
#: :func:`register_binding` key (``install()`` sets it on every connection of the app).
#: A string, not the object: Celery reports a connection's transport options as JSON
#: (``celery inspect stats``, Flower's worker page).  The transport itself also accepts
#: the :class:`Binding` object.
BINDING_OPTION = "ojs_binding"


class OJSSettings(BaseModel):
    """Every setting, with its default; ``app.conf.ojs_<name>`` sets ``<name>``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Multi-tenancy prefix: ``tenant1`` gives ``tenant1.ojs.queue.email``.
    prefix: str = ""
    #: Celery queue name -> OJS queue name; Celery's ``celery`` is OJS's ``default``.
    queue_aliases: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_QUEUE_ALIASES))
    #: Celery task name -> OJS job type, for names that do not fit the OJS grammar.
    job_types: dict[str, str] = Field(default_factory=dict)
    #: Extra ``Queue.Declare`` arguments per OJS queue (``{"email": {"x-max-length": 1000}}``).
    queue_arguments: dict[str, dict[str, Any]] = Field(default_factory=dict)
    #: ``x-max-priority`` of job queues (AMQP-030); 10 as in the binding's section 15.1
    #: producer example, so queues declared by spec-following producers are equivalent.
    #: ``None`` declares queues without priorities.  Not applied to queues given an
    #: ``x-queue-type`` (quorum and stream queues refuse ``x-max-priority``).
    max_priority: int | None = Field(default=10, ge=1, le=255)
    #: Seconds to wait for a publisher confirm before raising ``PublishConfirmTimeout``.
    confirm_timeout: float = Field(default=30.0, gt=0)
    #: Largest job body (the envelope's JSON, in bytes) a producer publishes; a bigger
    #: one raises ``JobTooLargeError`` before anything is sent.  The default is
    #: RabbitMQ's default ``max_message_size`` (128 MiB); ``None``: no check.
    max_job_bytes: int | None = Field(default=134_217_728, ge=1)
    #: How a worker sends its acks (see :mod:`ojs_kombu.acks`).  ``"batched"``: the
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
    #: ``nack`` (AMQP-009): a discarded job is ``Basic.Nack(requeue=false)``; the
    #: broker dead-letters it as it was delivered.  ``republish`` (a deviation): it
    #: is published to the DLX with its last error in ``x-ojs-error-*`` and its
    #: history, then acked.  Invalid messages are always republished with headers.
    dead_letter_mode: Literal["republish", "nack"] = "nack"
    #: ``Queue.Declare`` arguments of the scheduling ladder's queues
    #: (``{"x-queue-type": "quorum"}`` for quorum queues).
    schedule_queue_arguments: dict[str, Any] = Field(default_factory=dict)
    #: Where OJS events go: ``"amqp"``, ``"file:/path.jsonl"``,
    #: ``{"webhook": url, "secret": ...}``, a callable, or a dict of these with a
    #: ``"filter"`` (see :func:`ojs_kombu.celery_events.sink_from_spec`).
    event_sinks: list[Any] = Field(default_factory=list)
    #: ``{service}`` of event sources ``ojs://{service}/{component}/{instance}``
    #: (default: the Celery app's name).
    event_service: str | None = None
    #: Seconds between ``worker.heartbeat`` events (0: none).
    worker_heartbeat: float = Field(default=30.0, ge=0)
    #: A job running longer than this many seconds gets an ``ojs.control.heartbeat``
    #: (and a ``job.heartbeat`` event) every as many seconds (0: none).
    job_heartbeat: float = Field(default=30.0, ge=0)
    #: Whether workers consume the control queues of their queues (CANCEL, INFO).
    control_queues: bool = True
    #: OpenTelemetry ``MeterProvider`` for ojs_kombu's metrics (default: the global one).
    meter_provider: Any = None
    #: Per OJS queue: bounds and backpressure strategy, priorities, queue type
    #: (``{"email": {"max_depth": 10000, "strategy": "reject", "warn_at": 0.8}}``,
    #: see :class:`~ojs_kombu.backpressure.QueueConfig`).
    queues: dict[str, QueueConfig] = Field(default_factory=dict)
    #: Defaults of every queue's ``ojs_queues`` entry (``{"type": "quorum"}``).
    queue_defaults: QueueConfig = Field(default_factory=QueueConfig)
    #: Producer retries, circuit breaker and depth sampling
    #: (:class:`~ojs_kombu.backpressure.ProducerBackpressure`).
    backpressure: ProducerBackpressure = Field(default_factory=ProducerBackpressure)
    #: ``celery beat`` does not send an entry again while its previous job is unfinished
    #: (needs a result backend); each skip is a ``cron.skipped`` event.
    beat_skip_overlapping: bool = False
    #: Which rules decide whether a failed Celery job is retried (see
    #: :func:`ojs_kombu.worker.failure_retryable`).  ``"celery"``: as under plain
    #: Celery, only ``autoretry_for`` exceptions and ``self.retry()`` are retried, within
    #: ``max_retries``, with Celery's delays; a task without ``autoretry_for`` publishes
    #: ``retry: {"max_attempts": 1}``.  ``"ojs"``: every failure (hard time limits and
    #: lost pool processes too) is retried under the OJS default policy merged with the
    #: task's Celery options.  A task with an ``ojs_retry`` option, and every job from
    #: another producer (no ``x_celery`` in its envelope), follow ``"ojs"`` either way.
    retry_semantics: Literal["celery", "ojs"] = "celery"

    @classmethod
    def from_options(cls, options: Mapping[str, Any], *, source: str) -> OJSSettings:
        """Build from the ``ojs_*`` keys of ``options``; ``source`` names them in errors."""
        values = {
            key[len(OPTION_PREFIX):]: value
            for key, value in options.items()
            if isinstance(key, str) and key.startswith(OPTION_PREFIX) and key != BINDING_OPTION
        }
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
        check_config("ojs_queue_defaults", settings.queue_defaults,
                     where="ojs_queue_defaults")
        for queue, config in settings.queues.items():
            check_queue_name(queue)
            merged_config(queue, settings.queue_defaults, config)
        return settings


@dataclass(frozen=True)
class Binding:
    """What the transport needs to speak OJS: settings, names and the type registry."""

    settings: OJSSettings
    names: TopologyNames
    job_types: JobTypeRegistry
    #: Effective retry policy of a task name (set by the Celery wiring), or ``None``.
    retry_policy_for: RetryPolicyLookup | None = field(default=None, compare=False)
    #: Lifecycle events of this process (silent until something subscribes).
    events: JobEvents = field(default_factory=lambda: JobEvents(EventBus(), "ojs://ojs-kombu"),
                              compare=False)
    #: ``Queue.Declare`` extras per OJS queue: ``ojs_queue_arguments`` plus those of
    #: the Celery queue definitions, so every declaration of a queue is the same.
    queue_arguments: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: OJSSettings, tasks: TaskLookup | None = None,
                      retry_policy_for: RetryPolicyLookup | None = None,
                      events: JobEvents | None = None) -> Binding:
        names = TopologyNames(prefix=settings.prefix, queue_aliases=settings.queue_aliases)
        return cls(settings, names, JobTypeRegistry(settings.job_types, tasks), retry_policy_for,
                   events or JobEvents(EventBus(), "ojs://ojs-kombu"),
                   {q: dict(a) for q, a in settings.queue_arguments.items()})

    def queue_config(self, queue: str) -> QueueConfig:
        """``ojs_queues[queue]`` over ``ojs_queue_defaults``."""
        settings = self.settings
        return merged_config(queue, settings.queue_defaults, settings.queues.get(queue))

    def declare_arguments(self, queue: str) -> dict[str, Any]:
        """Extra ``Queue.Declare`` arguments of job queue ``queue`` (beyond dead-lettering).

        ``ojs_queues``/``ojs_queue_defaults`` give the bound, overflow, priority and
        type arguments; raw ones (``ojs_queue_arguments``, Celery ``Queue`` options)
        are added, a raw ``x-max-priority`` or ``x-queue-type`` replacing the default
        priority.  A bound without ``x-overflow`` rejects publishes (drop-head, RabbitMQ's
        default, is opt-in only).  Raises :class:`OJSConfigurationError` naming the
        queue for clashing values and for combinations the broker refuses.
        """
        config = self.queue_config(queue)
        raw = dict(self.queue_arguments.get(queue) or {})
        arguments = queue_arguments(config, self.settings.max_priority)
        explicit_priority = config.priority is not None
        if "x-max-priority" in raw or (
                raw.get("x-queue-type", "classic") != "classic" and not explicit_priority):
            arguments.pop("x-max-priority", None)
        clashes = sorted(k for k in raw if k in arguments and arguments[k] != raw[k])
        if clashes:
            raise OJSConfigurationError(
                f"queue {queue!r}: ojs_queues/ojs_queue_defaults give "
                f"{ {k: arguments[k] for k in clashes} } but its queue arguments "
                f"(ojs_queue_arguments or the Celery Queue) give { {k: raw[k] for k in clashes} }"
            )
        arguments.update(raw)
        if ("x-max-length" in arguments or "x-max-length-bytes" in arguments) \
                and "x-overflow" not in arguments:
            arguments["x-overflow"] = "reject-publish"
        check_arguments(queue, arguments)
        return arguments

    def bounds(self, queue: str) -> Bounds:
        """``queue``'s bound and strategy as declared (cached until its arguments change)."""
        bounds = self._bounds.get(queue)
        if bounds is None:
            bounds = self._bounds[queue] = Bounds.of(self.declare_arguments(queue),
                                                     self.queue_config(queue))
        return bounds

    @cached_property
    def _bounds(self) -> dict[str, Bounds]:
        return {}

    @cached_property
    def backpressure(self) -> BackpressureMonitor:
        """This process's producer-side backpressure (events, retries, circuit breaker)."""
        return BackpressureMonitor(self.settings.backpressure, self.bounds,
                                   source=self.events.source, metrics=self.events.metrics)

    def warn_unbounded(self, queues: Iterable[str]) -> list[str]:
        """Log a warning for each of ``queues`` without a bound (section 6.3); return them."""
        unbounded = sorted({q for q in queues if not self.bounds(q).bounded})
        for queue in unbounded:
            logger.warning(
                "OJS queue %r has no bound: producers can fill it without limit. Set "
                "app.conf.ojs_queues = {%r: {'max_depth': ...}} (or ojs_queue_defaults)",
                queue, queue)
        return unbounded

    def add_queue_arguments(self, queue: str, arguments: Mapping[str, Any]) -> None:
        """Record extra arguments for ``queue``; two different definitions are an error."""
        if not arguments:
            return
        known = self.queue_arguments.setdefault(queue, {})
        clashes = {k for k, v in arguments.items() if k in known and known[k] != v}
        if clashes:
            raise OJSConfigurationError(
                f"queue {queue!r} is defined twice with different arguments "
                f"({', '.join(sorted(clashes))}): {known!r} and {dict(arguments)!r}"
            )
        known.update(arguments)
        self._bounds.pop(queue, None)

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Binding:
        """The binding ``options[BINDING_OPTION]`` names, else one built from the
        ``ojs_*`` options."""
        binding = registered_binding(options)
        if binding is not None:
            return binding
        value = options.get(BINDING_OPTION)
        if value is not None:
            raise OJSConfigurationError(
                f"transport option {BINDING_OPTION}={value!r} names no ojs_kombu Binding of "
                "this process: it is set by ojs_kombu.install() and holds a key of "
                "register_binding() (or a Binding); remove it and set ojs_* options instead"
            )
        return cls.from_settings(OJSSettings.from_options(options, source="transport options"))


#: ``register_binding`` key -> binding; an app's binding lives as long as the app.
_BINDINGS: weakref.WeakValueDictionary[str, Binding] = weakref.WeakValueDictionary()
_keys = itertools.count(1)


def register_binding(binding: Binding, name: str = "binding") -> str:
    """Make ``binding`` reachable from transport options by the returned key.

    The key is a plain string, so the options stay JSON; it is valid in this
    process and in processes forked from it (prefork pool processes), where the
    registry is inherited.  ``name`` (an app's name) only makes the key readable.
    """
    key = f"{name}#{next(_keys)}"
    _BINDINGS[key] = binding
    return key


def registered_binding(options: Mapping[str, Any] | None) -> Binding | None:
    """The binding that ``options[BINDING_OPTION]`` names (a key or the object), if any."""
    value = (options or {}).get(BINDING_OPTION)
    if isinstance(value, Binding):
        return value
    return _BINDINGS.get(value) if isinstance(value, str) else None
