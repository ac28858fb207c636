"""``ojs-kombu topology declare|show``: the OJS entities of a set of queues."""

from __future__ import annotations

from typing import Any

import click

from ..amqp.binding import Binding
from ..amqp.broker.declaring import declare_on
from ..amqp.broker.topology import (
    OWNED_ARGUMENTS,
    control_queue_arguments,
    dead_letter_queue_arguments,
    declare_shared,
    dlx_guard_arguments,
    dropped_queue_arguments,
    job_queue_arguments,
    ready_queue_arguments,
)
from ..amqp.job_channel import JobConnection
from ..celery.events import events_exchange
from ..spec.backpressure import drops_head, rejects_when_full
from ..spec.delays import SCHEDULE_LEVELS
from ..spec.naming import TopologyNames
from .broker import (
    binding_of,
    connect,
    exchange_equivalence,
    exchange_exists,
    queue_equivalence,
    queue_name,
    queue_state,
)
from .common import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    OJSGroup,
    common_options,
    emit,
    fail,
    options,
)

queue_option = click.option("--queue", "-q", "queues", multiple=True, required=True,
                            metavar="QUEUE", help="OJS queue name (repeat for several).")


@click.group(cls=OJSGroup)
def topology() -> None:
    """Declare or inspect the OJS topology of queues."""


@topology.command()
@queue_option
@click.option("--schedule", is_flag=True, hidden=True,
              help="Accepted for compatibility: the scheduling ladder is always declared.")
@common_options
@click.pass_context
def declare(ctx: click.Context, queues: tuple[str, ...], schedule: bool) -> None:
    """Declare the OJS topology of each QUEUE and everything the queues share
    (idempotent): the operator's command.

    Both exchanges, ojs.queue.{q}, ojs.queue.dlx.{q}, ojs.queue.control.{q}
    (ojs.queue.dropped.{q} for drop_oldest queues) and their bindings, exactly
    as ojs_kombu declares them with full permissions; then the shared entities
    (ojs.exchange.retry, ojs.exchange.events, the scheduling ladder's 32 levels,
    ojs.queue.dlx.unroutable) and each queue's way out of the ladder.  Scoped
    producers and workers (docs/production.rst) declare none of these: they
    only check them.  A queue that exists with other arguments is left alone
    and reported (exit 1).
    """
    names = [queue_name(q) for q in queues]
    with connect(options(ctx)) as connection:
        amqp_connection: JobConnection = connection.connection
        binding = binding_of(connection)
        settings = binding.settings
        declare_on(amqp_connection, declare_shared, settings.schedule_arguments(),
                   settings.unroutable_dead_letter_arguments())
        declare_on(amqp_connection, lambda channel, topo: channel.exchange_declare(
            events_exchange(topo), "topic", durable=True, auto_delete=False))
        declared = []
        for queue in names:
            amqp_connection.ensure_schedule(queue)
            declared.append(expected_topology(binding, queue,
                                              amqp_connection.topology_arguments(queue)))
    shared = {"exchanges": binding.names.exchanges(delayed=False),
              "queues": [binding.names.dlx_unroutable_queue,
                         binding.names.schedule_unroutable_queue,
                         *(binding.names.schedule_queue(k) for k in range(SCHEDULE_LEVELS))]}
    emit(ctx, {"declared": declared, "shared": shared},
         lambda: _print_declared(declared, shared))


def _print_declared(declared: list[dict[str, Any]], shared: dict[str, list[str]]) -> None:
    for topo in declared:
        click.echo(f"declared queue {topo['queue']}:")
        for exchange in topo["exchanges"]:
            click.echo(f"  exchange {exchange['name']} ({exchange['type']}, durable)")
        for queue in topo["queues"]:
            click.echo(f"  queue    {queue['name']} {_args(queue['arguments'])}".rstrip())
        for b in topo["bindings"]:
            click.echo(f"  binding  {b['source']} -> {b['destination']} "
                       f"(routing key {b['routing_key']})")
    click.echo(f"declared the shared entities: {len(shared['exchanges'])} exchanges, "
               f"{len(shared['queues'])} queues (the scheduling ladder's included)")


