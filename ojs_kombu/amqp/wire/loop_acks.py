"""The acks a connection's event loop collects, written once per loop iteration.

From the loop's thread a channel's ``Basic.Ack`` is not sent at once: it is
collected in the channel's :class:`~ojs_kombu.amqp.wire.acks.PendingAcks`, and the
loop's ``on_tick`` (after the callbacks that ack, before the next poll) writes
every channel's collected acks, one write each.  Whatever must not overtake
them (a nack, a blocking wait, the next job of the solo pool) writes them
first (:meth:`LoopAcks.flush_in_loop`).  When the loop closes or resets
(shutdown, connection error), what was collected is written and acks go out
one by one again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from .acks import PendingAcks

logger = logging.getLogger(__name__)


class AckingChannel(Protocol):
    """What the collector uses of a channel (the transport's channel is one)."""

    ojs_acks: PendingAcks
    is_open: bool

    def flush_acks(self) -> None: ...


class LoopAcks:
    """The channels of one connection holding acks collected in its event loop's thread.

    ``connection`` is the transport's py-amqp connection; each channel has its
    :class:`~ojs_kombu.amqp.wire.acks.PendingAcks` as ``ojs_acks`` and writes them with
    ``flush_acks()``.
    """

    def __init__(self, connection: Any) -> None:
        self._connection = connection
        #: The thread of the event loop the connection is registered with.
        self.thread: int | None = None
        self._loop: Any = None
        self._on_tick: Callable[[], None] | None = None
        self._channels: list[AckingChannel] = []

    def register(self, loop: Any, on_tick: Callable[[], None]) -> None:
        """Collect acks made in the calling thread, ``loop``'s (Celery registers its
        connection from there); ``on_tick`` writes them each loop iteration."""
        self.unregister()
        self.thread = threading.get_ident()
        self._loop, self._on_tick = loop, on_tick
        loop.on_tick.add(on_tick)
        loop.on_close.add(self._on_loop_closed)

    def unregister(self, closing: bool = False) -> None:
        """Leave the loop; ``closing``: the loop is running its ``on_close`` callbacks,
        whose set must not change under it (kombu before 5.7 iterates the set itself)."""
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.on_tick.discard(self._on_tick)
            if not closing:
                loop.on_close.discard(self._on_loop_closed)
        self.thread = None

    def collect(self, channel: AckingChannel, delivery_tag: int, multiple: bool) -> bool:
        """Collect ``channel``'s ack when made in the loop's thread; ``False``: send it
        now (a ``multiple`` ack first writes what the channel collected)."""
        if self.thread != threading.get_ident():
            return False
        if multiple:
            channel.flush_acks()
            return False
        if channel.ojs_acks.ack(delivery_tag):
            self._channels.append(channel)
        return True

    def flush(self) -> None:
        """Write every ack collected since the last flush."""
        channels = self._channels
        while channels:
            channel = channels.pop()
            if channel.is_open:
                channel.flush_acks()

    def flush_in_loop(self) -> None:
        """:meth:`flush` if called from the event loop's thread (before an ack or nack
        that must not overtake them, before a job starts, before a blocking wait)."""
        if self._channels and self.thread == threading.get_ident():
            self.flush()

    def write_collected(self, why: str) -> None:
        """Last chance for the collected acks; a connection that cannot take them any
        more redelivers those jobs anyway."""
        if not self._channels:
            return
        try:
            if self._connection.connected:
                self.flush()
        except Exception:
            logger.warning("could not write %d collected ack(s) as %s",
                           sum(len(c.ojs_acks) for c in self._channels), why, exc_info=True)
        finally:
            self._channels.clear()

    def _on_loop_closed(self, _loop: Any) -> None:
        self.unregister(closing=True)
        self.write_collected("the event loop closed")
