"""Running the declarations of :mod:`ojs_kombu.amqp.broker.topology` on a connection.

A worker that consumes many queues declares each queue's topology (about a dozen
exchanges, queues and bindings) as it starts: one reply per declaration makes
that start grow with round trips.  :func:`declare_on` pipelines them instead:
every declaration asks for no reply (:class:`NoWait`) and one passive
declaration, one round trip, confirms them all, since the broker handles a
channel's methods in order and closes the channel with the first one it refuses.  A refusal is
then made again one reply at a time, on a new channel, so that the error names
the entity (:class:`~ojs_kombu.spec.errors.TopologyConflictError`).

A worker's start declares the topology of all its queues at once with
:func:`declare_spread`: RabbitMQ runs each channel's methods in order but
different channels' side by side, and creating a queue (a priority queue above
all) costs the broker far more than the round trip, so the queues are spread
over a few channels.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

import amqp
from amqp.exceptions import PreconditionFailed

#: Longest wait for the reply to one declaration.
DECLARE_TIMEOUT_S = 30.0
#: Channels :func:`declare_spread` uses at most: on a 2-core broker, 4 channels
#: created 100 priority queues in half the time of one; 8 added little.
SPREAD_CHANNELS = 4
#: Job queues (a dozen declarations each) a channel of :func:`declare_spread` sends
#: between two replies: each reply is awaited within :data:`DECLARE_TIMEOUT_S`, and a
#: busy cluster creating quorum queues takes up to seconds for each.
SPREAD_ROUND = 4


class NoWait:
    """A channel whose declarations ask for no reply (``nowait=True``)."""

    def __init__(self, channel: amqp.Channel) -> None:
        self._channel = channel

    def exchange_declare(self, *args: Any, **kwargs: Any) -> None:
        self._channel.exchange_declare(*args, nowait=True, **kwargs)

    def exchange_bind(self, *args: Any, **kwargs: Any) -> None:
        self._channel.exchange_bind(*args, nowait=True, **kwargs)

    def queue_declare(self, *args: Any, **kwargs: Any) -> None:
        self._channel.queue_declare(*args, nowait=True, **kwargs)

    def queue_bind(self, *args: Any, **kwargs: Any) -> None:
        self._channel.queue_bind(*args, nowait=True, **kwargs)

    def queue_unbind(self, *args: Any, **kwargs: Any) -> None:
        self._channel.queue_unbind(*args, nowait=True, **kwargs)


def declare_on(connection: Any, declare: Callable[..., Any], *args: Any,
               pipelined: bool = False) -> None:
    """Run ``declare(channel, names, *args)`` on a channel of its own of ``connection`` (an
    ``ojs`` py-amqp connection), with a blocking socket: in a worker's main process the
    socket belongs to the event loop and is non-blocking, and the replies must be waited
    for here.  ``pipelined``: no reply per declaration (only for declarations that read
    no reply, unlike a passive ``queue_declare``); a 406 is looked for again one reply at
    a time."""
    if pipelined:
        try:
            declare_spread(connection, declare, [args], channels=1)
            return
        except PreconditionFailed:
            pass  # which declaration: again, one reply at a time
    with _blocking(connection):
        _run(connection, declare, args)


def declare_spread(connection: Any, declare: Callable[..., Any],
                   argsets: Sequence[tuple[Any, ...]], channels: int = SPREAD_CHANNELS) -> None:
    """Run ``declare(channel, names, *args)`` for each ``args`` of ``argsets``, pipelined,
    round robin over up to ``channels`` channels of their own, with one reply per channel
    every :data:`SPREAD_ROUND` of them.  A refusal raises the broker's error
    (``PreconditionFailed`` for a 406): the caller declares again one at a time to name
    the entity."""
    with _blocking(connection):
        opened = [connection.channel() for _ in range(max(1, min(channels, len(argsets))))]
        step = len(opened) * SPREAD_ROUND
        try:
            for start in range(0, len(argsets), step):
                for index, args in enumerate(argsets[start:start + step]):
                    declare(NoWait(opened[index % len(opened)]), connection.ojs.names, *args)
                for channel in opened:
                    barrier(channel)
        finally:
            for channel in opened:
                with suppress(Exception):  # one the broker closed was reopened by py-amqp
                    if channel.is_open:
                        channel.close()


def barrier(channel: amqp.Channel) -> None:
    """End a pipeline with one waited-for method: its reply, or the broker's close of the
    channel with the error of a declaration before it.  ``Basic.Qos`` (per consumer,
    nothing consumes on a declaring channel) needs no permission on any RabbitMQ: a
    passive declaration of ``amq.direct`` did, from 4.2.6/4.3.0 on (configure, then
    any permission), which a user confined to ``ojs.*`` lacks.  Closing the channel
    instead could cross the broker's own close."""
    channel.basic_qos(0, 0, False)


@contextmanager
def _blocking(connection: Any) -> Iterator[None]:
    """The connection's socket blocks (with :data:`DECLARE_TIMEOUT_S`) meanwhile."""
    sock = connection.transport.sock
    previous = sock.gettimeout()
    sock.settimeout(DECLARE_TIMEOUT_S)
    try:
        yield
    finally:
        with suppress(OSError):
            sock.settimeout(previous)


def _run(connection: Any, declare: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """``declare`` on a channel of its own, a reply per declaration."""
    channel = connection.channel()
    try:
        declare(channel, connection.ojs.names, *args)
        channel.close()
    except BaseException:
        with suppress(Exception):  # the broker may have closed it: keep the cause
            if channel.is_open:
                channel.close()
        raise
