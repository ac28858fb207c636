"""Backpressure (``ojs-backpressure.md``) mapped onto RabbitMQ queue arguments.

RabbitMQ enforces the bound: a job queue declared with ``x-max-length`` /
``x-max-length-bytes`` and ``x-overflow=reject-publish`` answers a publish into
a full queue with ``Basic.Nack``, and the message is not stored.  This module
is the pure half: per-queue settings, the arguments they declare, the bounds a
producer reads back and the producer-side settings.  ``drop_oldest`` is
``x-overflow=drop-head``: RabbitMQ drops the head and dead-letters it (reason
``maxlen``) into the queue's DLQ, because every job queue has a dead-letter
exchange.  The monitor that acts on a publish lives in
:mod:`ojs_kombu.amqp.backpressure.monitor`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .errors import (
    OJSConfigurationError,
)
from .failures import latest_death

logger = logging.getLogger("ojs_kombu.spec.backpressure")

Strategy = Literal["reject", "block", "drop_oldest"]
QueueType = Literal["classic", "quorum"]
DeadLetterStrategy = Literal["at-most-once", "at-least-once"]

#: Event types of the backpressure extension (section 10.1).  They are not in the
#: OJS event catalog (``event.schema.json`` enumerates ``type``), so they are not
#: sent to the OJS event sinks; see :meth:`BackpressureMonitor.subscribe`.
BACKPRESSURE_EVENT_TYPES = ("backpressure.warning", "backpressure.rejected",
                            "backpressure.dropped", "backpressure.cleared")
#: ``x-max-priority`` used for ``priority=True`` when ``ojs_max_priority`` is off.
DEFAULT_MAX_PRIORITY = 10
_REJECTING = ("reject-publish", "reject-publish-dlx")


class QueueConfig(BaseModel):
    """One job queue's ``ojs_queues`` entry (or ``ojs_queue_defaults``).

    Bounds follow section 6.2 (``0`` means unbounded).  ``priority``: ``None``
    takes ``ojs_max_priority`` on classic queues, ``True``/``False`` switch
    ``x-max-priority`` on/off, an integer is the ``x-max-priority``.
    ``dead_letter_strategy="at-least-once"`` (quorum only) makes RabbitMQ keep a
    dead-lettered job until its target queue confirmed it; unset, it is the
    strategy of the queue's type (:attr:`dead_lettering`).  ``delivery_limit``
    (quorum only) is ``x-delivery-limit``: a job returned to the queue more often
    is dead-lettered (reason ``delivery_limit``); unset, the broker's default
    (RabbitMQ 4.0+: 20; 3.x: none).
    """

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True, strict=True)

    max_depth: int = Field(default=0, ge=0)
    max_size_bytes: int = Field(default=0, ge=0)
    strategy: Strategy = "reject"
    #: Fraction of ``max_depth`` at which ``backpressure.warning`` fires (section 6.2).
    warn_at: float = Field(default=0.8, gt=0, le=1)
    #: ``block``: seconds a producer keeps trying before it raises ``QueueFullError``.
    block_timeout: float = Field(default=30.0, gt=0)
    priority: bool | int | None = None
    type: QueueType = "classic"
    dead_letter_strategy: DeadLetterStrategy | None = None
    delivery_limit: int | None = Field(default=None, ge=1)

    @property
    def bounded(self) -> bool:
        return bool(self.max_depth or self.max_size_bytes)

    @property
    def dead_lettering(self) -> DeadLetterStrategy:
        """The strategy declared: the one given, else at-least-once on quorum queues
        (a retry, a scheduled job or a job over its delivery limit is then kept until
        its target queue confirmed it, also while a cluster node is away) unless they
        drop their oldest jobs (``drop-head`` dead-letters at most once)."""
        if self.dead_letter_strategy is not None:
            return self.dead_letter_strategy
        if self.type == "quorum" and self.strategy != "drop_oldest":
            return "at-least-once"
        return "at-most-once"


def merged_config(queue: str, defaults: QueueConfig, own: QueueConfig | None) -> QueueConfig:
    """``own``'s explicitly given fields over ``defaults``; checked (raises naming ``queue``)."""
    if own is None:
        config = defaults
    else:
        values = defaults.model_dump(include=defaults.model_fields_set)
        values.update(own.model_dump(include=own.model_fields_set))
        config = QueueConfig(**values)
    explicit_priority = own is not None and "priority" in own.model_fields_set
    check_config(queue, config, explicit_priority or "priority" in defaults.model_fields_set)
    return config


