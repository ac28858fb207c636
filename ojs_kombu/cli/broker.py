"""Broker access for the command line: one ``ojs://`` connection, and read-only inspection.

AMQP 0-9-1 cannot list a queue's arguments or bindings, and ``rabbitmqctl``
or the management plugin are not available to every user.  Inspection is
therefore done with declarations that never change anything:

* a *passive* declare says whether an entity exists (and a queue's message and
  consumer counts);
* re-declaring an *existing* entity with the same properties is a no-op, and
  with different ones RabbitMQ refuses it (406) naming the first property that
  differs and its current value (``inequivalent arg 'x-max-length' ... received
  none but current is the value '5' of type 'signedint'``).  Repeating with the
  current value converges on the arguments the broker checks, which are the
  ones that matter (dead-lettering, TTLs, lengths, priority, queue type).

Every probe uses a channel of its own, since a refused declare closes it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import amqp
import click
import kombu
from amqp.exceptions import NotFound, PreconditionFailed

from ..amqp.binding import Binding
from ..amqp.job_channel import JobConnection
from ..spec.inequivalent import parse_inequivalent
from .common import EXIT_NOT_FOUND, EXIT_USAGE, CLIError, Options, options
from .config import broker_url

__all__ = ["broker_url", "connect", "parse_inequivalent", "queue_name"]

#: Entity properties (not arguments) named in 406 replies.
_PROPERTIES = ("durable", "auto_delete", "exclusive", "type", "internal")
_MAX_PROBES = 16


@contextmanager
def connect(opts: Options) -> Iterator[kombu.Connection]:
    """A connected ``ojs://`` kombu connection (no retries: a CLI fails fast)."""
    from ..amqp.transport import Transport

    connection = opts.connection()
    try:
        if not isinstance(connection.transport, Transport):
            raise CLIError(f"{connection.as_uri()} (from {opts.target().source}) is not an "
                           "ojs:// (or amqp://) broker URL", EXIT_USAGE, "invalid_input")
        connection.ensure_connection(max_retries=0)  # kombu's connect() retries after 2 s
        yield connection
    finally:
        with suppress(Exception):
            connection.release()


def binding_of(connection: kombu.Connection) -> Binding:
    amqp_connection: JobConnection = connection.connection  # connect() checked the transport
    return amqp_connection.ojs


def queue_name(value: str, opts: Options | None = None) -> str:
    """An OJS queue name given on the command line, through the aliases of the running
    command's settings (``celery`` is ``default``; ``-A``'s ``ojs_queue_aliases``)."""
    if opts is None:
        ctx = click.get_current_context(silent=True)
        opts = options(ctx) if ctx is not None else Options()
    return opts.binding().names.ojs_queue(value)


@dataclass
class QueueState:
    name: str
    exists: bool
    messages: int = 0
    consumers: int = 0


@dataclass
class Equivalence:
    """What re-declaring an existing entity with ``expected`` properties told us."""

    equivalent: bool
    #: The arguments the broker holds, as far as it checks them (``expected`` adjusted).
    arguments: dict[str, Any] = field(default_factory=dict)
    #: Properties and arguments that differ: ``{name: (expected, current)}``.
    differences: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    reply: str | None = None


def queue_state(amqp_connection: Any, name: str) -> QueueState:
    """Passive ``Queue.Declare``: whether ``name`` exists, its ready messages and consumers."""
    channel = amqp_connection.channel()
    try:
        ok = channel.queue_declare(name, passive=True)
    except NotFound:
        return QueueState(name, False)
    with suppress(Exception):
        channel.close()
    return QueueState(name, True, ok.message_count, ok.consumer_count)


def exchange_exists(amqp_connection: Any, name: str) -> bool:
    channel = amqp_connection.channel()
    try:
        channel.exchange_declare(name, "direct", passive=True)
    except NotFound:
        return False
    with suppress(Exception):
        channel.close()
    return True


def require_queue(amqp_connection: Any, amqp_name: str, what: str) -> QueueState:
    """The state of a queue the command needs; exit code 4 when it does not exist."""
    state = queue_state(amqp_connection, amqp_name)
    if not state.exists:
        raise CLIError(f"unknown queue: {amqp_name!r} does not exist ({what})", EXIT_NOT_FOUND,
                       "not_found")
    return state


def queue_equivalence(amqp_connection: Any, name: str, arguments: Mapping[str, Any]
                      ) -> Equivalence:
    """Compare an existing durable, non-exclusive, non-auto-delete queue with ``arguments``.

    Call only for a queue that exists: re-declaring a missing one would create it.
    """
    return _equivalence(amqp_connection, arguments, lambda channel, args: channel.queue_declare(
        name, durable=True, exclusive=False, auto_delete=False, arguments=args))


def exchange_equivalence(amqp_connection: Any, name: str, kind: str,
                         arguments: Mapping[str, Any] | None = None) -> Equivalence:
    """Compare an existing exchange with a durable one of type ``kind``."""
    return _equivalence(amqp_connection, dict(arguments or {}),
                        lambda channel, args: channel.exchange_declare(
                            name, kind, durable=True, auto_delete=False, arguments=args))


def _equivalence(amqp_connection: Any, expected: Mapping[str, Any], declare: Any
                 ) -> Equivalence:
    arguments = dict(expected)
    result = Equivalence(True, arguments)
    for _ in range(_MAX_PROBES):
        channel = amqp_connection.channel()
        try:
            declare(channel, dict(arguments))
        except PreconditionFailed as exc:
            reply = str(exc.reply_text)
            result.equivalent, result.reply = False, result.reply or reply
            parsed = parse_inequivalent(reply)
            if parsed is None:
                return result
            key, current = parsed
            result.differences[key] = (expected.get(key), current)
            if key in _PROPERTIES:
                return result  # properties cannot be adjusted: arguments stay unknown
            if current is None:
                arguments.pop(key, None)
            else:
                arguments[key] = current
            continue
        with suppress(Exception):
            channel.close()
        return result
    return result


def delete_queues(amqp_connection: Any, names: list[str]) -> None:
    """Delete ``names`` (missing ones are fine); used by probes to clean up."""
    for name in names:
        channel = amqp_connection.channel()
        try:
            channel.queue_delete(name)
        except amqp.exceptions.AMQPError:
            continue
        with suppress(Exception):
            channel.close()
