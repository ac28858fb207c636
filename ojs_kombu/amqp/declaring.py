"""Running the declarations of :mod:`ojs_kombu.amqp.topology` on a connection.

A worker that consumes many queues declares each queue's topology (about a dozen
exchanges, queues and bindings) as it starts: one reply per declaration makes
that start grow with round trips.  :func:`declare_on` pipelines them instead:
every declaration asks for no reply (:class:`NoWait`) and one passive
declaration, one round trip, confirms them all, since the broker handles a
channel's methods in order and closes the channel with the first one it refuses.  A refusal is
then made again one reply at a time, on a new channel, so that the error names
the entity (:class:`~ojs_kombu.spec.errors.TopologyConflictError`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from typing import Any

import amqp
from amqp.exceptions import PreconditionFailed

#: Longest wait for the reply to one declaration.
DECLARE_TIMEOUT_S = 30.0
#: What a pipeline's last, waited-for declaration asks about (passively): an exchange
#: every RabbitMQ vhost has.  Its reply, or the broker's close of the channel with the
#: error of a declaration before it, ends the pipeline; closing the channel instead
#: could cross the broker's own close.
BARRIER_EXCHANGE = "amq.direct"


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
    sock = connection.transport.sock
    previous = sock.gettimeout()
    sock.settimeout(DECLARE_TIMEOUT_S)
    try:
        if pipelined:
            try:
                _run(connection, declare, args, pipelined=True)
                return
            except PreconditionFailed:
                pass  # which declaration: again, one reply at a time
        _run(connection, declare, args, pipelined=False)
    finally:
        with suppress(OSError):
            sock.settimeout(previous)


def _run(connection: Any, declare: Callable[..., Any], args: tuple[Any, ...], *,
         pipelined: bool) -> None:
    channel = connection.channel()
    try:
        declare(NoWait(channel) if pipelined else channel, connection.ojs.names, *args)
        if pipelined:  # one reply, after every declaration sent before it
            channel.exchange_declare(BARRIER_EXCHANGE, "direct", passive=True)
        channel.close()
    except BaseException:
        with suppress(Exception):  # the broker may have closed it: keep the cause
            if channel.is_open:
                channel.close()
        raise
