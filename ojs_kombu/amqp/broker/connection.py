"""kombu connections that reconnect on the binding's schedule (AMQP-025, AMQP-026).

:class:`BrokerConnection` is the :class:`kombu.Connection` every connection of
an app under ``ojs_kombu.install()`` is (the worker's consumer connection,
the producer pool, the event and control connections).  It changes how kombu
retries a lost connection, in the one place every kombu and Celery retry goes
through (kombu's ``Connection._ensure_connection``, used by
``ensure_connection``, ``ensure``, ``autoretry``, ``default_channel``, the
worker's ``broker_connection_retry`` loop and ``apply_async``'s
``retry_policy``):

* waits follow :class:`~ojs_kombu.amqp.broker.reconnect.ReconnectPolicy` (1, 2, 4, ...
  60 s, +-25 %) instead of kombu's ``interval_start/step/max`` arithmetic;
  ``max_retries`` and ``timeout`` still bound the retrying, and no wait runs
  past ``timeout`` (a publish without retries that finds no broker, which
  reconnects through ``default_channel`` with ``timeout=connect_timeout``,
  raises after about ``broker_connection_timeout``, not up to twice that);
* with several broker URLs (``ojs://h1;ojs://h2``) kombu's failover strategy
  still picks the next URL at once after a failure, and the wait happens
  once every URL of the cycle has failed;
* each failed attempt and each re-established connection is counted in
  ``ojs_amqp_reconnections_total`` (``outcome`` ``failed``/``succeeded``); a
  re-established connection is logged and emitted as ``connection.reconnected``
  (through the binding's hook: ``ojs_kombu.subscribe``), also when kombu closed the lost
  connection first (its producer pool does so after a failed publish);
* a TLS handshake that fails for good (:mod:`.tls`) is not retried; with several
  URLs the next one is tried, and the error raised once every URL failed so;
* a connection error names the broker it came from
  (``kombu.exceptions.OperationalError: ... (broker ojs://guest:**@host:5672//)``):
  that is what a producer whose publish failed sees.

Topology is re-declared after a reconnection because its cache lives on the
py-amqp connection (:class:`ojs_kombu.amqp.transport.Connection`), which every
reconnection replaces: the first publish to a queue on the new connection
declares its exchanges, queue and bindings again, and a worker re-declares
the queues it consumes when its consumer restarts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import count
from time import monotonic
from typing import Any

import kombu
from amqp.exceptions import RecoverableConnectionError
from kombu.connection import ConnectionPool as KombuConnectionPool
from kombu.connection import PooledConnection
from kombu.exceptions import OperationalError
from kombu.utils.functional import retry_over_time

from ...spec.errors import BrokerBackingOff, BrokerTLSError
from ..binding import Binding, registered_binding
from ..wire.kombu_seam import (
    connection_factory,
    connection_hooks,
    connection_info,
    library_errors,
    no_translation,
)
from .reconnect import DEFAULT_POLICY, ReconnectPolicy, connect_backoff

logger = logging.getLogger(__name__)

def report_reconnection(binding: Binding | None, *, role: str, broker: str, attempts: int,
                        duration_s: float, worker_id: str | None = None,
                        queues: list[str] | None = None,
                        prefetch_count: int | None = None) -> None:
    """Log, count and emit one re-established connection."""
    logger.warning("reconnected to %s (%s) after %d attempt(s) in %.1fs%s", broker, role,
                   attempts, duration_s,
                   f"; consuming {', '.join(queues)} with prefetch {prefetch_count}"
                   if queues else "")
    if binding is not None:
        binding.hook.connection_reconnected(role, {
            "broker": broker, "attempts": attempts, "duration_ms": round(duration_s * 1000),
            "worker_id": worker_id, "queues": queues, "prefetch_count": prefetch_count})


@connection_hooks
class BrokerConnection(kombu.Connection):
    """:class:`kombu.Connection` that retries on the OJS reconnection schedule."""

    #: Replace (on a subclass or instance) to tune the schedule.
    reconnect_policy: ReconnectPolicy = DEFAULT_POLICY
    #: Reported as ``role`` of ``connection.reconnected``.
    role = "client"

    _ojs_established = False
    _ojs_attempts = 0
    _ojs_retry_started: float | None = None

    @property
    def ojs_binding(self) -> Binding | None:
        return registered_binding(self.transport_options)

    def ensure_with_policy(
        self, errback: Any = None, max_retries: int | None = None,
        interval_start: float = 2, interval_step: float = 2, interval_max: float = 30,
        callback: Any = None, reraise_as_library_errors: bool = True,
        timeout: float | None = None,
    ) -> Any:
        """kombu's connection retry loop with the binding's waits (its
        ``_ensure_connection``, :mod:`.kombu_seam`).

        ``interval_*`` are ignored: section 11.3 fixes the schedule.
        """
        if self.connected:
            return self._connection
        policy = self.reconnect_policy
        rounds = count(1)
        self._ojs_attempts = 0
        started = self._ojs_retry_started = monotonic()

        def on_error(exc: Exception, _intervals: Any, retries: int) -> float:
            # with several URLs, the next one is tried at once; the wait comes
            # when the whole cycle has failed (kombu's own failover rule)
            interval = policy.delay(next(rounds)) if self.completes_cycle(retries) else 0.0
            if timeout:  # kombu would sleep the whole wait, then try once more
                interval = max(0.0, min(interval, started + timeout - monotonic()))
            self._ojs_attempts += 1
            binding = self.ojs_binding
            if binding is not None:
                binding.hook.connection_failed(self.role)
            try:
                if errback:
                    errback(exc, interval)
                else:
                    logger.warning("cannot connect to %s: %s; retrying in %.1fs",
                                   self.as_uri(), exc, interval)
            finally:
                self.maybe_switch_next()
            return interval

        with library_errors(self) if reraise_as_library_errors else no_translation(self):
            return retry_over_time(
                self._failing_over(connection_factory(self)),
                self.recoverable_connection_errors, (), {},
                on_error, max_retries, policy.initial, 0, policy.max_delay, callback,
                timeout=timeout,
            )

    def _failing_over(self, connect: Callable[[], Any]) -> Callable[[], Any]:
        """``connect``, where a URL of several (``ojss://h1;ojss://h2``) whose TLS fails for
        good (:class:`~ojs_kombu.spec.errors.BrokerTLSError`) hands over to the next one
        as a failed attempt; the error is raised once every URL failed that way."""
        urls = len(set(self.alt))
        if urls <= 1:
            return connect
        refused: dict[str, BrokerTLSError] = {}

        def attempt() -> Any:
            try:
                return connect()
            except BrokerTLSError as exc:
                refused[self.as_uri(include_password=True)] = exc
                if len(refused) >= urls:
                    raise
                logger.error("%s; trying the next broker URL", exc)
                raise RecoverableConnectionError(str(exc)) from exc

        return attempt

    def on_connected(self) -> None:
        """After each connect (kombu's ``_connection_factory``, :mod:`.kombu_seam`)."""
        if self._ojs_established:
            started = self._ojs_retry_started
            report_reconnection(
                self.ojs_binding, role=self.role, broker=self.as_uri(),
                attempts=self._ojs_attempts + 1,
                duration_s=monotonic() - started if started is not None else 0.0)
        self._ojs_established = True

    def on_closing(self) -> None:
        """Before kombu closes the connection (its ``_close``, :mod:`.kombu_seam`)."""
        # A connection closed on purpose and opened again is not a reconnection.
        # One the broker had already dropped is: kombu's producer pool closes
        # ("replaces") the connection of a publish that raised, and a producer
        # publishing without retries opens it again on its next publish.
        if self.connected:
            self._ojs_established = False

    @contextmanager
    def library_errors_naming_broker(
        self, ConnectionError: type[Exception] = OperationalError,
        ChannelError: type[Exception] = OperationalError,
    ) -> Iterator[None]:
        """kombu's translation into library errors, naming the broker: a producer
        (``apply_async`` runs inside this context) sees ``OperationalError: [Errno
        111] Connection refused (broker ojs://guest:**@host:5672//)``."""
        try:
            yield
        except (ConnectionError, ChannelError):
            raise
        except self.recoverable_connection_errors as exc:
            raise ConnectionError(self._naming_broker(exc)) from exc
        except self.recoverable_channel_errors as exc:
            raise ChannelError(self._naming_broker(exc)) from exc

    def _naming_broker(self, exc: BaseException) -> str:
        return f"{str(exc) or type(exc).__name__} (broker {self.as_uri()})"

    def clone(self, **kwargs: Any) -> BrokerConnection:
        clone = super().clone(**kwargs)
        clone.reconnect_policy = self.reconnect_policy
        return clone

    def Pool(self, limit: int | None = None, **kwargs: Any) -> ConnectionPool:
        """kombu's pool makes plain connections; this one makes reconnecting ones (the
        pool Celery's producers publish through)."""
        return ConnectionPool(self, limit, **kwargs)


class PooledBrokerConnection(PooledConnection, BrokerConnection):
    """A pool member: kombu's pooled connection with the OJS reconnection."""


class ConnectionPool(KombuConnectionPool):
    """:class:`kombu.connection.ConnectionPool` of :class:`PooledBrokerConnection`."""

    connection: BrokerConnection

    def new(self) -> PooledBrokerConnection:
        member = PooledBrokerConnection(self, **dict(connection_info(self.connection)))
        member.reconnect_policy = self.connection.reconnect_policy
        return member


def connect_on_demand(connection: kombu.Connection, purpose: str) -> kombu.Connection:
    """Connect ``connection`` (one attempt per broker URL) unless its broker's backoff
    says to wait, which raises :class:`BrokerBackingOff` without touching the network.

    For connections opened when something needs them (``purpose``: "queue-depth
    gauges", "the AMQP event sink", "control", ...): each failure is logged,
    counted in ``ojs_amqp_reconnections_total`` and pushes the next attempt out
    along section 11.3's schedule, shared by every such connection to the broker.
    """
    broker = connection.as_uri()
    backoff = connect_backoff(broker)
    wait = backoff.wait()
    if wait > 0:
        connection.release()
        raise BrokerBackingOff(broker, purpose, wait)
    try:
        # each URL of a failover list once; the backoff is the wait between rounds
        connection.ensure_connection(max_retries=max(len(connection.alt) - 1, 0))
    except Exception as exc:
        delay = backoff.failed()
        logger.warning("cannot connect to %s for %s: %s; next attempt in %.1fs", broker,
                       purpose, exc, delay)
        binding = registered_binding(connection.transport_options)
        if binding is not None:
            binding.hook.connection_failed("client")
        connection.release()
        raise
    backoff.succeeded()
    return connection
