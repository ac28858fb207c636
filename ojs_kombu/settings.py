"""ojs_kombu settings, and the binding the transport works from.

Settings come from Celery config (``app.conf.ojs_prefix`` ...) through
:func:`ojs_kombu.install`, or from kombu transport options with the same
``ojs_`` names when kombu is used without Celery.  An ``ojs_*`` key that is
not a setting is an error, so a typo never silently falls back to a default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .envelope import RetryPolicy
from .errors import OJSConfigurationError
from .events.bus import EventBus
from .events.emitter import JobEvents
from .job_types import JobTypeRegistry, TaskLookup
from .naming import DEFAULT_QUEUE_ALIASES, TopologyNames, check_queue_name

OPTION_PREFIX = "ojs_"
RetryPolicyLookup = Callable[[str], "RetryPolicy | None"]
#: Transport option holding a ready-made :class:`Binding` (set by ``install()``).
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
    #: Prefetch applied when a job queue is consumed before ``Basic.Qos`` was set.
    default_prefetch: int = Field(default=1, ge=1)
    #: Schedule through ``ojs.exchange.delayed`` (needs RabbitMQ's delayed-message
    #: plugin) instead of the TTL ladder.
    delayed_exchange: bool = False
    #: ``republish``: a discarded job is published to the DLX with its error
    #: headers and history, then acked.  ``nack``: ``Basic.Nack(requeue=false)``,
    #: which keeps the message as it was (no error headers).
    dead_letter_mode: Literal["republish", "nack"] = "republish"
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
    #: ``celery beat`` does not send an entry again while its previous job is unfinished
    #: (needs a result backend); each skip is a ``cron.skipped`` event.
    beat_skip_overlapping: bool = False

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

    def declare_arguments(self, queue: str) -> dict[str, Any]:
        """Extra ``Queue.Declare`` arguments of job queue ``queue`` (beyond dead-lettering)."""
        arguments = dict(self.queue_arguments.get(queue) or {})
        if self.settings.max_priority is not None and "x-queue-type" not in arguments:
            arguments.setdefault("x-max-priority", self.settings.max_priority)
        return arguments

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

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Binding:
        binding = options.get(BINDING_OPTION)
        if binding is not None:
            if not isinstance(binding, Binding):
                raise OJSConfigurationError(
                    f"transport option {BINDING_OPTION} must be an ojs_kombu Binding"
                )
            return binding
        return cls.from_settings(OJSSettings.from_options(options, source="transport options"))
