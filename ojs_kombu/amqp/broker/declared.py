"""What one connection declared: each OJS declaration made once per connection.

The declarations themselves are :mod:`ojs_kombu.amqp.broker.topology`'s; this room
remembers which of them a connection made (and re-declares an idle retry queue
before its ``x-expires`` could remove it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import suppress
from time import monotonic
from typing import Any

from amqp.exceptions import AccessRefused, NotFound, PreconditionFailed

from ..job_channel import Declarer
from .declaring import declare_on, declare_spread
from .permissions import permission_error, topology_exists
from .topology import (
    RETRY_QUEUE_IDLE_MS,
    bind_scheduled_delivery,
    declare_delayed_exchange,
    declare_queue_topology,
    declare_retry_queue,
    declare_schedule_ladder,
    queue_message_count,
)


class DeclaredTopology:
    """What one connection declared, so that each declaration is made once on it.

    ``connect`` opens another connection to the same broker: the delayed exchange is
    declared over it, since without the plugin RabbitMQ closes the whole connection
    (503), and this one must survive to report it and publish on.
    """

    def __init__(self, connection: Any, connect: Callable[[], Any]) -> None:
        self._connection = connection
        self._connect = connect
        self._declared: set[str] = set()
        self._scheduled: set[str] = set()
        self._ladder = False
        self._retry_declared: dict[tuple[str, int], float] = {}

    def ensure(self, queue: str, via: Declarer | None = None) -> None:
        """The OJS topology of ``queue``; ``via`` runs the declarations another way (the
        outcome channel's, without waiting for replies), by default :func:`declare_on`."""
        if queue in self._declared:
            return
        ojs = self._connection.ojs
        try:
            (via or self._declare)(declare_queue_topology, queue, ojs.declare_arguments(queue),
                                   ojs.settings.unroutable_dead_letter_arguments())
        except AccessRefused as exc:  # a producer's user: the topology that exists
            if via is not None:
                raise permission_error(exc) from None
            try:
                declare_on(self._connection, topology_exists, queue)
            except NotFound:
                raise permission_error(exc) from None
        self._declared.add(queue)

    def ensure_each(self, queues: Iterable[str]) -> None:
        """The OJS topology of every queue of ``queues`` at once (a worker's start),
        spread over a few channels (:func:`declare_spread`); a refusal is declared again
        queue by queue, which names the entity."""
        todo = [queue for queue in dict.fromkeys(queues) if queue not in self._declared]
        if not todo:
            return
        ojs = self._connection.ojs
        unroutable = ojs.settings.unroutable_dead_letter_arguments()
        try:
            declare_spread(self._connection, declare_queue_topology,
                           [(queue, ojs.declare_arguments(queue), unroutable) for queue in todo])
        except AccessRefused as exc:  # a worker's start: it must declare its topology
            raise permission_error(exc) from None
        except PreconditionFailed:
            for queue in todo:
                self.ensure(queue)
            return
        self._declared.update(todo)

    def ensure_retry_queue(self, queue: str, delay_ms: int, via: Declarer | None = None) -> None:
        """``ojs.queue.retry.{queue}.{delay_ms}``; re-declared while in use so that its
        ``x-expires`` (idle expiry) never removes it under waiting jobs."""
        key = (queue, delay_ms)
        declared = self._retry_declared.get(key)
        if declared is not None and monotonic() - declared < RETRY_QUEUE_IDLE_MS / 2000:
            return
        (via or self._declare)(declare_retry_queue, queue, delay_ms,
                               self._connection.ojs.declare_arguments(queue))
        self._retry_declared[key] = monotonic()

    def ensure_schedule(self, queue: str, via: Declarer | None = None) -> None:
        """The scheduling ladder (once per connection) and ``queue``'s way out of it."""
        if queue in self._scheduled:
            return
        self.ensure(queue, via)
        declare = via or self._declare
        if not self._ladder:
            declare(declare_schedule_ladder,
                    self._connection.ojs.settings.schedule_arguments())
            self._ladder = True
        declare(bind_scheduled_delivery, queue, self._connection.ojs.declare_arguments(queue))
        self._scheduled.add(queue)

    def ensure_delayed_exchange(self, queue: str) -> None:
        """``ojs.exchange.delayed`` bound to ``queue``, declared over a connection of its
        own."""
        if queue in self._scheduled:
            return
        self.ensure(queue)
        probe = self._connect()
        try:
            declare_on(probe, declare_delayed_exchange, queue,
                       self._connection.ojs.declare_arguments(queue))
        finally:
            with suppress(Exception):
                probe.close()
        self._scheduled.add(queue)

    def queue_depth(self, queue: str) -> int | None:
        """Ready jobs in ``ojs.queue.{queue}`` (a passive declare on a channel of its own)."""
        counts: list[int] = []
        declare_on(self._connection, lambda channel, names: counts.append(
            queue_message_count(channel, names, queue)))
        return counts[0] if counts else None

    def forget(self, queue: str | None = None) -> None:
        """Make the next use re-declare ``queue`` (or every queue)."""
        if queue is None:
            self._declared.clear()
            self._scheduled.clear()
            self._ladder = False
            self._retry_declared.clear()
        else:
            self._declared.discard(queue)
            self._scheduled.discard(queue)
            for key in [k for k in self._retry_declared if k[0] == queue]:
                del self._retry_declared[key]

    def _declare(self, declare: Callable[..., Any], *args: Any) -> None:
        declare_on(self._connection, declare, *args, pipelined=True)
