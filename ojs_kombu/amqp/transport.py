"""The ``ojs`` kombu transport: py-amqp, speaking the OJS AMQP binding.

A thin subclass of kombu's pyamqp transport.  Its :class:`Connection` holds
py-amqp's connection hooks and the connection's OJS state: the binding, the
topology it declared (:class:`~ojs_kombu.amqp.broker.declared.DeclaredTopology`), the
acks its event loop collects (:class:`~ojs_kombu.amqp.wire.loop_acks.LoopAcks`) and
the outcomes of its deliveries (:class:`~ojs_kombu.amqp.consuming.outcomes.OutcomePublisher`);
its channels are :class:`ojs_kombu.amqp.channel.Channel`.  What the rest of
ojs_kombu uses of it is :class:`ojs_kombu.amqp.job_channel.JobConnection`.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from amqp.exceptions import AMQPError, ConsumerCancelled, RecoverableConnectionError
from amqp.transport import to_host_port
from kombu.transport import pyamqp

from ..events.metrics import track_connection
from ..spec.settings import BINDING_OPTION
from .binding import Binding
from .broker.declared import DeclaredTopology
from .broker.tls import TLSTransport, connect_failure, spoke_plain_amqp
from .channel import Channel
from .consuming.outcomes import OutcomePublisher
from .job_channel import Declarer
from .wire.drain import drain_until
from .wire.frames import DECODE_ERRORS, locked_frame_writer, replacement_frame
from .wire.kombu_seam import fallbacks as kombu_fallbacks
from .wire.kombu_seam import forget_loop_on_close, reader_hook, wake_on_foreign_call_soon
from .wire.loop_acks import LoopAcks
from .wire.py_amqp_seam import NO_LOOP_ACKS, NO_READ_AHEAD
from .wire.py_amqp_seam import fallbacks as py_amqp_fallbacks
from .wire.read_ahead import LoopReads, LoopWake, ReadAheadTCPTransport

logger = logging.getLogger(__name__)

#: Longest wait at close for the confirms of retries and dead letters in flight.
OUTCOME_CLOSE_WAIT_S = 5.0
#: Longest wait for the broker's ``Close-Ok`` to a channel's or the connection's
#: ``Close``; then the socket is dropped (the broker requeues what it held unacked).
#: py-amqp waits without limit, and a connection cut off by the network answers
#: nothing: Celery's consumer, closing its old connections before it reconnects,
#: hung there until TCP keepalive gave up (minutes; for ever behind a proxy that
#: keeps the TCP connection up).
CLOSE_TIMEOUT_S = 10.0
#: Longest poll of an event loop the transport is registered with.  kombu's hub polls
#: for 1 s when no timer is scheduled and until the next timer (up to 10 s) when one
#: is; a worker on ``ojs://`` always has timers (the OJS worker heartbeat event and
#: the control queues' heartbeat), so a stop that only sets Celery's
#: ``should_terminate`` flag from another thread (``celery.contrib.testing``'s
#: in-process worker) was seen up to 10 s late, where plain Celery sees it within 1 s.
LOOP_POLL_BOUND_S = 1.0
_bounded_loops: weakref.WeakSet[Any] = weakref.WeakSet()


def read_ahead() -> bool:
    """Whether py-amqp and kombu have the hooks reading ahead needs (else py-amqp's own
    reader reads: :mod:`.py_amqp_seam`, :mod:`.kombu_seam`)."""
    return NO_READ_AHEAD not in py_amqp_fallbacks() | kombu_fallbacks()


class Connection(pyamqp.Connection):
    """py-amqp connection that knows its OJS binding and the queues it declared."""

    Channel = Channel

    def __init__(self, *args: Any, confirm_publish: bool = False, **kwargs: Any) -> None:
        options = {k: kwargs.pop(k) for k in list(kwargs) if k.startswith("ojs_")}
        self.ojs = Binding.from_options(options)
        #: Made by an installed Celery app (its binding), not by kombu alone.
        self.ojs_app_binding = BINDING_OPTION in options
        self._ojs_connect_args = (args, {**kwargs, "ojs_binding": self.ojs})
        #: ``confirm_publish=True`` (kombu's option) also confirms non-job publishes.
        self.ojs_confirm_all = confirm_publish
        self.ojs_topology = DeclaredTopology(self, self._connect_another)
        self.ojs_loop_acks = LoopAcks(self)
        #: Jobs run inside their delivery (Celery's solo pool; set by the Celery wiring):
        #: collected acks are written before each delivery.
        self.ojs_jobs_run_in_loop = False
        #: Every write of this connection takes it (py-amqp's frame writer too): green
        #: pools write from many greenlets.  Reentrant: an outcome is numbered and
        #: written under it.
        self.ojs_write_lock = threading.RLock()
        super().__init__(*args, confirm_publish=False, **kwargs)
        self.frame_writer_cls = locked_frame_writer
        #: Retries, dead letters and reschedules of this connection's deliveries.
        self.ojs_outcomes = OutcomePublisher(self, lambda: self.frame_max)
        self._ojs_loop_wake: LoopWake | None = None
        track_connection(self)

    def connect(self, *args: Any, **kwargs: Any) -> Any:
        """py-amqp's connect; a TLS failure no retry mends (:mod:`.broker.tls`) is a
        :class:`~ojs_kombu.spec.errors.BrokerTLSError`, which kombu does not retry
        (an ``OSError`` it would retry for ever)."""
        host, port = to_host_port(str(self.host))
        try:
            connected = super().connect(*args, **kwargs)
        except OSError as exc:
            permanent = connect_failure(exc, host, port, bool(self.ssl), self.connect_timeout)
            if permanent is None:
                raise
            raise permanent from None
        if not self.ssl:
            spoke_plain_amqp(host, port)
        return connected

    def _connect_another(self) -> Connection:
        """Another connection to the same broker, with the same binding, connected."""
        args, kwargs = self._ojs_connect_args
        other = type(self)(*args, **kwargs)
        other.connect()
        return other

    def Transport(self, host: str, connect_timeout: float | None, ssl: Any = False,
                  read_timeout: float | None = None, write_timeout: float | None = None,
                  **kwargs: Any) -> Any:
        """py-amqp's socket transport (py-amqp passes the first five positionally);
        over plain TCP the one that reads ahead (:mod:`ojs_kombu.amqp.wire.read_ahead`)."""
        if ssl:  # the broker's host name checked by default (.broker.tls)
            return TLSTransport(host, connect_timeout=connect_timeout, ssl=ssl,
                                read_timeout=read_timeout, write_timeout=write_timeout,
                                **kwargs)
        if not read_ahead():
            return super().Transport(host, connect_timeout, ssl, read_timeout, write_timeout,
                                     **kwargs)
        return ReadAheadTCPTransport(host, connect_timeout=connect_timeout,
                                     read_timeout=read_timeout, write_timeout=write_timeout,
                                     **kwargs)

    def join_loop_wake(self, wake: LoopWake) -> None:
        """Frames this connection reads ahead in the event loop wake it through ``wake``
        (:mod:`ojs_kombu.amqp.wire.read_ahead`); closed with the connection or the loop."""
        self._close_loop_wake()
        self._ojs_loop_wake = wake
        self.transport.loop_wake = wake.wake

    def _close_loop_wake(self) -> None:
        wake, self._ojs_loop_wake = self._ojs_loop_wake, None
        if wake is not None:
            wake.close()

    # -- acks (ojs_kombu.amqp.wire.loop_acks) -------------------------------------------

    def register_with_loop(self, loop: Any) -> None:
        """Collect acks made in ``loop``'s thread and write them once per loop iteration
        (the hub's ``on_tick`` runs after the callbacks that ack, Celery's ``call_soon``,
        and before the loop polls again)."""
        self.ojs_loop_acks.register(loop, self.flush_acks)

    def unregister_from_loop(self) -> None:
        self.ojs_loop_acks.unregister()

    @property
    def ojs_loop_thread(self) -> int | None:
        """The thread of the event loop this connection is registered with, if any."""
        return self.ojs_loop_acks.thread

    def flush_acks(self) -> None:
        """Write every ack collected since the last flush."""
        self.ojs_loop_acks.flush()

    def flush_acks_in_loop(self) -> None:
        """:meth:`flush_acks` if called from the event loop's thread."""
        self.ojs_loop_acks.flush_in_loop()

    def write_frames(self, data: bytes) -> None:
        """Frames ojs_kombu encoded itself (publishes, collected acks), in one write,
        counted as py-amqp counts its own writes: its heartbeat check reads
        ``bytes_sent`` to know whether anything went out since the last tick."""
        with self.ojs_write_lock:
            self.transport.write(data)
            self.bytes_sent += 1

    # -- reading -----------------------------------------------------------------

    def blocking_read(self, timeout: float | None = None) -> Any:
        """Read and handle one frame, as py-amqp does, with two differences.

        A frame already read ahead (:meth:`ReadAheadTCPTransport.held_frame`) is taken
        without setting the socket's timeout for a read that needs no socket; and a
        content header py-amqp cannot decode is replaced for its delivery only
        (:mod:`ojs_kombu.amqp.wire.frames`), where py-amqp would raise into the worker's loop.
        Called for every frame: no layer of its own per frame."""
        transport = self.transport
        frame = transport.held_frame() if isinstance(transport, ReadAheadTCPTransport) else None
        if frame is None:
            with transport.having_timeout(timeout):
                frame = transport.read_frame()
        on_frame = self.on_inbound_frame  # py-amqp's frame handler (set by connect)
        try:
            return on_frame(frame)
        except ConsumerCancelled:
            self._close_before_reconnect()
            raise
        except DECODE_ERRORS as exc:
            replacement = replacement_frame(frame, exc)
            if replacement is None:
                raise
            self.bytes_recv -= 1  # the handler counted this frame already
            return on_frame(replacement)

    def drain_events(self, timeout: float | None = None) -> Any:
        """py-amqp's, first publishing again the outcomes whose backoff is over, for
        loops without kombu's hub (gevent's and eventlet's); with a hub its tick does
        (:meth:`Transport.register_with_event_loop`).

        A wait for the broker is bounded where py-amqp's is not: within a close
        handshake (:meth:`closing_within`) by its deadline, and a wait without a
        timeout (an RPC's reply) by two heartbeat intervals of silence, when the
        connection negotiated heartbeats: the broker sends one at least every
        interval, so a connection that hears nothing for two is gone (a network cut
        sends no FIN); it is dropped and :class:`RecoverableConnectionError` raised,
        a connection error kombu and Celery reconnect from."""
        if self.ojs_loop_acks.thread is None:
            self.ojs_outcomes.run_due()
        limit = self._wait_limit(timeout)
        if limit is None:
            return super().drain_events(timeout=timeout)
        try:
            if limit <= 0:
                raise TimeoutError()
            return super().drain_events(timeout=limit)
        except TimeoutError:
            if timeout is not None and timeout <= limit:
                raise  # the caller's own timeout
            why = (f"no answer to a close within {CLOSE_TIMEOUT_S:.0f}s"
                   if self._ojs_close_deadline is not None else
                   f"no frame (not even a heartbeat) for {2 * self.heartbeat:.0f}s")
            logger.warning("%s from %s (is the network to it cut?): dropping the connection",
                           why, self.host)
            self.collect()
            raise RecoverableConnectionError(f"{why} from {self.host}") from None

    def _wait_limit(self, timeout: float | None) -> float | None:
        """How long the next read may wait when that is less than ``timeout``."""
        deadline = self._ojs_close_deadline
        if deadline is not None:
            left = deadline - time.monotonic()
            if timeout is None or left < timeout:
                return left
        heartbeat = self.heartbeat
        return 2 * heartbeat if timeout is None and heartbeat else None

    _ojs_close_deadline: float | None = None

    def closing_within(self, close: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``close(*args, **kwargs)`` (py-amqp's close of a channel or of this connection),
        waiting at most :data:`CLOSE_TIMEOUT_S` for the broker's answer."""
        if self._ojs_close_deadline is not None:  # nested: the outer deadline holds
            return close(*args, **kwargs)
        self._ojs_close_deadline = time.monotonic() + CLOSE_TIMEOUT_S
        try:
            return close(*args, **kwargs)
        finally:
            self._ojs_close_deadline = None

    def _close_before_reconnect(self) -> None:
        """A cancelled consumer hands over to the reconnection path on a connection that
        still works: closed here with ``Connection.Close``, because Celery's consumer
        drops it without closing, and RabbitMQ 4.x keeps an exclusive queue of a
        dropped socket (Celery's ``celery.pidbox`` queue) locked for a moment: the new
        connection's declare of it failed with 405 ``RESOURCE_LOCKED`` and stopped
        the worker."""
        if not self.connected or self.is_closing:
            return
        try:
            self.close()
        except (AMQPError, OSError) as exc:
            logger.debug("closing the connection of a cancelled consumer: %r", exc)

    def wait_until(self, done: Callable[[], bool], limit: float) -> bool:
        """Read incoming frames until ``done()``; ``False`` when ``limit`` seconds passed
        first.  Collected acks and outcomes go out first: none waits behind a confirm."""
        self.flush_acks_in_loop()
        self.ojs_outcomes.flush()
        return drain_until(self, done, limit)

    def close(self, *args: Any, **kwargs: Any) -> Any:
        self.unregister_from_loop()
        self._close_loop_wake()
        if self.connected:
            self.ojs_outcomes.wait_in_flight(OUTCOME_CLOSE_WAIT_S)
            for channel in list((self.channels or {}).values()):
                if isinstance(channel, Channel) and channel.is_open:
                    channel.flush_confirms()  # jobs published without waiting
        self.ojs_loop_acks.write_collected("the connection closed")
        self.ojs_outcomes.reset()
        return self.closing_within(super().close, *args, **kwargs)

    def collect(self) -> None:
        self.ojs_outcomes.reset()  # lost: the broker delivers those jobs again
        self._close_loop_wake()
        super().collect()

    # -- topology (ojs_kombu.amqp.broker.declared.DeclaredTopology) ------------------------

    def ensure_topology(self, queue: str, via: Declarer | None = None) -> None:
        """Declare the OJS topology of ``queue`` once per connection (lazy and eager paths)."""
        self.ojs_topology.ensure(queue, via)

    def ensure_topologies(self, queues: Iterable[str]) -> None:
        """Declare the OJS topology of every queue of ``queues`` at once (a worker's start)."""
        self.ojs_topology.ensure_each(queues)

    def ensure_retry_queue(self, queue: str, delay_ms: int, via: Declarer | None = None) -> None:
        self.ojs_topology.ensure_retry_queue(queue, delay_ms, via)

    def retry_route(self, queue: str, delay_ms: int) -> tuple[str, str]:
        return self.ojs_topology.retry_route(queue, delay_ms)

    def ensure_schedule(self, queue: str, via: Declarer | None = None) -> None:
        self.ojs_topology.ensure_schedule(queue, via)

    def ensure_delayed_exchange(self, queue: str) -> None:
        self.ojs_topology.ensure_delayed_exchange(queue)

    def forget_topology(self, queue: str | None = None) -> None:
        """Make the next use re-declare ``queue`` (or every queue)."""
        self.ojs_topology.forget(queue)

    def topology_arguments(self, queue: str) -> dict[str, Any]:
        return self.ojs_topology.arguments(queue)

    def queue_depth(self, queue: str) -> int | None:
        """Ready jobs in ``ojs.queue.{queue}``."""
        return self.ojs_topology.queue_depth(queue)


#: The connection class, by a name the transport's class attribute does not shadow.
JobAMQPConnection = Connection


@reader_hook
class Transport(pyamqp.Transport):
    """kombu transport ``ojs://``: RabbitMQ through py-amqp, jobs as OJS jobs."""

    Connection = Connection

    def register_with_event_loop(self, connection: JobAMQPConnection, loop: Any) -> None:
        super().register_with_event_loop(connection, loop)
        wake_on_foreign_call_soon(loop, lambda: LoopWake(loop))
        forget_loop_on_close(loop)
        loop.on_tick.add(connection.ojs_outcomes.run_due)
        if loop not in _bounded_loops:  # once per loop, across reconnections
            _bounded_loops.add(loop)
            loop.call_repeatedly(LOOP_POLL_BOUND_S, _poll_bound)
        if connection.ojs.settings.acks != "each" and NO_LOOP_ACKS not in py_amqp_fallbacks():
            connection.register_with_loop(loop)
        transport = connection.transport
        if isinstance(transport, ReadAheadTCPTransport):
            connection.join_loop_wake(LoopWake(loop))
            transport.in_event_loop = True
            if transport.holds_frames:  # read before the loop watched the socket
                loop.call_soon(self.on_readable, connection, loop)
                if transport.loop_wake is not None:  # join_loop_wake just set it
                    transport.loop_wake()

    @staticmethod
    def loop_reader(connection: JobAMQPConnection) -> Any:
        """What kombu's event-loop reader reads through (its ``_make_reader``,
        :mod:`.kombu_seam`): a connection that reads ahead wakes the loop for the frames
        it holds; any other (TLS, py-amqp's own reader) is read as kombu reads it."""
        if isinstance(connection.transport, ReadAheadTCPTransport):
            return LoopReads(connection)
        return connection

    def qos_semantics_matches_spec(self, connection: Any) -> bool:
        # Per-consumer prefetch (Basic.Qos global=false) as in the binding's
        # section 5.2; RabbitMQ 4 refuses global QoS on quorum queues.
        return True


def _poll_bound() -> None:
    """A timer that does nothing: its being due ends the loop's poll (:data:`LOOP_POLL_BOUND_S`)."""


class SSLTransport(Transport):
    """``ojss://``: the ``ojs`` transport over TLS (same as ``ojs://`` with ``ssl=True``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        client = self.client
        if client is not None and not client.ssl:
            client.ssl = True


def register_transport() -> None:
    """Make ``ojs://`` and ``ojss://`` broker URLs resolve to this transport."""
    from kombu.transport import TRANSPORT_ALIASES

    TRANSPORT_ALIASES.setdefault("ojs", f"{__name__}:Transport")
    TRANSPORT_ALIASES.setdefault("ojss", f"{__name__}:SSLTransport")