def check_config(queue: str, config: QueueConfig, explicit_priority: bool = True,
                 where: str | None = None) -> None:
    """Refuse what RabbitMQ would refuse (or silently ignore) before anything is declared."""
    where = where or f"ojs_queues[{queue!r}]"
    if config.strategy == "drop_oldest" and not config.bounded:
        raise OJSConfigurationError(
            f"{where}: strategy 'drop_oldest' needs max_depth or max_size_bytes "
            "(it drops jobs only when the bound is reached)")
    if config.type == "classic" and config.dead_letter_strategy == "at-least-once":
        raise OJSConfigurationError(
            f"{where}: dead_letter_strategy 'at-least-once' needs type 'quorum' "
            "(classic queues dead-letter at most once)")
    if config.type == "classic" and config.delivery_limit is not None:
        raise OJSConfigurationError(
            f"{where}: delivery_limit needs type 'quorum' (x-delivery-limit is a "
            "quorum-queue argument)")
    if config.dead_letter_strategy == "at-least-once" and config.strategy == "drop_oldest":
        raise OJSConfigurationError(
            f"{where}: strategy 'drop_oldest' (x-overflow=drop-head) cannot be combined with "
            "dead_letter_strategy 'at-least-once', which needs x-overflow=reject-publish; "
            "RabbitMQ would fall back to at-most-once dead-lettering")
    if config.type == "quorum" and explicit_priority and config.priority not in (None, False):
        raise OJSConfigurationError(
            f"{where}: priority needs a classic queue; quorum queues refuse x-max-priority "
            "(RabbitMQ 3.x) - set priority=False or type='classic'")
    if isinstance(config.priority, int) and not isinstance(config.priority, bool) \
            and not 1 <= config.priority <= 255:
        raise OJSConfigurationError(f"{where}: priority {config.priority} is not in 1..255")


def queue_arguments(config: QueueConfig, default_max_priority: int | None) -> dict[str, Any]:
    """The ``Queue.Declare`` arguments ``config`` stands for (beyond dead-lettering)."""
    args: dict[str, Any] = {}
    if config.type == "quorum":
        args["x-queue-type"] = "quorum"
    if config.delivery_limit is not None:
        args["x-delivery-limit"] = config.delivery_limit
    if config.max_depth:
        args["x-max-length"] = config.max_depth
    if config.max_size_bytes:
        args["x-max-length-bytes"] = config.max_size_bytes
    if config.dead_lettering == "at-least-once":
        args["x-dead-letter-strategy"] = "at-least-once"
        args["x-overflow"] = "reject-publish"
    elif config.bounded:
        args["x-overflow"] = "drop-head" if config.strategy == "drop_oldest" else "reject-publish"
    priority = config.priority
    if priority is None:
        priority = default_max_priority if config.type == "classic" else None
    elif priority is True:
        priority = default_max_priority or DEFAULT_MAX_PRIORITY
    if priority:
        args["x-max-priority"] = int(priority)
    return args


def drops_head(arguments: Mapping[str, Any]) -> bool:
    """Whether a job queue declared with ``arguments`` drops its oldest jobs when full
    (``drop_oldest``), which makes RabbitMQ dead-letter them with reason ``maxlen``."""
    bounded = "x-max-length" in arguments or "x-max-length-bytes" in arguments
    return bounded and arguments.get("x-overflow") == "drop-head"


def rejects_when_full(arguments: Mapping[str, Any]) -> bool:
    """Whether a job queue declared with ``arguments`` refuses messages when full
    (``reject``/``block``: ``x-overflow=reject-publish``).  Such a queue would also
    refuse a retried or scheduled job whose delay ends while it is full, and
    RabbitMQ drops a refused dead-lettered message; so those jobs reach it
    through its ready queue (``ojs.queue.ready.{q}``) instead."""
    bounded = "x-max-length" in arguments or "x-max-length-bytes" in arguments
    return bounded and arguments.get("x-overflow") == "reject-publish"


def maxlen_death(headers: Mapping[str, Any], job_queue: str) -> Mapping[str, Any] | None:
    """The ``x-death`` entry of a message RabbitMQ dropped from ``job_queue`` (the
    AMQP name) because the queue was at its bound, else ``None`` (the latest entry
    counts: :func:`~.failures.latest_death`)."""
    latest = latest_death(headers)
    if latest is not None and latest.get("reason") == "maxlen" and latest.get("queue") == job_queue:
        return latest
    return None


