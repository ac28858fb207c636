"""``ojs-kombu enqueue``, ``cancel`` and ``info``: one job from the shell."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import click

from ..amqp.binding import Binding
from ..amqp.broker.control import ControlClient
from ..amqp.job_channel import JobChannel, JobConnection
from ..events.tracing import with_current_trace
from ..spec.encode import OutgoingJob, build_job
from ..spec.job_ids import new_job_id
from ..spec.job_options import time_option
from ..spec.naming import is_job_id, is_job_type
from ..spec.times import format_time
from .broker import binding_of, connect, queue_name, require_queue
from .common import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    OJSCommand,
    check_job_id,
    common_options,
    emit,
    fail,
    options,
)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json(value: str, what: str, kind: type) -> Any:
    """``value`` as strict JSON of type ``kind``; a usage error (exit 2) naming ``what``."""
    try:
        parsed = json.loads(value, parse_constant=_reject_constant)
    except ValueError as exc:
        raise click.BadParameter(f"{value!r} is not valid JSON ({exc})", param_hint=what
                                 ) from None
    if not isinstance(parsed, kind):
        expected = "a JSON array" if kind is list else "a JSON object"
        raise click.BadParameter(f"must be {expected}, got {value!r}", param_hint=what)
    return parsed


def build_cli_job(binding: Binding, job_type: str, job_id: str, queue: str,
                  args: list[Any], *, eta: datetime | None, priority: int | None,
                  meta: dict[str, Any] | None, retry: dict[str, Any] | None,
                  traceparent: str | None = None) -> OutgoingJob:
    """The job, written by the encoder every publish uses (the same envelope, properties
    and ``x-ojs-*`` headers, type and size checks), for :meth:`JobChannel.publish_job`."""
    now = datetime.now(UTC)
    trace = {"traceparent": traceparent} if traceparent else with_current_trace({})
    return build_job(
        job_id=job_id, job_type=job_type, queue=queue, args=args, task_name=job_type,
        now=now, created=format_time(now), meta=meta,
        traceparent=trace.get("traceparent"), tracestate=trace.get("tracestate"),
        priority=priority, retry_policy=None, per_call_retry=retry, scheduled_at=eta,
        max_job_bytes=binding.settings.max_job_bytes,
    )


def publish_cli_job(amqp_connection: JobConnection, job: OutgoingJob) -> None:
    """Publish ``job`` on a channel of its own, confirmed (the queue's topology declared
    if needed), and close the channel."""
    channel = amqp_connection.channel()
    try:
        job_channel: JobChannel = channel
        job_channel.publish_job(job)
    finally:
        if channel.is_open:
            channel.close()


@click.command(cls=OJSCommand)
@click.argument("job_type", metavar="TYPE")
@click.argument("args", required=False, default="[]", metavar="[ARGS]")
@click.option("--queue", "-q", default="default", show_default=True, help="OJS queue.")
@click.option("--delay", type=click.FloatRange(min=0), metavar="SECONDS",
              help="Run no earlier than SECONDS from now (the broker holds it).")
@click.option("--scheduled-at", metavar="TIMESTAMP",
              help="Run no earlier than this RFC 3339 time (naive means UTC).")
@click.option("--priority", type=int, help="OJS priority (AMQP priority: clamp(p, 0, 9)).")
@click.option("--meta", metavar="JSON", help="The job's meta object.")
@click.option("--retry", metavar="JSON", help="Retry policy object (max_attempts, ...).")
@click.option("--id", "job_id", metavar="UUIDV7", help="Job id (default: a new UUIDv7).")
@common_options
@click.pass_context
def enqueue(ctx: click.Context, job_type: str, args: str, queue: str, delay: float | None,
            scheduled_at: str | None, priority: int | None, meta: str | None,
            retry: str | None, job_id: str | None) -> None:
    """Publish one OJS job of type TYPE with ARGS (a JSON array) and print its id.

    The job is published like any ojs_kombu job: to ojs.exchange.direct with
    mandatory=true, confirmed by the broker (the queue's topology is declared
    if needed).  Example: ojs-kombu enqueue email.send '["a@b.c", "welcome"]'
    --queue email --delay 60
    """
    job_args = parse_json(args, "ARGS", list)
    job_meta = parse_json(meta, "--meta", dict) if meta is not None else None
    job_retry = parse_json(retry, "--retry", dict) if retry is not None else None
    if delay is not None and scheduled_at is not None:
        raise click.UsageError("give --delay or --scheduled-at, not both")
    eta = None
    if delay:
        eta = datetime.now(UTC) + timedelta(seconds=delay)
    elif scheduled_at is not None:
        eta = time_option(scheduled_at, "--scheduled-at")
    job_id = job_id or new_job_id()
    if not is_job_id(job_id):
        raise click.BadParameter(f"{job_id!r} is not a lowercase UUIDv7", param_hint="--id")
    if not is_job_type(job_type):
        raise click.BadParameter(f"{job_type!r} is not an OJS job type (dot-separated segments "
                                 "of [a-z][a-z0-9_]*, at most 255 characters)",
                                 param_hint="TYPE")
    ojs_queue = queue_name(queue)
    with connect(options(ctx)) as connection:
        job = build_cli_job(binding_of(connection), job_type, job_id, ojs_queue, job_args,
                            eta=eta, priority=priority, meta=job_meta, retry=job_retry)
        publish_cli_job(connection.connection, job)
    result = {"id": job_id, "type": job_type, "queue": ojs_queue,
              "scheduled_at": format_time(eta) if eta else None, "priority": priority,
              "delay_ms": job.delay_ms}
    emit(ctx, result, job_id)


def _control_client(ctx: click.Context, queue: str) -> tuple[ControlClient, int]:
    """A control client, after checking that ``queue``'s control queue exists (else exit 4)."""
    opts = options(ctx)
    with connect(opts) as connection:
        names = binding_of(connection).names
        state = require_queue(connection.connection, names.control_queue(queue),
                              f"OJS queue {queue!r} has no control queue")
    return ControlClient(opts), state.consumers  # the same broker and settings


