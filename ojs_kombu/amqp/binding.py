"""The Binding: what the transport needs to speak OJS, built once per app.

Settings, topology names, the job-type registry, the retry policy lookup the
Celery floor sets, this process's lifecycle events and producer backpressure.
Transport options carry a string key of it (:func:`register_binding`), so they
stay JSON for ``celery inspect stats`` and Flower.
"""

from __future__ import annotations

import itertools
import logging
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ..events.bus import EventBus
from ..events.emitter import JobEvents
from ..events.hook import Hook
from ..events.metric_observer import MetricsObserver
from ..events.metrics import OJSMetrics
from ..spec.backpressure import (
    Bounds,
    QueueConfig,
    check_arguments,
    merged_config,
    queue_arguments,
)
from ..spec.envelope import RetryPolicy
from ..spec.errors import OJSConfigurationError
from ..spec.job_types import JobTypeRegistry, TaskLookup
from ..spec.naming import TopologyNames
from ..spec.settings import BINDING_OPTION, OJSSettings
from .backpressure.monitor import BackpressureMonitor

logger = logging.getLogger("ojs_kombu")

RetryPolicyLookup = Callable[[str], "RetryPolicy | None"]


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
    #: The instruments of ``ojs_meter_provider`` (the global provider by default).
    metrics: OJSMetrics = field(default_factory=OJSMetrics, compare=False)
    #: ``Queue.Declare`` extras per OJS queue: ``ojs_queue_arguments`` plus those of
    #: the Celery queue definitions, so every declaration of a queue is the same.
    queue_arguments: dict[str, dict[str, Any]] = field(default_factory=dict)

    @cached_property
    def hook(self) -> Hook:
        """Where the transport and the Celery wiring say what happened: the OJS events,
        then the metrics, then the observers the app adds."""
        return Hook(self.events, MetricsObserver(self.metrics))

    @classmethod
    def from_settings(cls, settings: OJSSettings, tasks: TaskLookup | None = None,
                      retry_policy_for: RetryPolicyLookup | None = None,
                      events: JobEvents | None = None) -> Binding:
        names = TopologyNames(prefix=settings.prefix, queue_aliases=settings.queue_aliases)
        return cls(settings, names, JobTypeRegistry(settings.job_types, tasks), retry_policy_for,
                   events or JobEvents(EventBus(), "ojs://ojs-kombu"),
                   OJSMetrics(settings.meter_provider),
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
        return BackpressureMonitor(self.settings.backpressure, self.bounds, hook=self.hook,
                                   metrics=self.metrics)

    def warn_unbounded(self, queues: Iterable[str]) -> list[str]:
        """Log one warning naming those of ``queues`` without a bound (backpressure 6.3);
        return them.  A queue whose ``max_depth`` is set to 0 (unbounded on purpose, in
        ``ojs_queues`` or ``ojs_queue_defaults``) is not named."""
        unbounded = sorted({q for q in queues if not self.bounds(q).bounded
                            and not self._unbounded_on_purpose(q)})
        if unbounded:
            logger.warning(
                "OJS queue(s) %s have no bound: producers can fill them without limit. "
                "Bound them with app.conf.ojs_queues = {'<queue>': {'max_depth': N}} (or "
                "ojs_queue_defaults), or set max_depth=0 to keep them unbounded on purpose",
                ", ".join(repr(q) for q in unbounded))
        return unbounded

    def _unbounded_on_purpose(self, queue: str) -> bool:
        settings = self.settings
        return any(config is not None and "max_depth" in config.model_fields_set
                   and config.max_depth == 0
                   for config in (settings.queues.get(queue), settings.queue_defaults))

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
