"""OJS entity names (AMQP binding section 4.1) and the grammars of OJS names.

Pure functions and values only: the transport, the Celery wiring and the
tests all derive every AMQP name from :class:`TopologyNames`, so a prefix
or a naming rule changes in exactly one place.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from .errors import OJSConfigurationError, QueueNameError

#: ``type``: dot-separated segments, each ``[a-z][a-z0-9_]*``, at most 255 characters.
JOB_TYPE_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")
JOB_TYPE_MAX = 255
#: ``queue``: ``[a-z0-9][a-z0-9\-\.]*``, at most 128 characters.
QUEUE_RE = re.compile(r"^[a-z0-9][a-z0-9\-.]*$")
QUEUE_MAX = 128
#: Lowercase UUIDv7, 8-4-4-4-12.
JOB_ID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")

#: Queue names that would collide with the per-queue dead-letter, retry,
#: control and dropped-job queues and the scheduling ladder (``ojs.queue.dlx.email``
#: is the DLQ of ``email``, so an OJS queue called ``dlx.email`` cannot exist).
RESERVED_QUEUE_PREFIXES = ("dlx.", "retry.", "control.", "schedule.", "dropped.", "ready.")
#: The name under which ``ojs-kombu dlq`` reaches the dead letters no DLQ took
#: (``ojs.queue.dlx.unroutable``), so no OJS queue may have it.
UNROUTABLE = "unroutable"

#: Celery's built-in default queue name maps onto OJS's default queue.
DEFAULT_QUEUE_ALIASES: Mapping[str, str] = {"celery": "default"}


def is_job_type(value: str) -> bool:
    return len(value) <= JOB_TYPE_MAX and JOB_TYPE_RE.match(value) is not None


def is_job_id(value: str) -> bool:
    return JOB_ID_RE.match(value) is not None


def check_queue_name(name: str) -> str:
    """Return ``name`` if it is a usable OJS queue name, else raise :class:`QueueNameError`."""
    if not isinstance(name, str) or not name:
        raise QueueNameError(str(name), "it is empty")
    if len(name) > QUEUE_MAX:
        raise QueueNameError(name, f"it is longer than {QUEUE_MAX} characters")
    if QUEUE_RE.match(name) is None:
        raise QueueNameError(
            name, "OJS queue names use lowercase letters, digits, '-' and '.', "
            "starting with a letter or digit"
        )
    if "ojs.queue." in name or "ojs.exchange." in name:
        raise QueueNameError(name, "it would collide with the routing keys of control queues")
    if name == UNROUTABLE:
        raise QueueNameError(name, "ojs.queue.dlx.unroutable holds the dead letters whose "
                             "own dead-letter queue was missing")
    if name.startswith(RESERVED_QUEUE_PREFIXES):
        raise QueueNameError(
            name, f"names starting with {', '.join(RESERVED_QUEUE_PREFIXES)} collide "
            "with OJS dead-letter, retry, control, dropped-job and ready queues"
        )
    return name


def normalize_prefix(prefix: str) -> str:
    """``'tenant1'`` and ``'tenant1.'`` both give ``'tenant1.'``; ``''`` stays empty."""
    if not prefix:
        return ""
    if not re.match(r"^[A-Za-z0-9_\-.]+$", prefix):
        raise OJSConfigurationError(
            f"topology prefix {prefix!r} may only hold letters, digits, '_', '-' and '.'"
        )
    return prefix if prefix.endswith(".") else prefix + "."


@dataclass(frozen=True)
class TopologyNames:
    """Every AMQP name of the OJS topology, optionally behind a multi-tenancy prefix."""

    prefix: str = ""
    queue_aliases: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_QUEUE_ALIASES))
    #: ``ojs_queue`` results: the mapping runs on every publish.
    _mapped: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefix", normalize_prefix(self.prefix))
        for celery_name, ojs_name in self.queue_aliases.items():
            check_queue_name(ojs_name)
            if not celery_name:
                raise OJSConfigurationError("queue alias with an empty Celery queue name")

    @property
    def direct_exchange(self) -> str:
        return f"{self.prefix}ojs.exchange.direct"

    @property
    def dlx_exchange(self) -> str:
        return f"{self.prefix}ojs.exchange.dlx"

    @property
    def dlx_guard_exchange(self) -> str:
        """Between ``ojs.exchange.dlx`` and each DLQ: a dead letter whose DLQ is gone
        goes on to its alternate exchange, :attr:`dlx_unroutable_exchange`."""
        return f"{self.prefix}ojs.exchange.dlx.guard"

    @property
    def dlx_unroutable_exchange(self) -> str:
        """Takes the dead letters no DLQ took (fanout into :attr:`dlx_unroutable_queue`)."""
        return f"{self.prefix}ojs.exchange.dlx.unroutable"

    @property
    def dlx_unroutable_queue(self) -> str:
        """Dead letters whose ``ojs.queue.dlx.{q}`` was missing (deleted) when they died."""
        return f"{self.prefix}ojs.queue.dlx.{UNROUTABLE}"

    @property
    def retry_exchange(self) -> str:
        return f"{self.prefix}ojs.exchange.retry"

    @property
    def delayed_exchange(self) -> str:
        return f"{self.prefix}ojs.exchange.delayed"

    def schedule_exchange(self, level: int) -> str:
        """Level ``level`` of the scheduling ladder (topic; its messages wait ``2**level`` ms)."""
        return f"{self.prefix}ojs.exchange.schedule.{level}"

    def schedule_queue(self, level: int) -> str:
        return f"{self.prefix}ojs.queue.schedule.{level}"

    @property
    def schedule_ready_exchange(self) -> str:
        """Where a fully waited scheduled job leaves the ladder for its job queue."""
        return f"{self.prefix}ojs.exchange.schedule.ready"

    @property
    def schedule_unroutable_exchange(self) -> str:
        return f"{self.prefix}ojs.exchange.schedule.unroutable"

    def exchanges(self, *, events: bool = True, delayed: bool = True) -> list[str]:
        """Every exchange ojs_kombu declares: those of every worker and producer, then
        ``ojs.exchange.events`` (the ``"amqp"`` event sink) and ``ojs.exchange.delayed``
        (``ojs_delayed_exchange``) unless left out (what a rollback deletes)."""
        from .delays import SCHEDULE_LEVELS

        found = [self.direct_exchange, self.dlx_exchange, self.dlx_guard_exchange,
                 self.dlx_unroutable_exchange, self.retry_exchange,
                 self.schedule_ready_exchange, self.schedule_unroutable_exchange,
                 *(self.schedule_exchange(k) for k in range(SCHEDULE_LEVELS))]
        if events:
            found.append(f"{self.prefix}ojs.exchange.events")
        if delayed:
            found.append(self.delayed_exchange)
        return found

    @property
    def schedule_unroutable_queue(self) -> str:
        """Scheduled jobs whose job queue disappeared while they waited."""
        return f"{self.prefix}ojs.queue.schedule.unroutable"

    @property
    def job_queue_prefix(self) -> str:
        return f"{self.prefix}ojs.queue."

    def job_queue(self, queue: str) -> str:
        return f"{self.prefix}ojs.queue.{queue}"

    def dead_letter_queue(self, queue: str) -> str:
        return f"{self.prefix}ojs.queue.dlx.{queue}"

    def retry_queue(self, queue: str, delay_ms: int) -> str:
        return f"{self.prefix}ojs.queue.retry.{queue}.{delay_ms}"

    def control_queue(self, queue: str) -> str:
        return f"{self.prefix}ojs.queue.control.{queue}"

    def dropped_queue(self, queue: str) -> str:
        """Where a ``drop_oldest`` queue's dropped jobs are reported to its workers
        (a copy of each, beside the DLQ's; see :mod:`ojs_kombu.celery.dropped`)."""
        return f"{self.prefix}ojs.queue.dropped.{queue}"

    def ready_queue(self, queue: str) -> str:
        """Where a bounded ``reject`` queue's retried and scheduled jobs wait for room
        once their delay is over (see
        :func:`ojs_kombu.amqp.broker.topology.ready_queue_arguments`)."""
        return f"{self.prefix}ojs.queue.ready.{queue}"

    def queue_from_job_queue(self, amqp_name: str) -> str | None:
        """``ojs.queue.email`` -> ``email``; ``None`` for anything that is not a job queue."""
        head = self.job_queue_prefix
        if not amqp_name.startswith(head):
            return None
        rest = amqp_name[len(head):]
        if not rest or rest.startswith(RESERVED_QUEUE_PREFIXES):
            return None
        return rest

    def ojs_queue(self, celery_name: str) -> str:
        """Map a Celery queue name (or an AMQP job-queue name) to its OJS queue name."""
        mapped = self._mapped.get(celery_name)
        if mapped is None:
            mapped = self._mapped[celery_name] = self._map_queue(celery_name)
        return mapped

    def _map_queue(self, celery_name: str) -> str:
        from_amqp = self.queue_from_job_queue(celery_name)
        if from_amqp is not None:
            return check_queue_name(from_amqp)
        return check_queue_name(self.queue_aliases.get(celery_name, celery_name))