def check_arguments(queue: str, arguments: Mapping[str, Any]) -> None:
    """Refuse argument combinations RabbitMQ rejects, whatever setting they came from."""
    quorum = arguments.get("x-queue-type") == "quorum"
    overflow = arguments.get("x-overflow")
    if quorum and "x-max-priority" in arguments:
        raise OJSConfigurationError(
            f"queue {queue!r}: x-max-priority is a classic-queue argument; quorum queues "
            "refuse it (RabbitMQ 3.x). Turn priority off for this queue")
    if quorum and overflow == "reject-publish-dlx":
        raise OJSConfigurationError(
            f"queue {queue!r}: quorum queues support x-overflow drop-head or reject-publish, "
            "not reject-publish-dlx")
    if arguments.get("x-dead-letter-strategy") == "at-least-once":
        if not quorum:
            raise OJSConfigurationError(
                f"queue {queue!r}: x-dead-letter-strategy=at-least-once needs "
                "x-queue-type=quorum")
        if overflow != "reject-publish":
            raise OJSConfigurationError(
                f"queue {queue!r}: x-dead-letter-strategy=at-least-once needs "
                f"x-overflow=reject-publish (got {overflow!r}); RabbitMQ would dead-letter at "
                "most once")


@dataclass(frozen=True, slots=True)
class Bounds:
    """A queue's bound as declared, and the strategy its producers follow."""

    max_depth: int | None = None
    max_bytes: int | None = None
    overflow: str | None = None
    strategy: Strategy = "reject"
    warn_at: float = 0.8
    block_timeout: float = 30.0

    @classmethod
    def of(cls, arguments: Mapping[str, Any], config: QueueConfig) -> Bounds:
        """From the final ``Queue.Declare`` arguments (also ``ojs_queue_arguments``/Celery ones)."""
        depth, size = arguments.get("x-max-length"), arguments.get("x-max-length-bytes")
        return cls(int(depth) if depth is not None else None,
                   int(size) if size is not None else None,
                   arguments.get("x-overflow"), config.strategy, config.warn_at,
                   config.block_timeout)

    @property
    def bounded(self) -> bool:
        return self.max_depth is not None or self.max_bytes is not None

    @property
    def drops(self) -> bool:
        """Whether the broker drops the oldest job when the queue is full (``drop_oldest``)."""
        return self.bounded and self.overflow == "drop-head"

    @property
    def rejects(self) -> bool:
        """Whether the broker nacks publishes into the full queue (RabbitMQ's default
        overflow is drop-head)."""
        return self.bounded and self.overflow in _REJECTING

    @property
    def bound(self) -> int | None:
        return self.max_depth if self.max_depth is not None else self.max_bytes

    def pressure(self, depth: int | None) -> float | None:
        """depth / max_depth in 0.0..1.0 (section 7.3); ``None`` without a depth bound."""
        if depth is None or self.max_depth is None:
            return None
        if self.max_depth == 0:
            return 1.0
        return min(max(depth / self.max_depth, 0.0), 1.0)


class ProducerBackpressure(BaseModel):
    """``ojs_backpressure``: how producers react to a full queue (sections 8.1, 8.2)."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True, strict=True)

    #: Automatic re-publishes of a rejected job before ``QueueFullError`` reaches the
    #: caller (``reject`` queues; ``block`` queues retry until their ``block_timeout``).
    retries: int = Field(default=0, ge=0)
    #: First wait (the ``Retry-After`` hint), doubled per consecutive rejection.
    retry_delay: float = Field(default=1.0, gt=0)
    max_retry_delay: float = Field(default=30.0, gt=0)
    #: Shortest wait between two publishes of a ``block`` producer.
    block_poll: float = Field(default=0.05, gt=0)
    #: Refuse jobs for a queue without sending them after ``breaker_threshold``
    #: consecutive rejections, for ``breaker_cooldown`` seconds (section 8.2).
    circuit_breaker: bool = False
    breaker_threshold: int = Field(default=5, ge=1)
    breaker_cooldown: float = Field(default=10.0, gt=0)
    #: Seconds between two depth reads of a bounded queue by one producer (0: after
    #: every publish); they drive ``backpressure.warning``/``cleared`` and the gauge.
    sample_interval: float = Field(default=1.0, ge=0)
