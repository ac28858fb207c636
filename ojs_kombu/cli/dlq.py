"""``ojs-kombu dlq list|show|replay|purge``: the dead letters of a queue.

Built on :class:`~ojs_kombu.amqp.broker.dead_letters.DeadLetterQueue`: listing never
consumes, and a replay is a confirmed republish followed by the ack of the
dead letter, so an interrupted replay leaves every job in the DLQ, in its
queue, or (at worst) in both; never in neither.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from ..amqp.broker.dead_letters import DeadLetter, DeadLetterQueue
from ..spec.naming import UNROUTABLE
from .broker import binding_of, connect, queue_name, require_queue
from .common import (
    EXIT_INTERRUPTED,
    OJSGroup,
    check_job_id,
    common_options,
    emit,
    job_id_or_legacy,
    legacy_id_option,
    options,
)

queue_option = click.option(
    "--queue", "-q", required=True,
    help="OJS queue whose DLQ to use; 'unroutable': ojs.queue.dlx.unroutable, the dead "
         "letters whose own DLQ was missing (replayed to their own queues).")


def _job_id(ctx: click.Context, job_id: str | None, legacy: str | None) -> str | None:
    value = job_id_or_legacy(ctx, job_id, legacy)
    return None if value is None else check_job_id(value, any_uuid=True)


@click.group(cls=OJSGroup)
def dlq() -> None:
    """Inspect, replay and purge dead letters (ojs.queue.dlx.{q})."""


@contextmanager
def open_dlq(ctx: click.Context, queue: str) -> Iterator[DeadLetterQueue]:
    """The DLQ of ``queue``; exit 4 when the queue has none (nothing is declared)."""
    ojs_queue = queue if queue == UNROUTABLE else queue_name(queue)
    with connect(options(ctx)) as connection:
        names = binding_of(connection).names
        dlq_name = (names.dlx_unroutable_queue if ojs_queue == UNROUTABLE
                    else names.dead_letter_queue(ojs_queue))
        require_queue(connection.connection, dlq_name,
                      f"no dead-letter queue for OJS queue {ojs_queue!r}")
        yield DeadLetterQueue(connection, ojs_queue)


def dead_letter_data(dead: DeadLetter, full: bool = False) -> dict[str, Any]:
    data: dict[str, Any] = {"job_id": dead.job_id, "type": dead.job_type,
                            "queue": dead.queue, "error_code": dead.error_code,
                            "error_message": dead.error_message, "attempt": dead.attempt,
                            "death_reason": dead.death_reason}
    if full:
        data["headers"] = dead.headers
        data["envelope"] = dead.envelope
        if dead.envelope is None:
            data["body"] = dead.body.decode("utf-8", "replace")
    return data


@dlq.command("list")
@queue_option
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True,
              help="Show at most this many (oldest first).")
@common_options
@click.pass_context
def list_(ctx: click.Context, queue: str, limit: int) -> None:
    """List the dead letters of QUEUE, oldest first; none is removed."""
    with open_dlq(ctx, queue) as dead_letters:
        total = len(dead_letters)
        found = [dead_letter_data(d) for d in dead_letters.list(limit=limit)]

    def human() -> None:
        click.echo(f"{total} dead letter(s) in {dead_letters.dlq}")
        for d in found:
            click.echo(f"  {d['job_id']}  {d['type'] or '-'}  attempt {d['attempt'] or '-'}  "
                       f"{_error_column(d)}")
        if total > len(found):
            click.echo(f"  ... {total - len(found)} more (--limit)")

    emit(ctx, {"queue": dead_letters.queue, "dead_letter_queue": dead_letters.dlq,
               "count": total, "dead_letters": found}, human)


def _error_column(dead: dict[str, Any]) -> str:
    """What ``dlq list`` says about a dead letter's error.  A job the worker nacked
    (AMQP-009) is the message as its last attempt was delivered: its error headers, if
    any, are an earlier attempt's, and the last error is elsewhere; say where."""
    code, message = dead["error_code"], (dead["error_message"] or "")[:60]
    if dead["death_reason"] != "rejected":
        return f"{code or dead['death_reason'] or '-'}  {message}".rstrip()
    earlier = f"; earlier: {code}  {message}".rstrip() if code else ""
    return f"nacked (last error: job.discarded event, result backend){earlier}"