@click.command(cls=OJSCommand)
@click.argument("job_id", metavar="JOB_ID")
@click.option("--queue", "-q", required=True, help="OJS queue of the job.")
@click.option("--reason", help="Why (sent to the workers, logged, in job.cancelled).")
@click.option("--by", "cancelled_by", help="Who (e.g. user:ops).")
@click.option("--terminate", is_flag=True, help="Kill the pool process of a running job.")
@common_options
@click.pass_context
def cancel(ctx: click.Context, job_id: str, queue: str, reason: str | None,
           cancelled_by: str | None, terminate: bool) -> None:
    """Ask the workers of QUEUE to cancel JOB_ID (CANCEL, AMQP-019).

    JOB_ID is the job's OJS id or its Celery task id.

    The request is confirmed by the broker.  A job that has not started never
    starts; a running job is asked to stop.  Cancelling an unknown or finished
    job is a no-op the workers log.
    """
    job_id, ojs_queue = check_job_id(job_id, task_id=True), queue_name(queue)
    client, consumers = _control_client(ctx, ojs_queue)
    with client:
        client.cancel(job_id, ojs_queue, reason=reason, cancelled_by=cancelled_by,
                      terminate=terminate)
        control = client.binding.names.control_queue(ojs_queue)
    note = "" if consumers else (" (no worker consumes it now: it is handled when one starts)")
    emit(ctx, {"job_id": job_id, "queue": ojs_queue, "control_queue": control,
               "sent": True, "workers": consumers},
         f"cancel request for {job_id} sent to {control}{note}")


@click.command(cls=OJSCommand)
@click.argument("job_id", metavar="JOB_ID")
@click.option("--queue", "-q", required=True, help="OJS queue of the job.")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="Seconds to wait for a worker's answer (exit 5 after that).")
@common_options
@click.pass_context
def info(ctx: click.Context, job_id: str, queue: str, timeout: float) -> None:
    """Ask the workers of QUEUE for the state of JOB_ID (INFO, AMQP-021).

    JOB_ID is the job's OJS id or its Celery task id.

    Exit 4 when no worker and no result backend knows the job (state
    not_found, or unknown for an app without a result backend), 1 when the
    worker answered with an error, 5 when no worker answered in time.
    """
    job_id, ojs_queue = check_job_id(job_id, task_id=True), queue_name(queue)
    client, _ = _control_client(ctx, ojs_queue)
    with client:
        answer = client.info(job_id, ojs_queue, timeout=timeout)

    def human() -> None:
        click.echo(f"{job_id}: {answer.get('state')}")
        for key, value in answer.items():
            if key not in ("job_id", "state"):
                click.echo(f"  {key}: {json.dumps(value, default=str)}")

    emit(ctx, answer, human)
    state = answer.get("state")
    if state == "error":
        fail(ctx, f"a worker of queue {ojs_queue!r} could not answer INFO for {job_id}: "
                  f"{answer.get('error') or 'no reason given'}", EXIT_FAILED)
    if state in ("not_found", "unknown"):
        reason = answer.get("reason") or "no worker holds it or finished it recently, and " \
                                          "the result backend does not know it"
        fail(ctx, f"job {job_id} is {state.replace('_', ' ')} in queue {ojs_queue!r}: {reason}",
             EXIT_NOT_FOUND)
