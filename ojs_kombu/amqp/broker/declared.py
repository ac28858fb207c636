"""What one connection declared: each OJS declaration made once per connection.

The declarations themselves are :mod:`ojs_kombu.amqp.broker.topology`'s; this room
remembers which of them a connection made (and re-declares an idle retry queue
before its ``x-expires`` could remove it).

A connection first tries to declare ``ojs.exchange.direct``.  A user that may (the
operator, or one with ``.*``) declares everything as it goes, shared entities
included.  A user that may not is *scoped* (:mod:`.permissions`): it declares only
its own retry queues and checks the rest passively; anything missing or refused is
one :class:`~ojs_kombu.spec.errors.TopologyPermissionError`.

Every job queue's topology is declared here (:meth:`DeclaredTopology.ensure`), for
producers, workers (Celery's own declarations of its queues included: a
:class:`~.entities.JobQueue` declares through it), the command line and the
dead-letter tools.  A job queue that exists with ``x-max-priority`` though the app
asks for none, as earlier versions declared every classic job queue, is declared
with the broker's value from then on (:meth:`DeclaredTopology.arguments`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from contextlib import suppress
from time import monotonic
from typing import Any

from amqp.exceptions import AccessRefused, NotFound, PreconditionFailed

from ...spec.errors import TopologyConflictError
from ...spec.inequivalent import kept_max_priority
from ..job_channel import Declarer
from .declaring import declare_on, declare_spread
from .permissions import (
    consumed_topology_exists,
    ladder_exists,
    permission_error,
    published_topology_exists,
    scoped_error,
)
from .topology import (
    RETRY_QUEUE_IDLE_MS,
    bind_scheduled_delivery,
    declare_delayed_exchange,
    declare_job_exchange,
    declare_queue_topology,
    declare_retry_queue,
    declare_schedule_ladder,
    queue_message_count,
)

logger = logging.getLogger("ojs_kombu")


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
        #: whether the user may not declare the shared entities (found once, kept
        #: across :meth:`forget`: it is the user's, not the broker's state)
        self._scoped: bool | None = None
        #: queue -> the ``x-max-priority`` its job queue has though the app asks for
        #: none (:meth:`_keeps_priority`)
        self._kept_priority: dict[str, int] = {}

    @property
    def scoped(self) -> bool:
        """The user may not declare ``ojs.exchange.direct``: a scoped producer or worker."""
        if self._scoped is None:
            try:
                declare_on(self._connection, declare_job_exchange)
                self._scoped = False
            except AccessRefused:
                self._scoped = True
        return self._scoped

    def ensure(self, queue: str, via: Declarer | None = None) -> None:
        """The OJS topology of ``queue``; ``via`` runs the declarations another way (the
        outcome channel's, without waiting for replies), by default :func:`declare_on`.
        A scoped user checks what a publish needs (a scoped worker's start checked the
        rest: ``via`` then checks nothing)."""
        if queue in self._declared:
            return
        if self.scoped:
            if via is None:
                self._check(published_topology_exists, queue)
        else:
            unroutable = self._connection.ojs.settings.unroutable_dead_letter_arguments()
            try:
                try:
                    (via or self._declare)(declare_queue_topology, queue,
                                           self.arguments(queue), unroutable)
                except TopologyConflictError as exc:
                    if not self._keeps_priority(queue, exc):
                        raise
                    self._declare(declare_queue_topology, queue, self.arguments(queue),
                                  unroutable)
            except AccessRefused as exc:
                raise permission_error(exc) from None
        self._declared.add(queue)

    def arguments(self, queue: str) -> dict[str, Any]:
        """The ``Queue.Declare`` arguments of job queue ``queue`` on this connection: the
        binding's (:meth:`~ojs_kombu.amqp.binding.Binding.declare_arguments`), with the
        ``x-max-priority`` the queue keeps (:meth:`_keeps_priority`)."""
        arguments = self._connection.ojs.declare_arguments(queue)
        if queue in self._kept_priority:
            arguments["x-max-priority"] = self._kept_priority[queue]
        return arguments

    def _keeps_priority(self, queue: str, conflict: TopologyConflictError) -> bool:
        """Whether ``conflict`` is only that ``ojs.queue.{queue}`` exists as a priority
        queue though the app asks for none: earlier versions of ojs_kombu declared every
        classic job queue with ``x-max-priority=10``.  The queue then keeps its value
        (its jobs keep their priorities), declared with it from now on by this
        connection; said once, with the setting that asks for it."""
        names = self._connection.ojs.names
        if conflict.kind != "queue" or conflict.name != names.job_queue(queue) \
                or queue in self._kept_priority:
            return False
        kept = kept_max_priority(conflict.broker_reply)
        if kept is None:
            return False
        self._kept_priority[queue] = kept
        logger.info("queue %r exists as a priority queue (x-max-priority=%d) though the app "
                    "asks for none: it keeps its priorities. Set app.conf.ojs_queues = "
                    "{%r: {'priority': %d}} (or task_queue_max_priority = %d) to say so, or "
                    "delete the queue while it is empty to have it declared without",
                    conflict.name, kept, queue, kept, kept)
        return True

    def ensure_each(self, queues: Iterable[str]) -> None:
        """The OJS topology of every queue of ``queues`` at once (a worker's start),
        spread over a few channels (:func:`declare_spread`); a refusal is declared again
        queue by queue, which names the entity."""
        todo = [queue for queue in dict.fromkeys(queues) if queue not in self._declared]
        if not todo:
            return
        if self.scoped:
            for queue in todo:
                self._check(consumed_topology_exists, queue, self.arguments(queue))
            self._declared.update(todo)
            return
        unroutable = self._connection.ojs.settings.unroutable_dead_letter_arguments()
        try:
            declare_spread(self._connection, declare_queue_topology,
                           [(queue, self.arguments(queue), unroutable) for queue in todo])
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
        (via or self._declare)(declare_retry_queue, queue, delay_ms, self.arguments(queue),
                               not self.scoped)
        self._retry_declared[key] = monotonic()

    def retry_route(self, queue: str, delay_ms: int) -> tuple[str, str]:
        """Exchange and routing key of a retry of ``queue`` waiting ``delay_ms``:
        ``ojs.exchange.retry``, ``{queue}.{delay_ms}`` (section 5.4).  A scoped worker's
        user may not read that exchange (whoever may can bind its own queues to any
        queue's retries), so it has no binding there: it publishes to its retry queue
        through the default exchange, the queue the binding would route to."""
        names = self._connection.ojs.names
        if self.scoped:
            return "", names.retry_queue(queue, delay_ms)
        return names.retry_exchange, f"{queue}.{delay_ms}"

    def ensure_schedule(self, queue: str, via: Declarer | None = None) -> None:
        """The scheduling ladder (once per connection) and ``queue``'s way out of it."""
        if queue in self._scheduled:
            return
        self.ensure(queue, via)
        if self.scoped:  # the operator's ladder and bindings: its levels exist
            if via is None and not self._ladder:
                self._check(ladder_exists)
                self._ladder = True
            self._scheduled.add(queue)
            return
        declare = via or self._declare
        if not self._ladder:
            declare(declare_schedule_ladder,
                    self._connection.ojs.settings.schedule_arguments())
            self._ladder = True
        declare(bind_scheduled_delivery, queue, self.arguments(queue))
        self._scheduled.add(queue)

    def ensure_delayed_exchange(self, queue: str) -> None:
        """``ojs.exchange.delayed`` bound to ``queue``, declared over a connection of its
        own."""
        if queue in self._scheduled:
            return
        self.ensure(queue)
        if self.scoped:  # the operator declared and bound it
            self._check(lambda channel, names: channel.exchange_declare(
                names.delayed_exchange, "x-delayed-message", passive=True))
            self._scheduled.add(queue)
            return
        probe = self._connect()
        try:
            declare_on(probe, declare_delayed_exchange, queue, self.arguments(queue))
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
            self._kept_priority.clear()
        else:
            self._declared.discard(queue)
            self._scheduled.discard(queue)
            self._kept_priority.pop(queue, None)  # the queue may be gone
            for key in [k for k in self._retry_declared if k[0] == queue]:
                del self._retry_declared[key]

    def _declare(self, declare: Callable[..., Any], *args: Any) -> None:
        declare_on(self._connection, declare, *args, pipelined=True)

    def _check(self, check: Callable[..., Any], *args: Any) -> None:
        """A scoped user's passive ``check``: a refusal or a missing entity raises
        :func:`~.permissions.scoped_error`."""
        try:
            declare_on(self._connection, check, *args)
        except (AccessRefused, NotFound) as exc:
            raise scoped_error(exc) from None