@dlq.command()
@queue_option
@click.argument("job_id", metavar="JOB_ID", required=False)
@legacy_id_option
@common_options
@click.pass_context
def show(ctx: click.Context, queue: str, job_id: str | None, legacy_id: str | None) -> None:
    """Show the dead letter of JOB_ID: its error, headers and envelope (exit 4 if absent)."""
    found_id = _job_id(ctx, job_id, legacy_id)
    if found_id is None:
        raise click.UsageError("give the JOB_ID of the dead letter")
    with open_dlq(ctx, queue) as dead_letters:
        data = dead_letter_data(dead_letters.get(found_id), full=True)

    def human() -> None:
        import json

        for key in ("job_id", "type", "queue", "attempt", "error_code", "error_message",
                    "death_reason"):
            click.echo(f"{key}: {data[key]}")
        if data["death_reason"] == "rejected":
            click.echo("note: discarded by the worker (Basic.Nack): the error headers and the "
                       "envelope's errors are the earlier attempts'; the last attempt's error is "
                       "in the job.discarded event and the result backend")
        click.echo("headers:")
        for key, value in sorted(data["headers"].items()):
            click.echo(f"  {key}: {value}")
        click.echo("envelope:" if data["envelope"] is not None else "body (not a JSON object):")
        body = data["envelope"] if data["envelope"] is not None else data["body"]
        click.echo(json.dumps(body, indent=2, default=str, ensure_ascii=False))

    emit(ctx, data, human)


def _target(dead_letters: DeadLetterQueue) -> str:
    if dead_letters.unroutable:
        return "their own job queues"
    return dead_letters.names.job_queue(dead_letters.queue)


def _one_or_all(job_id: str | None, every: bool) -> None:
    if bool(job_id) == every:
        raise click.UsageError("give JOB_ID or --all")


@dlq.command()
@queue_option
@click.argument("job_id", metavar="[JOB_ID]", required=False)
@legacy_id_option
@click.option("--all", "every", is_flag=True, help="Replay every dead letter present now.")
@click.option("--yes", "-y", is_flag=True, expose_value=False,
              help="Accepted and ignored: replay never asks (it loses nothing), and scripts "
                   "pass the same flags to replay and purge.")
@common_options
@click.pass_context
def replay(ctx: click.Context, queue: str, job_id: str | None, legacy_id: str | None,
           every: bool) -> None:
    """Put the dead letter of JOB_ID (or --all) back on QUEUE (same id, attempt 1, error
    history kept).

    Each job is republished and confirmed before its dead letter is removed, a
    window of up to 500 jobs at a time: Ctrl-C stops between windows and loses
    nothing (exit 130); run it again to go on.
    """
    job_id = _job_id(ctx, job_id, legacy_id)
    _one_or_all(job_id, every)
    with open_dlq(ctx, queue) as dead_letters:
        if job_id:
            dead_letters.replay(job_id)
            emit(ctx, {"queue": dead_letters.queue, "replayed": [job_id]},
                 f"replayed {job_id} to {_target(dead_letters)}")
            return
        total = len(dead_letters)
        # the ids only for --json (which prints them): memory stays flat otherwise
        keep_ids = options(ctx).json
        replayed: list[str] = []
        count = 0
        # on stderr: stdout stays one JSON document with --json
        bar = click.progressbar(length=total, label=f"replaying {total} job(s)",
                                file=sys.stderr, show_pos=True)
        # Ctrl-C takes effect between windows: an interrupt in the middle of a frame
        # would leave the AMQP stream half-written and the close waiting for ever.  The
        # handler stays until the command returns: a Ctrl-C after the last window has
        # nothing left to stop, and the replay reports itself complete.
        stop = threading.Event()
        previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
        try:
            with bar:
                def step(done: str) -> None:
                    nonlocal count
                    count += 1
                    if keep_ids:
                        replayed.append(done)
                    bar.update(1)
                dead_letters.replay_each(step, stop=stop.is_set)
            if stop.is_set() and count < total:
                click.echo(f"interrupted after {count} of {total}; the others are still "
                           f"in {dead_letters.dlq}", err=True)
                emit(ctx, {"queue": dead_letters.queue, "replayed": replayed,
                           "interrupted": True})
                ctx.exit(EXIT_INTERRUPTED)
            emit(ctx, {"queue": dead_letters.queue, "replayed": replayed},
                 f"replayed {count} job(s) to {_target(dead_letters)}")
        finally:
            signal.signal(signal.SIGINT, previous)


@dlq.command()
@queue_option
@click.argument("job_id", metavar="[JOB_ID]", required=False)
@legacy_id_option
@click.option("--all", "every", is_flag=True, help="Delete every dead letter (the default).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@common_options
@click.pass_context
def purge(ctx: click.Context, queue: str, job_id: str | None, legacy_id: str | None,
          every: bool, yes: bool) -> None:
    """Delete the dead letter of JOB_ID, or all of QUEUE's, for good (asks first unless
    --yes)."""
    job_id = _job_id(ctx, job_id, legacy_id)
    if job_id and every:
        raise click.UsageError("give JOB_ID or --all, not both")
    with open_dlq(ctx, queue) as dead_letters:
        what = f"dead letter {job_id}" if job_id else f"all {len(dead_letters)} dead letter(s)"
        if not yes:
            click.confirm(f"Delete {what} of {dead_letters.dlq}?", abort=True, err=True)
        if job_id:
            dead_letters.delete(job_id)
            count = 1
        else:
            count = dead_letters.purge()
    emit(ctx, {"queue": dead_letters.queue, "deleted": count},
         f"deleted {count} dead letter(s) from {dead_letters.dlq}")
