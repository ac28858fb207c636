"""Declaring the OJS topology of one queue (AMQP binding sections 4 and 7).

``Queue.Declare`` with arguments that differ from an existing queue makes
RabbitMQ close the channel with 406 PRECONDITION_FAILED.  Declarations are
therefore made on a channel of their own, and a 406 becomes one
:class:`TopologyConflictError` naming the entity and the arguments sent;
nothing is redeclared (but a job queue's ``x-max-priority`` the app does not ask
for: :mod:`.declared`).

:class:`DeclaredTopology` is a connection's memory of what it declared: a
queue's topology is declared once per connection (the first publish to it, or
its consumer), retry queues again while they are in use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from amqp.exceptions import PreconditionFailed

from ...spec.backpressure import drops_head, rejects_when_full
from ...spec.delays import SCHEDULE_LEVELS, delivery_binding_key, level_binding_keys
from ...spec.errors import OJSConfigurationError, TopologyConflictError
from ...spec.naming import TopologyNames

#: Arguments ojs_kombu owns on every job queue; user arguments may not override them.
OWNED_ARGUMENTS = ("x-dead-letter-exchange", "x-dead-letter-routing-key")


#: ``ojs.queue.dropped.{q}`` is a notification tap, not storage (the DLQ keeps the
#: dropped jobs): bounded so that it stays small while no worker consumes it.
DROPPED_QUEUE_ARGUMENTS: Mapping[str, Any] = {
    "x-max-length": 10_000,
    "x-max-length-bytes": 64 * 1024 * 1024,
    "x-message-ttl": 24 * 3600 * 1000,
    "x-overflow": "drop-head",
}

#: Idle retry queues expire this long after their TTL (``x-expires``); ojs_kombu
#: re-declares a retry queue it keeps using well before that.
RETRY_QUEUE_IDLE_MS = 3_600_000


class DeclaringChannel(Protocol):
    def exchange_declare(self, exchange: str, type: str, *args: Any, **kwargs: Any) -> Any: ...
    def exchange_bind(self, destination: str, source: str = "", *args: Any,
                      **kwargs: Any) -> Any: ...
    def queue_declare(self, queue: str = "", *args: Any, **kwargs: Any) -> Any: ...
    def queue_bind(self, queue: str, exchange: str = "", *args: Any, **kwargs: Any) -> Any: ...
    def queue_unbind(self, queue: str, exchange: str = "", *args: Any, **kwargs: Any) -> Any: ...


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


def dlx_guard_arguments(names: TopologyNames) -> dict[str, Any]:
    """``ojs.exchange.dlx.guard``'s alternate exchange.  RabbitMQ drops a dead letter
    whose ``ojs.queue.dlx.{q}`` was deleted (dead-lettering is not confirmed); the plain
    ``ojs.exchange.dlx`` (AMQP-002) also routes it (key ``q``) to the guard, bound to
    the same DLQ (a queue gets a message once) or, the DLQ gone, to this exchange and
    ``ojs.queue.dlx.unroutable``."""
    return {"alternate-exchange": names.dlx_unroutable_exchange}


def declare_dead_letter_exchanges(channel: DeclaringChannel, names: TopologyNames,
                                  unroutable_arguments: Mapping[str, Any] | None = None) -> None:
    """``ojs.exchange.dlx``, its guard and ``ojs.exchange.dlx.unroutable`` (fanout) into
    ``ojs.queue.dlx.unroutable`` (``unroutable_arguments``: the settings')."""
    _exchange(channel, names.dlx_exchange)
    _exchange(channel, names.dlx_unroutable_exchange, "fanout")
    _queue(channel, names.dlx_unroutable_queue, dict(unroutable_arguments or {}))
    channel.queue_bind(names.dlx_unroutable_queue, names.dlx_unroutable_exchange)
    _exchange(channel, names.dlx_guard_exchange, "direct", dlx_guard_arguments(names))


def declare_queue_topology(
    channel: DeclaringChannel,
    names: TopologyNames,
    queue: str,
    arguments: Mapping[str, Any] | None = None,
    unroutable_arguments: Mapping[str, Any] | None = None,
) -> None:
    """Declare both exchanges (and the DLX's guard, :func:`dlx_guard_arguments`),
    ``ojs.queue.{q}``, ``ojs.queue.dlx.{q}``, ``ojs.queue.control.{q}`` (routing key:
    its own name, section 5.6) and their bindings;
    for a ``drop_oldest`` queue also ``ojs.queue.dropped.{q}``, which gets a copy of
    every dead letter of ``q`` so that its workers can report the dropped ones."""
    job_args = job_queue_arguments(names, queue, arguments)
    _exchange(channel, names.direct_exchange)
    declare_dead_letter_exchanges(channel, names, unroutable_arguments)
    _queue(channel, names.job_queue(queue), job_args)
    _queue(channel, names.dead_letter_queue(queue), dead_letter_queue_arguments(arguments))
    _queue(channel, names.control_queue(queue), control_queue_arguments(arguments))
    channel.queue_bind(names.control_queue(queue), names.direct_exchange,
                       routing_key=names.control_queue(queue))
    channel.queue_bind(names.job_queue(queue), names.direct_exchange, routing_key=queue)
    channel.queue_bind(names.dead_letter_queue(queue), names.dlx_exchange, routing_key=queue)
    channel.exchange_bind(names.dlx_guard_exchange, names.dlx_exchange, routing_key=queue)
    channel.queue_bind(names.dead_letter_queue(queue), names.dlx_guard_exchange, routing_key=queue)
    if drops_head(job_args):
        _queue(channel, names.dropped_queue(queue), dropped_queue_arguments(arguments))
        channel.queue_bind(names.dropped_queue(queue), names.dlx_exchange, routing_key=queue)
    if rejects_when_full(job_args):
        ready = names.ready_queue(queue)
        _queue(channel, ready, ready_queue_arguments(names, queue))
        channel.queue_bind(ready, names.direct_exchange, routing_key=ready)


def ready_queue_arguments(names: TopologyNames, queue: str) -> dict[str, Any]:
    """``ojs.queue.ready.{q}`` of a bounded ``reject``/``block`` queue: where its retried
    and scheduled jobs go once their delay is over.

    RabbitMQ drops a dead-lettered message its target queue refuses, so a job
    whose delay ended while ``ojs.queue.{q}`` was full would be lost.  The ready
    queue is unbounded (it accepts every such job), expires each at once
    (``x-message-ttl`` 0) and dead-letters at least once into ``ojs.queue.{q}``: a
    job the full queue refuses stays here until the queue confirms it (quorum
    queues only have at-least-once dead-lettering, hence its type, whatever
    the job queue's).
    """
    return {
        "x-queue-type": "quorum",
        "x-message-ttl": 0,
        "x-dead-letter-exchange": names.direct_exchange,
        "x-dead-letter-routing-key": queue,
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }


def ready_key(names: TopologyNames, queue: str, job_arguments: Mapping[str, Any] | None) -> str:
    """The routing key (on ``ojs.exchange.direct``) a waited job of ``queue`` goes back
    with: the ready queue's name for a bounded ``reject``/``block`` queue, else ``queue``."""
    if rejects_when_full(job_arguments or {}):
        return names.ready_queue(queue)
    return queue


def _same_type(job_arguments: Mapping[str, Any] | None) -> dict[str, Any]:
    """A queue of ``q``'s topology has the job queue's type: on a cluster with quorum job
    queues it lives on, and can be declared again, while one node is away (a durable
    classic queue whose node is down refuses ``Queue.Declare`` with 404)."""
    kind = (job_arguments or {}).get("x-queue-type")
    return {"x-queue-type": kind} if kind == "quorum" else {}


def dead_letter_queue_arguments(job_arguments: Mapping[str, Any] | None) -> dict[str, Any]:
    """``ojs.queue.dlx.{q}`` has the job queue's type: a quorum job queue's dead letters
    are replicated too.  Never bounded: a dead letter must not be dropped."""
    return _same_type(job_arguments)


def control_queue_arguments(job_arguments: Mapping[str, Any] | None) -> dict[str, Any]:
    """``ojs.queue.control.{q}`` has the job queue's type, so that CANCEL and INFO reach
    the workers, and the workers find their control queue, while a node is away."""
    return _same_type(job_arguments)


def dropped_queue_arguments(job_arguments: Mapping[str, Any] | None) -> dict[str, Any]:
    """``ojs.queue.dropped.{q}``: :data:`DROPPED_QUEUE_ARGUMENTS`, of the job queue's type."""
    return {**DROPPED_QUEUE_ARGUMENTS, **_same_type(job_arguments)}


def retry_queue_arguments(names: TopologyNames, queue: str, delay_ms: int,
                          job_arguments: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``ojs.queue.retry.{q}.{ms}`` (section 8.2), plus ``x-expires`` so idle ones go away.

    A retry queue has its job queue's type.  With at-least-once dead-lettering
    (quorum) it has that too, and no ``x-expires``, which would delete it with the
    jobs still waiting in it.  A bounded ``reject``/``block`` queue's retries go back
    through its ready queue (:func:`ready_queue_arguments`), never straight into
    the possibly full job queue.
    """
    job_arguments = job_arguments or {}
    arguments: dict[str, Any] = {
        "x-dead-letter-exchange": names.direct_exchange,
        "x-dead-letter-routing-key": ready_key(names, queue, job_arguments),
        "x-message-ttl": delay_ms,
    }
    if job_arguments.get("x-queue-type") == "quorum":
        arguments["x-queue-type"] = "quorum"
    if job_arguments.get("x-dead-letter-strategy") == "at-least-once":
        arguments["x-dead-letter-strategy"] = "at-least-once"
        arguments["x-overflow"] = "reject-publish"
    else:
        arguments["x-expires"] = delay_ms + RETRY_QUEUE_IDLE_MS
    return arguments


def declare_retry_queue(channel: DeclaringChannel, names: TopologyNames, queue: str,
                        delay_ms: int, job_arguments: Mapping[str, Any] | None = None,
                        bound: bool = True) -> None:
    """The retry queue of ``queue`` for ``delay_ms``, and ``ojs.exchange.retry`` with the
    queue bound to it unless ``bound`` is false (a scoped worker, which publishes its
    retries to the queue itself: :meth:`.declared.DeclaredTopology.retry_route`)."""
    name = names.retry_queue(queue, delay_ms)
    if bound:
        _exchange(channel, names.retry_exchange)
    _queue(channel, name, retry_queue_arguments(names, queue, delay_ms, job_arguments))
    if bound:
        channel.queue_bind(name, names.retry_exchange, routing_key=f"{queue}.{delay_ms}")


def declare_shared(channel: DeclaringChannel, names: TopologyNames,
                   schedule_arguments: Mapping[str, Any] | None = None,
                   unroutable_arguments: Mapping[str, Any] | None = None) -> None:
    """Every entity the queues of ``names`` share, declared by the operator
    (``ojs-kombu topology declare``): ``ojs.exchange.direct``, the dead-letter exchanges
    and ``ojs.queue.dlx.unroutable``, ``ojs.exchange.retry`` and the whole scheduling
    ladder (its 32 levels are fixed, :data:`~ojs_kombu.spec.delays.SCHEDULE_LEVELS`)."""
    _exchange(channel, names.direct_exchange)
    declare_dead_letter_exchanges(channel, names, unroutable_arguments)
    _exchange(channel, names.retry_exchange)
    declare_schedule_ladder(channel, names, schedule_arguments)


def declare_job_exchange(channel: DeclaringChannel, names: TopologyNames) -> None:
    """``ojs.exchange.direct`` alone: whether this user may declare it tells an operator
    (or a ``.*`` user) from a scoped producer or worker (:mod:`.declared`)."""
    _exchange(channel, names.direct_exchange)


def declare_schedule_ladder(channel: DeclaringChannel, names: TopologyNames,
                            queue_arguments: Mapping[str, Any] | None = None) -> None:
    """The binary scheduling ladder shared by every queue of ``names`` (see :mod:`.delays`)."""
    _exchange(channel, names.schedule_unroutable_exchange, "fanout")
    _queue(channel, names.schedule_unroutable_queue, dict(queue_arguments or {}))
    channel.queue_bind(names.schedule_unroutable_queue, names.schedule_unroutable_exchange)
    _exchange(channel, names.schedule_ready_exchange, "topic",
              {"alternate-exchange": names.schedule_unroutable_exchange})
    below = names.schedule_ready_exchange
    for level in range(SCHEDULE_LEVELS):
        exchange, queue = names.schedule_exchange(level), names.schedule_queue(level)
        wait_key, skip_key = level_binding_keys(level)
        _exchange(channel, exchange, "topic")
        _queue(channel, queue, {**(queue_arguments or {}), "x-message-ttl": 2**level,
                                "x-dead-letter-exchange": below})
        channel.queue_bind(queue, exchange, routing_key=wait_key)
        channel.exchange_bind(below, exchange, routing_key=skip_key)
        below = exchange


def bind_scheduled_delivery(channel: DeclaringChannel, names: TopologyNames, queue: str,
                            job_arguments: Mapping[str, Any] | None = None) -> None:
    """Let waited jobs of ``queue`` leave the ladder into ``ojs.queue.{queue}``, or into
    its ready queue when it is bounded (and not into both: each would get a copy)."""
    key = delivery_binding_key(queue)
    if ready_key(names, queue, job_arguments) == queue:
        channel.queue_bind(names.job_queue(queue), names.schedule_ready_exchange, routing_key=key)
        return
    channel.queue_bind(names.ready_queue(queue), names.schedule_ready_exchange, routing_key=key)
    channel.queue_unbind(names.job_queue(queue), names.schedule_ready_exchange, routing_key=key)


def declare_delayed_exchange(channel: DeclaringChannel, names: TopologyNames, queue: str,
                             job_arguments: Mapping[str, Any] | None = None) -> None:
    """``ojs.exchange.delayed`` (the delayed-message plugin, section 9.1.2) bound to ``queue``."""
    from amqp.exceptions import AMQPError

    try:
        _exchange(channel, names.delayed_exchange, "x-delayed-message",
                  {"x-delayed-type": "direct"})
        refused = None
    except TopologyConflictError as exc:
        # RabbitMQ 4 refuses an unknown exchange type with a 406, 3.x closes with a 503
        if "unknown exchange type" not in exc.broker_reply:
            raise
        refused = exc.broker_reply
    except AMQPError as exc:
        refused = str(exc)
    if refused is not None:
        raise OJSConfigurationError(
            f"cannot declare {names.delayed_exchange!r} of type x-delayed-message "
            f"({refused}); is the rabbitmq_delayed_message_exchange plugin enabled? "
            "Set ojs_delayed_exchange=False to schedule through TTL queues instead"
        ) from None
    # a bounded queue's delayed jobs are delivered through its ready queue (section above)
    target = ready_key(names, queue, job_arguments)
    channel.queue_bind(names.job_queue(queue) if target == queue else target,
                       names.delayed_exchange, routing_key=queue)


def queue_message_count(channel: DeclaringChannel, names: TopologyNames, queue: str) -> int:
    """Ready messages in ``ojs.queue.{queue}`` (passive declare: creates nothing)."""
    return int(channel.queue_declare(names.job_queue(queue), passive=True).message_count)


def _exchange(channel: DeclaringChannel, name: str, kind: str = "direct",
              arguments: Mapping[str, Any] | None = None) -> None:
    _declare("exchange", name, {"type": kind, "durable": True, "arguments": dict(arguments or {})},
             lambda: channel.exchange_declare(name, kind, durable=True, auto_delete=False,
                                              arguments=dict(arguments or {})))


def _queue(channel: DeclaringChannel, name: str, arguments: Mapping[str, Any]) -> None:
    _declare("queue", name,
             {"durable": True, "exclusive": False, "auto_delete": False, "arguments": arguments},
             lambda: channel.queue_declare(name, durable=True, exclusive=False,
                                           auto_delete=False, arguments=dict(arguments)))


def _declare(kind: str, name: str, declared: Mapping[str, Any], call: Any) -> None:
    try:
        call()
    except PreconditionFailed as exc:
        raise TopologyConflictError(kind, name, declared, str(exc.reply_text)) from None
