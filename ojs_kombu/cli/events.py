"""``ojs-kombu events tail``: follow the AMQP event sink (``ojs.exchange.events``) live."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import click
from pydantic import ValidationError

from ..amqp.wire.drain import drain_until
from ..celery.events import events_exchange
from ..events.bus import EventFilter
from ..events.models import Event
from ..events.wire import decode_events
from ..spec.errors import InvalidEventMessage
from ..spec.times import format_time
from .broker import binding_of, connect
from .common import EXIT_TIMEOUT, OJSGroup, common_options, fail, options


@click.group(cls=OJSGroup)
def events() -> None:
    """Follow OJS events published by the AMQP event sink."""


def _split(values: tuple[str, ...]) -> list[str] | None:
    items = [v.strip() for value in values for v in value.split(",") if v.strip()]
    return items or None


def binding_keys(event_types: list[str] | None) -> list[str]:
    """Topic binding keys that receive at least the events ``event_types`` selects."""
    if not event_types:
        return ["#"]
    keys = set()
    for pattern in event_types:
        if pattern == "*":
            return ["#"]
        if pattern.endswith(".*") and "*" not in pattern[:-2]:
            keys.add(pattern[:-1] + "#")
        elif "*" in pattern:
            return ["#"]  # a prefix inside a segment ("job.comp*"): filtered here
        else:
            keys.add(pattern)
    return sorted(keys)


def format_event(event: Event) -> str:
    """One line: time, type, subject and the event's data."""
    data = json.dumps(event.data, separators=(",", ":"), default=str, ensure_ascii=False)
    stamp = format_time(event.time) if isinstance(event.time, datetime) else str(event.time)
    return f"{stamp}  {event.type:<18} {event.subject or '-'}  {data}"


@events.command()
@click.option("--types", "types", multiple=True, metavar="PATTERNS",
              help="Event types, comma separated or repeated; a trailing * is a prefix "
                   "(job.*, worker.*, job.failed).")
@click.option("--queues", "queues", multiple=True, metavar="QUEUES",
              help="Only job events of these OJS queues.")
@click.option("--job-types", "job_types", multiple=True, metavar="TYPES",
              help="Only job events of these job types.")
@click.option("--count", type=click.IntRange(min=1), help="Stop after this many events.")
@click.option("--timeout", type=click.FloatRange(min=0.1), metavar="SECONDS",
              help="Stop after this many seconds (exit 5 if --count was not reached).")
@common_options
@click.pass_context
def tail(ctx: click.Context, types: tuple[str, ...], queues: tuple[str, ...],
         job_types: tuple[str, ...], count: int | None, timeout: float | None) -> None:
    """Print OJS events as the AMQP event sink publishes them.

    Binds a private, auto-deleted queue to ojs.exchange.events (the exchange
    the "amqp" entry of ojs_event_sinks publishes to, routing key = event
    type) and prints each matching event: one line each, or one JSON object
    per line with --json.  Only events published while it runs are seen.
    Ctrl-C stops it (exit 0).
    """
    try:
        flt = EventFilter(event_types=_split(types), queues=_split(queues),
                          job_types=_split(job_types))
    except ValidationError as exc:
        message = "; ".join(str(e["msg"]) for e in exc.errors())
        raise click.BadParameter(message, param_hint="--types/--queues/--job-types") from None
    json_mode = options(ctx).json
    seen = 0

    def on_message(message: Any) -> None:
        nonlocal seen
        try:  # one event, or a batch of them (ojs_kombu.events.wire)
            items = decode_events(message.body, message.properties.get("content_type"))
        except InvalidEventMessage as exc:
            click.echo(f"skipping a message that is not an OJS event: {exc}", err=True)
            return
        for item in items:
            if count is not None and seen >= count:
                return
            try:
                event = Event.model_validate(item)
            except ValidationError as exc:
                click.echo(f"skipping a message that is not an OJS event: "
                           f"{exc.errors()[0]['msg']}", err=True)
                continue
            if not flt.matches(event):
                continue
            seen += 1
            click.echo(event.to_json().decode() if json_mode else format_event(event))

    with connect(options(ctx)) as connection:
        exchange = events_exchange(binding_of(connection).names)
        amqp_connection = connection.connection
        channel = amqp_connection.channel()
        channel.exchange_declare(exchange, "topic", durable=True, auto_delete=False)
        queue, _, _ = channel.queue_declare("", exclusive=True, auto_delete=True)
        keys = binding_keys(flt.event_types)
        for key in keys:
            channel.queue_bind(queue, exchange, routing_key=key)
        channel.basic_consume(queue, no_ack=True, callback=on_message)
        click.echo(f"following {exchange} ({', '.join(keys)}) on "
                   f"{options(ctx).target().describe()}; Ctrl-C to stop", err=True)
        try:
            drain_until(amqp_connection, lambda: count is not None and seen >= count, timeout,
                        poll=1.0)
        except KeyboardInterrupt:
            return
    if count is not None and seen < count:
        fail(ctx, f"timed out after {timeout}s with {seen} of {count} event(s)", EXIT_TIMEOUT)