def expected_topology(binding: Binding, queue: str,
                      arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    """The entities ojs_kombu declares for ``queue`` (section 4, 7), as plain data;
    ``arguments``: those a connection declared the job queue with, if not the binding's."""
    names: TopologyNames = binding.names
    control = names.control_queue(queue)
    if arguments is None:
        arguments = binding.declare_arguments(queue)
    job_arguments = job_queue_arguments(names, queue, arguments)
    topology: dict[str, Any] = {
        "queue": queue,
        "exchanges": [{"name": names.direct_exchange, "type": "direct"},
                      {"name": names.dlx_exchange, "type": "direct"},
                      {"name": names.dlx_guard_exchange, "type": "direct",
                       "arguments": dlx_guard_arguments(names)},
                      {"name": names.dlx_unroutable_exchange, "type": "fanout"}],
        "queues": [
            {"name": names.job_queue(queue), "role": "job", "arguments": job_arguments},
            {"name": names.dead_letter_queue(queue), "role": "dead letters",
             "arguments": dead_letter_queue_arguments(arguments)},
            {"name": control, "role": "control", "arguments": control_queue_arguments(arguments)},
            {"name": names.dlx_unroutable_queue, "role": "unroutable dead letters",
             "arguments": binding.settings.unroutable_dead_letter_arguments()},
        ],
        "bindings": [
            {"source": names.direct_exchange, "destination": names.job_queue(queue),
             "routing_key": queue},
            {"source": names.dlx_exchange, "destination": names.dead_letter_queue(queue),
             "routing_key": queue},
            {"source": names.direct_exchange, "destination": control, "routing_key": control},
            {"source": names.dlx_exchange, "destination": names.dlx_guard_exchange,
             "routing_key": queue},
            {"source": names.dlx_guard_exchange, "destination": names.dead_letter_queue(queue),
             "routing_key": queue},
            {"source": names.dlx_unroutable_exchange, "destination": names.dlx_unroutable_queue,
             "routing_key": ""},
        ],
    }
    if drops_head(job_arguments):
        tap = names.dropped_queue(queue)
        topology["queues"].append({"name": tap, "role": "dropped jobs",
                                   "arguments": dropped_queue_arguments(arguments)})
        topology["bindings"].append({"source": names.dlx_exchange, "destination": tap,
                                     "routing_key": queue})
    if rejects_when_full(job_arguments):
        ready = names.ready_queue(queue)
        topology["queues"].append({"name": ready, "role": "ready",
                                   "arguments": ready_queue_arguments(names, queue)})
        topology["bindings"].append({"source": names.direct_exchange, "destination": ready,
                                     "routing_key": ready})
    return topology


def inspect_topology(amqp_connection: Any, binding: Binding, queue: str) -> dict[str, Any]:
    """What the broker holds of ``queue``'s OJS topology; read-only (see :mod:`.broker`).

    ``problems`` lists what would stop ojs_kombu from using it: a missing entity,
    an exchange of another type, a queue with other durability or without its
    OJS dead-lettering.  Other argument differences are reported, not problems
    (``ojs_queue_arguments`` or ``ojs_max_priority`` may explain them).
    """
    expected = expected_topology(binding, queue)
    problems: list[str] = []
    exchanges = []
    for exchange in expected["exchanges"]:
        found = {**exchange, "exists": exchange_exists(amqp_connection, exchange["name"])}
        if not found["exists"]:
            problems.append(f"exchange {exchange['name']} does not exist")
        else:
            eq = exchange_equivalence(amqp_connection, exchange["name"], exchange["type"],
                                      exchange.get("arguments"))
            found["differences"] = _differences(eq.differences)
            if not eq.equivalent:
                problems.append(f"exchange {exchange['name']}: {eq.reply}")
        exchanges.append(found)
    queues = []
    for q in expected["queues"]:
        state = queue_state(amqp_connection, q["name"])
        found = {"name": q["name"], "role": q["role"], "exists": state.exists}
        if not state.exists:
            problems.append(f"queue {q['name']} does not exist")
        else:
            eq = queue_equivalence(amqp_connection, q["name"], q["arguments"])
            found.update(messages=state.messages, consumers=state.consumers,
                         arguments=eq.arguments, expected_arguments=q["arguments"],
                         differences=_differences(eq.differences))
            blocking = sorted(k for k in eq.differences
                              if k in OWNED_ARGUMENTS or not k.startswith("x-"))
            if blocking or (not eq.equivalent and not eq.differences):
                problems.append(f"queue {q['name']}: {', '.join(blocking) or 'properties'} "
                                f"differ from what ojs_kombu declares ({eq.reply})")
        queues.append(found)
    bindings = [{**b, "verified": False} for b in expected["bindings"]]
    return {"queue": queue, "exchanges": exchanges, "queues": queues, "bindings": bindings,
            "problems": problems}


def _differences(differences: dict[str, tuple[Any, Any]]) -> dict[str, dict[str, Any]]:
    return {k: {"expected": e, "current": c} for k, (e, c) in differences.items()}


@topology.command()
@queue_option
@click.option("--events/--no-events", default=False,
              help="Also show the events exchange (ojs.exchange.events).")
@common_options
@click.pass_context
def show(ctx: click.Context, queues: tuple[str, ...], events: bool) -> None:
    """Show the OJS entities of each QUEUE as the broker holds them.

    Exchanges (type, durability), queues (messages ready, consumers, the
    arguments the broker checks on declaration) and bindings.  Read-only:
    passive declarations, and re-declarations of existing entities with the
    same properties, which RabbitMQ answers without changing anything.
    AMQP cannot list bindings: they are shown as ojs_kombu declares them.

    Exit 4 when a queue does not exist, 1 when an entity conflicts with
    the OJS topology.
    """
    names = [queue_name(q) for q in queues]
    with connect(options(ctx)) as connection:
        amqp_connection = connection.connection
        binding = binding_of(connection)
        report: dict[str, Any] = {
            "queues": [inspect_topology(amqp_connection, binding, q) for q in names]}
        if events:
            name = events_exchange(binding.names)
            exists = exchange_exists(amqp_connection, name)
            report["events_exchange"] = {"name": name, "type": "topic", "exists": exists}
            if exists:
                eq = exchange_equivalence(amqp_connection, name, "topic")
                report["events_exchange"]["differences"] = _differences(eq.differences)
    emit(ctx, report, lambda: _print_report(report))
    missing = [t["queue"] for t in report["queues"]
               if not any(q["exists"] for q in t["queues"] if q["role"] == "job")]
    if missing:
        fail(ctx, f"unknown queue(s): {', '.join(missing)}", EXIT_NOT_FOUND)
    problems = sum(len(t["problems"]) for t in report["queues"])
    if problems:
        fail(ctx, f"{problems} problem(s) would stop ojs_kombu from using the topology",
             EXIT_FAILED)


def _args(arguments: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(arguments.items()))


def _print_report(report: dict[str, Any]) -> None:
    for topo in report["queues"]:
        click.echo(f"queue {topo['queue']}")
        width = max(len(e["name"]) for e in topo["exchanges"] + topo["queues"])
        for exchange in topo["exchanges"]:
            status = "ok" if exchange["exists"] and not exchange.get("differences") else (
                "MISSING" if not exchange["exists"] else "DIFFERS")
            click.echo(f"  exchange  {exchange['name']:<{width}}  {exchange['type']}, "
                       f"durable  {status}")
        for queue in topo["queues"]:
            if not queue["exists"]:
                click.echo(f"  queue     {queue['name']:<{width}}  MISSING")
                continue
            status = "ok" if not queue["differences"] else "DIFFERS"
            click.echo(f"  queue     {queue['name']:<{width}}  messages {queue['messages']}, "
                       f"consumers {queue['consumers']}  {status}")
            if queue["arguments"]:
                click.echo(f"            {'':<{width}}  {_args(queue['arguments'])}")
            for key, diff in queue["differences"].items():
                click.echo(f"            {'':<{width}}  {key}: ojs_kombu declares "
                           f"{diff['expected']!r}, broker has {diff['current']!r}")
        for b in topo["bindings"]:
            click.echo(f"  binding   {b['source']} -> {b['destination']} "
                       f"(routing key {b['routing_key']}; as declared, AMQP cannot list "
                       "bindings)")
        for problem in topo["problems"]:
            click.echo(f"  PROBLEM   {problem}")
    events = report.get("events_exchange")
    if events:
        click.echo(f"events exchange {events['name']} (topic): "
                   f"{'exists' if events['exists'] else 'MISSING'}")
