"""``ojs-kombu dlq list|show|replay|purge``: the dead letters of a queue.

Built on :class:`~ojs_kombu.amqp.broker.dead_letters.DeadLetterQueue`: listing never
consumes, and a replay is a confirmed republish followed by the ack of the
dead letter, so an interrupted replay leaves every job in the DLQ, in its
queue, or (at worst) in both; never in neither.
"""

from __future__ import annotations

import base64
import json
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from ..amqp.broker.dead_letters import DeadLetter, DeadLetterQueue
from ..celery.dead_letters import explained
from ..spec.dead_letter import NOT_RECORDED, NOT_RECORDED_HINT
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


def _ident(ctx: click.Context, ident: str | None, legacy: str | None) -> str | None:
    value = job_id_or_legacy(ctx, ident, legacy)
    return None if value is None else check_job_id(value, task_id=True, hint="ID")


@click.group(cls=OJSGroup)
def dlq() -> None:
    """Inspect, replay and purge dead letters (ojs.queue.dlx.{q})."""


@contextmanager
def open_dlq(ctx: click.Context, queue: str) -> Iterator[DeadLetterQueue]:
    """The DLQ of ``queue``; exit 4 when the queue has none (nothing is declared).  With
    the ``-A`` app, a nacked dead letter says why from its result backend."""
    ojs_queue = queue if queue == UNROUTABLE else queue_name(queue)
    with connect(options(ctx)) as connection:
        names = binding_of(connection).names
        dlq_name = (names.dlx_unroutable_queue if ojs_queue == UNROUTABLE
                    else names.dead_letter_queue(ojs_queue))
        require_queue(connection.connection, dlq_name,
                      f"no dead-letter queue for OJS queue {ojs_queue!r}")
        app = options(ctx).app()
        yield DeadLetterQueue(connection, ojs_queue,
                              explained(app) if app is not None else None)


def dead_letter_data(dead: DeadLetter, full: bool = False) -> dict[str, Any]:
    """A dead letter as ``dlq list`` (and, ``full``, ``dlq show``) print it; ``why`` is
    what to do when nothing recorded why it died (else ``None``)."""
    data: dict[str, Any] = {
        "key": dead.key, "job_id": dead.job_id, "task_id": dead.task_id,
        "type": dead.job_type, "queue": dead.queue, "attempt": dead.attempt,
        "error_code": dead.error_code, "error_message": dead.error_message,
        "error_type": dead.error_type, "error_source": dead.why.source,
        "why": NOT_RECORDED_HINT if dead.why.source == NOT_RECORDED else None,
        "earlier_error": dead.why.earlier, "death_reason": dead.death_reason,
        "problems": list(dead.problems)}
    if full:
        data["content_type"] = dead.content_type
        data["headers"] = dead.headers
        data["envelope"] = dead.envelope
        if dead.envelope is None:
            try:
                data["body"] = dead.body.decode("utf-8")
            except UnicodeDecodeError:
                data["body_base64"] = base64.b64encode(dead.body).decode("ascii")
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
        found = [dead_letter_data(d) for d in dead_letters.list(limit=limit, bodies=False)]

    def human() -> None:
        click.echo(f"{total} dead letter(s) in {dead_letters.dlq}")
        for d in found:
            click.echo(f"  {d['key']}  {d['type'] or '-'}  attempt {d['attempt'] or '-'}  "
                       f"{error_text(d, 120)}")
            if d["task_id"] not in (None, d["key"]):
                click.echo(f"    task id: {d['task_id']}")
            if d["why"]:
                click.echo(f"    why: {d['why']}")
            if d["problems"]:
                click.echo(f"    not a job: {'; '.join(d['problems'])}")
        if total > len(found):
            click.echo(f"  ... {total - len(found)} more (--limit)")

    emit(ctx, {"queue": dead_letters.queue, "dead_letter_queue": dead_letters.dlq,
               "count": total, "dead_letters": found}, human)


def error_text(dead: dict[str, Any], width: int | None = None) -> str:
    """Why a dead letter died, on one line: code, exception type and message."""
    message = dead["error_message"] or ""
    if dead["error_type"]:
        message = f"{dead['error_type']}: {message}"
    if width is not None and len(message) > width:
        message = message[:width - 3] + "..."
    return f"{dead['error_code'] or '-'}  {message}".rstrip()


