"""Declaring the OJS topology of one queue (AMQP binding sections 4 and 7).

``Queue.Declare`` with arguments that differ from an existing queue makes
RabbitMQ close the channel with 406 PRECONDITION_FAILED.  Declarations are
therefore made on a channel of their own, and a 406 becomes one
:class:`TopologyConflictError` naming the entity and the arguments sent;
nothing is redeclared.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from amqp.exceptions import PreconditionFailed

from .errors import OJSConfigurationError, TopologyConflictError
from .naming import TopologyNames

#: Arguments ojs_kombu owns on every job queue; user arguments may not override them.
OWNED_ARGUMENTS = ("x-dead-letter-exchange", "x-dead-letter-routing-key")


class DeclaringChannel(Protocol):
    def exchange_declare(self, exchange: str, type: str, *args: Any, **kwargs: Any) -> Any: ...
    def queue_declare(self, queue: str = "", *args: Any, **kwargs: Any) -> Any: ...
    def queue_bind(self, queue: str, exchange: str = "", *args: Any, **kwargs: Any) -> Any: ...


def job_queue_arguments(
    names: TopologyNames, queue: str, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``Queue.Declare`` arguments of ``ojs.queue.{queue}`` (AMQP-004, section 7.2)."""
    extra = dict(extra or {})
    owned = sorted(k for k in OWNED_ARGUMENTS if k in extra)
    if owned:
        raise OJSConfigurationError(
            f"queue {queue!r} sets {', '.join(owned)}: ojs_kombu owns dead-lettering of job "
            "queues (ojs.exchange.dlx, routing key = queue name); remove these arguments"
        )
    return {
        "x-dead-letter-exchange": names.dlx_exchange,
        "x-dead-letter-routing-key": queue,
        **extra,
    }


def declare_queue_topology(
    channel: DeclaringChannel,
    names: TopologyNames,
    queue: str,
    arguments: Mapping[str, Any] | None = None,
) -> None:
    """Declare both exchanges, ``ojs.queue.{q}``, ``ojs.queue.dlx.{q}`` and their bindings."""
    job_args = job_queue_arguments(names, queue, arguments)
    for exchange in (names.direct_exchange, names.dlx_exchange):
        _declare(
            "exchange", exchange, {"type": "direct", "durable": True, "auto_delete": False},
            lambda exchange=exchange: channel.exchange_declare(
                exchange, "direct", durable=True, auto_delete=False
            ),
        )
    for name, args in ((names.job_queue(queue), job_args), (names.dead_letter_queue(queue), {})):
        _declare(
            "queue", name,
            {"durable": True, "exclusive": False, "auto_delete": False, "arguments": args},
            lambda name=name, args=args: channel.queue_declare(
                name, durable=True, exclusive=False, auto_delete=False, arguments=args
            ),
        )
    channel.queue_bind(names.job_queue(queue), names.direct_exchange, routing_key=queue)
    channel.queue_bind(names.dead_letter_queue(queue), names.dlx_exchange, routing_key=queue)


def _declare(kind: str, name: str, declared: Mapping[str, Any], call: Any) -> None:
    try:
        call()
    except PreconditionFailed as exc:
        raise TopologyConflictError(kind, name, declared, str(exc.reply_text)) from None
