"""``ojs-kombu conformance --queue Q``: a live broker and app against AMQP-001..032.

Declarations of ``Q`` are checked read-only (see :mod:`.broker`); the publish
path with probe jobs on a probe queue of its own (:mod:`.conformance_probes`);
what the running workers of ``Q`` do on the wire (INFO here; discard, CANCEL,
BEAT, recovery, and the producer's reconnects and threads in
:mod:`.conformance_worker`).  The verdicts and the table are
:mod:`.conformance_report`.
"""

from __future__ import annotations

from typing import Any

import click
import kombu

from ..amqp.binding import Binding
from ..amqp.broker.control import ControlClient
from ..spec.errors import ControlError
from ..spec.job_ids import new_job_id
from .broker import binding_of, connect, queue_name
from .common import EXIT_NOT_FOUND, CLIError, OJSCommand, common_options, emit
from .common import options as cli_options
from .conformance_probes import check_probes
from .conformance_report import (
    Check,
    Results,
    exit_code,
    render_table,
    terminal_width,
)
from .conformance_worker import (
    check_producer_behaviour,
    check_worker_behaviour,
    missing_probes,
)
from .topology import inspect_topology


def check_declarations(results: Results, amqp_connection: Any, binding: Binding,
                       queue: str) -> dict[str, Any]:
    """AMQP-001..004, 019 (existence), 030..032 on ``queue`` as the broker holds it."""
    names = binding.names
    topo = inspect_topology(amqp_connection, binding, queue)
    exchanges = {e["name"]: e for e in topo["exchanges"]}
    queues = {q["role"]: q for q in topo["queues"]}
    for check_id, name in (("AMQP-001", names.direct_exchange), ("AMQP-002", names.dlx_exchange)):
        found = exchanges[name]
        if not found["exists"]:
            results.set(check_id, "fail", f"{name} does not exist")
        elif found["differences"]:
            results.set(check_id, "fail", f"{name}: {_describe(found['differences'])}")
        else:
            results.set(check_id, "pass", f"{name}: re-declaration as durable direct accepted")
    job = queues["job"]
    if not job["exists"]:
        raise CLIError(f"unknown queue: {names.job_queue(queue)} does not exist", EXIT_NOT_FOUND,
                       "not_found")
    differences = job["differences"]
    properties = {k: v for k, v in differences.items() if not k.startswith("x-")}
    if properties:
        results.set("AMQP-003", "fail", f"{job['name']}: {_describe(properties)}")
        results.set("AMQP-004", "fail", "arguments not comparable: AMQP-003 failed first")
    else:
        results.set("AMQP-003", "pass", f"{job['name']}: re-declaration as durable, "
                    "non-exclusive, non-auto-delete accepted")
        arguments = job["arguments"]
        dlx, key = arguments.get("x-dead-letter-exchange"), arguments.get(
            "x-dead-letter-routing-key")
        if dlx != names.dlx_exchange:
            results.set("AMQP-004", "fail",
                        f"{job['name']} has x-dead-letter-exchange {dlx!r}, not "
                        f"{names.dlx_exchange!r}: failed jobs nacked by a consumer are dropped")
        elif key != queue:
            results.set("AMQP-004", "fail", f"{job['name']} has x-dead-letter-routing-key "
                        f"{key!r}, not {queue!r}: dead letters miss ojs.queue.dlx.{queue}")
        elif not queues["dead letters"]["exists"]:
            results.set("AMQP-004", "fail", f"{names.dead_letter_queue(queue)} does not exist")
        else:
            results.set("AMQP-004", "pass", f"x-dead-letter-exchange={dlx}, "
                        f"x-dead-letter-routing-key={key}; {names.dead_letter_queue(queue)} "
                        "exists")
        queue_type = arguments.get("x-queue-type", "classic")
        if "x-max-priority" in arguments:
            results.set("AMQP-030", "pass", f"x-max-priority={arguments['x-max-priority']}")
        elif queue_type == "quorum":
            results.set("AMQP-030", "n/a", "quorum queues have no x-max-priority")
        else:
            results.set("AMQP-030", "warn", f"{job['name']} has no x-max-priority: the app "
                        "asks for no priority queue (task_queue_max_priority, or "
                        f"ojs_queues={{{queue!r}: {{'priority': 10}}}})")
        if queue_type == "quorum":
            results.set("AMQP-032", "pass", "x-queue-type=quorum")
        else:
            results.set("AMQP-032", "warn", f"{job['name']} is a {queue_type} queue; set "
                        "ojs_queue_defaults={'type': 'quorum'} (or ojs_queues="
                        f"{{{queue!r}: {{'type': 'quorum'}}}})")
    missing = [q["name"] for q in topo["queues"] if not q["exists"]] + [
        e["name"] for e in topo["exchanges"] if not e["exists"]]
    if missing:
        results.set("AMQP-031", "fail", f"missing: {', '.join(missing)}")
    else:
        results.set("AMQP-031", "pass", f"{names.direct_exchange}, {names.dlx_exchange}, "
                    f"{names.job_queue(queue)}, {names.dead_letter_queue(queue)}, "
                    f"{names.control_queue(queue)}")
    return queues["control"]


def _describe(differences: dict[str, dict[str, Any]]) -> str:
    return "; ".join(f"{k} is {d['current']!r}, expected {d['expected']!r}"
                     for k, d in differences.items())


