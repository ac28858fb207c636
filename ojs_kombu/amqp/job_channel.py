"""What an ``ojs://`` connection and its channels offer above the transport.

kombu hands out its transport's objects as ``Any`` (``connection.connection``,
``producer.channel``, ``message.channel``).  These protocols name what the
rest of ojs_kombu uses of them: :class:`JobConnection` for the py-amqp
connection (the OJS binding, topology declared once per connection, queue
depths), :class:`JobChannel` for a channel of it (confirmed job
publishes, settling deliveries, the consumer readings of the metrics) and
:class:`JobDelivery`, the consumed job a channel settles.  The wings of the
floor type against these, never against the transport's classes.
:class:`ojs_kombu.amqp.transport.Connection` and
:class:`~ojs_kombu.amqp.channel.Channel` implement them; an ``isinstance``
check against them tells an ``ojs://`` connection from any other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..events.job_info import JobInfo
from .wire.loop_acks import LoopAcks

if TYPE_CHECKING:
    import amqp
    from amqp.protocol import queue_declare_ok_t

    from ..spec.encode import OutgoingJob
    from ..spec.failures import JobFailure, Outcome
    from .binding import Binding

#: Runs a declaration of :mod:`ojs_kombu.amqp.broker.topology`: ``(declare, *args)``.
Declarer = Callable[..., None]


class JobDelivery:
    """A consumed job as it came off the wire, kept for retries and dead-lettering."""

    __slots__ = ("_info", "attempt", "body", "job_id", "job_type", "properties", "queue")

    def __init__(self, queue: str, job_id: str, body: bytes, properties: dict[str, Any],
                 job_type: str = "") -> None:
        self.queue = queue
        self.job_id = job_id
        self.job_type = job_type or str(properties.get("type") or "")
        self._info: JobInfo | None = None
        self.body = body
        self.properties = properties  # the original AMQP properties, headers included
        attempt = (properties.get("application_headers") or {}).get("x-ojs-attempt")
        self.attempt = attempt if isinstance(attempt, int) and attempt > 0 else 1

    @property
    def headers(self) -> dict[str, Any]:
        return dict(self.properties.get("application_headers") or {})

    def info(self) -> JobInfo:
        """The job as its lifecycle events describe it (parsed once per delivery)."""
        if self._info is None:
            self._info = JobInfo.from_headers(  # reads the headers, no copy needed
                self.job_id, self.job_type, self.queue,
                self.properties.get("application_headers") or {})
        return self._info


@runtime_checkable
class JobConnection(Protocol):
    """A py-amqp connection of the ``ojs`` transport."""

    #: py-amqp's errors that mean the connection is lost (never handled as a job's).
    connection_errors: tuple[type[BaseException], ...]
    #: Retries, dead letters and reschedules of this connection's deliveries: the
    #: :class:`~ojs_kombu.amqp.consuming.outcomes.OutcomePublisher` (typed there, where
    #: it is used, so that this contract depends on no wing above it).
    ojs_outcomes: Any
    #: Jobs run inside their delivery (Celery's solo pool): collected acks go out first.
    ojs_jobs_run_in_loop: bool
    #: Every publish of the connection waits for its confirm (kombu's ``confirm_publish``).
    ojs_confirm_all: bool
    #: The acks collected in the event loop's thread, written once per loop turn.
    ojs_loop_acks: LoopAcks
    #: The largest frame the broker takes.
    frame_max: int
    if TYPE_CHECKING:
        #: py-amqp's socket transport.  For the type checker only: on Python 3.11
        #: ``isinstance`` reads every member of a protocol, and py-amqp's ``transport``
        #: property connects a connection that is not (or no longer) connected.
        transport: Any

    @property
    def ojs(self) -> Binding:
        """The OJS binding (names, settings, events) the connection was made with."""

    def channel(self, channel_id: int | None = None) -> Any:
        """A new channel: a :class:`JobChannel` that is also a py-amqp channel."""

    def drain_events(self, timeout: float | None = None) -> Any: ...

    def write_frames(self, data: bytes) -> None:
        """Frames encoded by ojs_kombu itself, in one write under the write lock."""

    def flush_acks_in_loop(self) -> None: ...

    def closing_within(self, close: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``close(*args, **kwargs)``, a close handshake waiting a bounded time."""

    def ensure_topology(self, queue: str, via: Declarer | None = None) -> None: ...

    def ensure_topologies(self, queues: Iterable[str]) -> None: ...

    def ensure_retry_queue(self, queue: str, delay_ms: int,
                           via: Declarer | None = None) -> None: ...

    def retry_route(self, queue: str, delay_ms: int) -> tuple[str, str]:
        """Exchange and routing key a retry of ``queue`` waiting ``delay_ms`` is sent to."""

    def ensure_schedule(self, queue: str, via: Declarer | None = None) -> None: ...

    def ensure_delayed_exchange(self, queue: str) -> None: ...

    def forget_topology(self, queue: str | None = None) -> None: ...

    def topology_arguments(self, queue: str) -> dict[str, Any]:
        """The ``Queue.Declare`` arguments job queue ``queue`` is declared with on this
        connection (the binding's, with an ``x-max-priority`` the queue keeps)."""

    def queue_depth(self, queue: str) -> int | None: ...

    def wait_until(self, done: Callable[[], bool], limit: float) -> bool:
        """Read incoming frames until ``done()``; ``False`` when ``limit`` seconds passed."""