@dlq.command()
@queue_option
@click.argument("ident", metavar="ID", required=False)
@legacy_id_option
@common_options
@click.pass_context
def show(ctx: click.Context, queue: str, ident: str | None, legacy_id: str | None) -> None:
    """Show the dead letter ID: why it died, its ids, headers and envelope (or body);
    exit 4 if absent.

    ID is its OJS job id, the caller's Celery task id, or the key ``dlq list`` shows
    (sha256:... for a dead letter without an id)."""
    found_id = _ident(ctx, ident, legacy_id)
    if found_id is None:
        raise click.UsageError("give the ID of the dead letter")
    with open_dlq(ctx, queue) as dead_letters:
        data = dead_letter_data(dead_letters.get(found_id), full=True)

    def human() -> None:
        for key in ("key", "job_id", "task_id", "type", "queue", "attempt", "content_type",
                    "error_code", "error_type", "error_message", "death_reason"):
            click.echo(f"{key}: {data[key] if data[key] is not None else '-'}")
        if data["why"]:
            click.echo(f"why: {data['why']}")
        if data["earlier_error"]:
            earlier = data["earlier_error"]
            click.echo(f"earlier error: {earlier['code']}  {earlier['message'] or ''}".rstrip())
        for problem in data["problems"]:
            click.echo(f"not a job: {problem}")
        click.echo("headers:")
        for key, value in sorted(data["headers"].items()):
            click.echo(f"  {key}: {value}")
        if data["envelope"] is not None:
            click.echo("envelope:")
            click.echo(json.dumps(data["envelope"], indent=2, default=str, ensure_ascii=False))
        elif "body" in data:
            click.echo("body (not a JSON object the tools show):")
            click.echo(data["body"])
        else:
            click.echo("body (not UTF-8; base64):")
            click.echo(data["body_base64"])

    emit(ctx, data, human)


def _target(dead_letters: DeadLetterQueue) -> str:
    if dead_letters.unroutable:
        return "their own job queues"
    return dead_letters.names.job_queue(dead_letters.queue)


def _one_or_all(ident: str | None, every: bool) -> None:
    if bool(ident) == every:
        raise click.UsageError("give ID or --all")


@dlq.command()
@queue_option
@click.argument("ident", metavar="[ID]", required=False)
@legacy_id_option
@click.option("--all", "every", is_flag=True, help="Replay every dead letter present now.")
@click.option("--yes", "-y", is_flag=True, expose_value=False,
              help="Accepted and ignored: replay never asks (it loses nothing), and scripts "
                   "pass the same flags to replay and purge.")
@common_options
@click.pass_context
def replay(ctx: click.Context, queue: str, ident: str | None, legacy_id: str | None,
           every: bool) -> None:
    """Put the dead letter ID (or --all) back on QUEUE (same id, attempt 1, error
    history kept; a dead letter that is no job goes back as it came).

    ID is its OJS job id, the caller's Celery task id, or the key ``dlq list`` shows.

    Each job is republished and confirmed before its dead letter is removed, a
    window of up to 500 jobs at a time: Ctrl-C stops between windows and loses
    nothing (exit 130); run it again to go on.
    """
    ident = _ident(ctx, ident, legacy_id)
    _one_or_all(ident, every)
    with open_dlq(ctx, queue) as dead_letters:
        if ident:
            key = dead_letters.replay(ident)
            emit(ctx, {"queue": dead_letters.queue, "replayed": [key]},
                 f"replayed {key} to {_target(dead_letters)}")
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
@click.argument("ident", metavar="[ID]", required=False)
@legacy_id_option
@click.option("--all", "every", is_flag=True, help="Delete every dead letter (the default).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@common_options
@click.pass_context
def purge(ctx: click.Context, queue: str, ident: str | None, legacy_id: str | None,
          every: bool, yes: bool) -> None:
    """Delete the dead letter ID, or all of QUEUE's, for good (asks first unless --yes).

    ID is its OJS job id, the caller's Celery task id, or the key ``dlq list`` shows."""
    ident = _ident(ctx, ident, legacy_id)
    if ident and every:
        raise click.UsageError("give ID or --all, not both")
    with open_dlq(ctx, queue) as dead_letters:
        what = f"dead letter {ident}" if ident else f"all {len(dead_letters)} dead letter(s)"
        if not yes:
            click.confirm(f"Delete {what} of {dead_letters.dlq}?", abort=True, err=True)
        if ident:
            dead_letters.delete(ident)
            count = 1
        else:
            count = dead_letters.purge()
    emit(ctx, {"queue": dead_letters.queue, "deleted": count},
         f"deleted {count} dead letter(s) from {dead_letters.dlq}")