#: What needs a running worker of the queue.
WORKER_CHECKS = ("AMQP-009", "AMQP-019", "AMQP-020", "AMQP-021", "AMQP-026", "AMQP-027")


def check_control_plane(results: Results, control: dict[str, Any], queue: str,
                        connection: kombu.Connection, info_timeout: float) -> bool:
    """AMQP-021 against the running workers of ``queue``; ``False`` (and every check
    that needs a worker failed, with why) when none runs."""
    if not control["exists"] or not control["consumers"]:
        reason = (f"{control['name']} does not exist" if not control["exists"] else
                  f"no worker consumes {control['name']}: start a worker for {queue!r} "
                  "(with ojs_control_queues on) of an app with "
                  "ojs_kombu.register_conformance_probes(app), e.g. examples/proj")
        for check_id in WORKER_CHECKS:
            results.set(check_id, "fail", reason)
        return False

    class _Source:  # ControlClient takes an app; give it a connection like ours
        def connection_for_write(self) -> kombu.Connection:
            return connection.clone()

    unknown = new_job_id()
    try:
        with ControlClient(_Source()) as client:
            answer = client.info(unknown, queue, timeout=info_timeout)
    except ControlError as exc:
        results.set("AMQP-021", "fail", str(exc))
        return True
    # "unknown": the worker's app has no result backend to rule the job out
    if answer.get("state") in ("not_found", "unknown") \
            and answer.get("job_id", unknown) == unknown:
        results.set("AMQP-021", "pass", "a worker answered INFO (reply_to, correlation_id) "
                    f"for an unknown job: {answer['state']}")
    else:
        results.set("AMQP-021", "fail", f"unexpected INFO answer {answer!r}")
    return True


def run_checks(connection: kombu.Connection, queue: str, info_timeout: float = 5.0,
               schedule: bool = False, job_timeout: float = 70.0, recovery: bool = False,
               metrics_url: str | None = None, app: Any = None) -> list[Check]:
    """Every AMQP-001..032 check against the broker of ``connection`` and ``queue``;
    ``app`` (``-A``): its workers' checks are not run when it has no probe tasks."""
    amqp_connection = connection.connection
    binding = binding_of(connection)
    results = Results()
    control = check_declarations(results, amqp_connection, binding, queue)
    worker = check_control_plane(results, control, queue, connection, info_timeout)
    check_probes(results, amqp_connection, binding, schedule)
    if worker:
        check_worker_behaviour(results, connection, binding, queue, job_timeout, recovery,
                               missing_probes(app, queue))
    check_producer_behaviour(results, connection, binding, metrics_url)
    return results.ordered()


@click.command(cls=OJSCommand)
@click.option("--queue", "-q", required=True, help="OJS queue whose setup and workers to check.")
@click.option("--info-timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="Seconds to wait for a worker's INFO answer.")
@click.option("--schedule", is_flag=True,
              help="Declare the scheduling ladder if missing, to probe AMQP-022.")
@click.option("--job-timeout", type=click.FloatRange(min=1), default=70.0, show_default=True,
              help="Seconds to wait for a worker to run a probe job, and for its BEAT.")
@click.option("--recovery", is_flag=True,
              help="Delete QUEUE's control queue and watch its workers declare it again and "
                   "consume it, on the same connection (AMQP-026/027; each logs a warning).")
@click.option("--metrics-url", help="A worker's Prometheus endpoint, to read AMQP-024 back.")
@common_options
@click.pass_context
def conformance(ctx: click.Context, queue: str, info_timeout: float, schedule: bool,
                job_timeout: float, recovery: bool, metrics_url: str | None) -> None:
    """Check a live broker and the workers of QUEUE against AMQP-001..032.

    QUEUE's exchanges, queues and arguments are checked read-only; probe jobs
    go to a probe queue of their own (published through ojs_kombu, fetched with
    Basic.Get or a consumer, retried, scheduled) and are deleted afterwards.  The
    workers' behaviour is watched with two probe job types sent to QUEUE, which a
    worker of QUEUE must run: conformance.fail (dead-lettered by the worker) and
    conformance.sleep (INFO, BEAT, CANCEL), which
    ojs_kombu.register_conformance_probes(app) registers (examples/proj does).  With
    no worker consuming QUEUE those checks fail and say so; when the -A app (or, on
    the wire, the worker) has no probes they are n/a, say what to add, and leave
    nothing in QUEUE's dead-letter queue.  Reconnects (through
    a local proxy) and concurrent publishing are ojs_kombu's own, in this
    process.
    Prints pass / fail / warn (a SHOULD not met) / n/a with a reason for each
    id.  Exit 1 if any check fails, 4 if QUEUE does not exist.
    """
    ojs_queue = queue_name(queue)
    with connect(cli_options(ctx)) as connection:
        checks = run_checks(connection, ojs_queue, info_timeout, schedule, job_timeout,
                            recovery, metrics_url, cli_options(ctx).app())
    code = exit_code(checks)
    emit(ctx, {"queue": ojs_queue, "ok": code == 0, "checks": [c.to_dict() for c in checks]},
         lambda: click.echo(f"conformance of queue {ojs_queue} (OJS AMQP binding "
                            f"1.0.0-rc.1)\n" + render_table(checks, terminal_width())))
    ctx.exit(code)