@runtime_checkable
class JobChannel(Protocol):
    """A channel of a :class:`JobConnection`.

    ``connection`` is ``None`` once kombu collected the channel after a lost
    connection; ``generation`` changes whenever the channel is reset, so that
    a delivery tag of an earlier generation is never settled on it.
    """

    connection: JobConnection
    channel_id: int
    generation: int
    is_open: bool
    #: The last ``Basic.Qos`` prefetch count and the OJS queues consumed (metrics).
    ojs_prefetch_count: int
    ojs_consumed_queues: set[str]
    #: py-amqp's callbacks per event (``basic_ack``, ``basic_nack``, ``basic_return``).
    events: dict[str, set[Callable[..., Any]]]

    @property
    def ojs(self) -> Binding: ...

    def publish_job(self, job: OutgoingJob, *, timeout: float | None = None,
                    confirm_timeout: float | None = None) -> None: ...

    def publish_jobs(self, jobs: Sequence[OutgoingJob], *,
                     confirm_timeout: float | None = None,
                     meanwhile: Callable[[], None] | None = None) -> None:
        """Publish ``jobs``, every one confirmed; ``meanwhile`` runs once all are written,
        while the broker confirms the last of them."""

    def publish_confirmed(self, message: amqp.Message, exchange: str, routing_key: str, *,
                          job_id: str, queue: str, mandatory: bool = True,
                          timeout: float | None = None, confirm_timeout: float | None = None,
                          measure: bool = True, replaces: int | None = None) -> None: ...

    def publish_many_confirmed(self, messages: list[tuple[amqp.Message, str, str]],
                               confirm_timeout: float | None = None, *,
                               mandatory: bool = False,
                               replaces: Sequence[int] | None = None) -> list[bool]: ...

    def settle_job(self, delivery: JobDelivery, delivery_tag: int, outcome: Outcome,
                   on_settled: Callable[[], None] | None = None) -> None: ...

    def retry_job(self, delivery: JobDelivery, delivery_tag: int, failure: JobFailure,
                  delay_s: float, timeout: float | None = None) -> int: ...

    def ojs_unacked(self) -> list[str]: ...

    def queue_declare(self, queue: str = "", passive: bool = False, durable: bool = False,
                      exclusive: bool = False, auto_delete: bool = False,
                      nowait: bool = False, arguments: dict[str, Any] | None = None
                      ) -> queue_declare_ok_t: ...

    def queue_purge(self, queue: str = "", nowait: bool = False) -> int | None: ...

    def basic_consume(self, queue: str = "", consumer_tag: str = "", no_local: bool = False,
                      no_ack: bool = False, exclusive: bool = False, nowait: bool = False,
                      callback: Callable[..., None] | None = None,
                      arguments: dict[str, Any] | None = None,
                      on_cancel: Callable[..., None] | None = None) -> str: ...

    def basic_cancel(self, consumer_tag: str, nowait: bool = False) -> Any: ...

    def basic_qos(self, prefetch_size: int, prefetch_count: int, a_global: bool) -> Any: ...

    def confirm_select(self, nowait: bool = False) -> None: ...

    def close(self) -> None: ...

    def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None: ...

    def basic_nack(self, delivery_tag: int, multiple: bool = False,
                   requeue: bool = False) -> None: ...
