"""``ojs-kombu migrate check -A proj``: can this Celery app switch to ojs_kombu?

:func:`build_report` reads an app (before or after ``ojs_kombu.install``) and
lists, per task, the OJS type and retry policy it will get, and every finding
in the app's configuration: *blockers* (the worker would refuse to start or a
publish would raise), *warnings* (it works, but behaves differently) and
*info*.  Pure: it never connects to the broker.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import click

from ..envelope import RetryPolicy
from ..errors import JobTypeError, OJSConfigurationError
from ..job_types import JobTypeRegistry
from ..naming import DEFAULT_QUEUE_ALIASES, TopologyNames
from ..settings import OJSSettings
from .common import EXIT_FAILED, EXIT_USAGE, CLIError, OJSGroup, emit, options

Level = Literal["blocker", "warning", "info"]
JSON_SERIALIZERS = ("json", "application/json")
#: Green pools: supported, with Celery's event dispatcher off (see README, Worker pools).
GREEN_POOLS = ("gevent", "eventlet")
#: Task options that exist in Celery and have no OJS attribute.
CELERY_ONLY_OPTIONS = {
    "rate_limit": "a Celery worker-side rate limit; OJS has no equivalent attribute (it "
                  "keeps working under ojs_kombu, for Celery workers only)",
    "soft_time_limit": "only the hard time_limit maps onto the OJS timeout; the soft limit "
                       "stays a Celery-only signal",
    "reject_on_worker_lost": "under ojs_kombu a job whose worker died is redelivered by the "
                             "broker (it was never acked) regardless of this option",
    "store_errors_even_if_ignored": "result backend behaviour; not part of the OJS job",
}


@dataclass
class Finding:
    level: Level
    subject: str
    message: str


@dataclass
class TaskReport:
    name: str
    job_type: str | None
    source: str
    max_attempts: int | None = None
    builtin: bool = False
    #: whose rules decide its retries under the app's ``ojs_retry_semantics``:
    #: ``"celery"`` (as plain Celery) or ``"ojs"`` (every failure is a failed attempt)
    retry_semantics: str | None = None


@dataclass
class MigrationReport:
    app: str
    tasks: list[TaskReport] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    @property
    def blockers(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "blocker"]

    def add(self, level: Level, subject: str, message: str) -> None:
        self.findings.append(Finding(level, subject, message))

    def to_dict(self) -> dict[str, Any]:
        return {"app": self.app, "ok": not self.blockers, "tasks": [asdict(t) for t in self.tasks],
                "findings": [asdict(f) for f in self.findings],
                "blockers": len(self.blockers)}


def _ojs_settings(conf: Mapping[str, Any], report: MigrationReport) -> OJSSettings | None:
    try:
        return OJSSettings.from_options(conf, source="Celery config (app.conf)")
    except OJSConfigurationError as exc:
        report.add("blocker", "config", str(exc))
        return None


def build_report(app: Any) -> MigrationReport:
    """Everything that blocks or changes when ``app`` runs under ojs_kombu."""
    app.finalize(auto=True)
    conf = app.conf
    report = MigrationReport(app=str(app.main))
    settings = _ojs_settings(conf, report) or OJSSettings()
    aliases = {**DEFAULT_QUEUE_ALIASES, **settings.queue_aliases}
    _check_tasks(app, settings, report)
    _check_serializers(conf, report)
    _check_queues(conf, app.tasks, aliases, settings.prefix, report)
    _check_worker(conf, report)
    return report


def _check_tasks(app: Any, settings: OJSSettings, report: MigrationReport) -> None:
    from ..worker import task_retry_policy

    registry = JobTypeRegistry(settings.job_types, lambda: app.tasks)
    claimed: dict[str, str] = {}
    semantics = settings.retry_semantics
    changed: list[str] = []  # tasks whose retries differ between the two semantics
    for name in sorted(app.tasks):
        task = app.tasks[name]
        builtin = name.startswith("celery.")
        source = ("ojs_job_types" if name in settings.job_types else
                  "ojs_type option" if getattr(task, "ojs_type", None) else "task name")
        try:
            job_type: str | None = registry.type_for(name)
        except JobTypeError as exc:
            job_type, source = None, "needs a mapping"
            report.add("blocker", f"task {name}",
                       f"{exc.reason if hasattr(exc, 'reason') else exc}; add "
                       f"app.conf.ojs_job_types = {{{name!r}: '{_suggest(name)}'}} or "
                       f"@app.task(ojs_type='{_suggest(name)}')")
        attempts = None
        policy = None
        try:
            policy = task_retry_policy(task, semantics)
            attempts = policy.max_attempts
        except OJSConfigurationError as exc:
            report.add("blocker", f"task {name}", str(exc))
        own_policy = getattr(task, "ojs_retry", None) is not None
        report.tasks.append(TaskReport(name, job_type, source, attempts, builtin,
                                       "ojs" if own_policy else semantics))
        if job_type is not None:
            other = claimed.setdefault(job_type, name)
            if other != name:
                report.add("blocker", f"task {name}",
                           f"OJS type {job_type!r} is also the type of task {other!r}; a "
                           "consumed job must map to exactly one task: map one of them "
                           "with ojs_job_types")
        if builtin:
            continue
        _check_task_options(app, name, task, report)
        if not own_policy:
            changed.append(name)
        if policy is not None and (own_policy or semantics == "ojs"):
            report.add("warning", f"task {name}", _retry_change(task, policy, own_policy))
    _report_semantics(semantics, changed, report)


def _retry_change(task: Any, policy: RetryPolicy, own_policy: bool) -> str:
    """How a task that follows OJS retry semantics is retried unlike under plain Celery."""
    from ..worker import UNBOUNDED_ATTEMPTS

    attempts = ("unbounded attempts" if policy.max_attempts >= UNBOUNDED_ATTEMPTS
                else f"max_attempts {policy.max_attempts}")
    delays = (f"delays: initial_interval {policy.initial_interval}, coefficient "
              f"{policy.backoff_coefficient:g}, max_interval {policy.max_interval}, jitter "
              f"{'on' if policy.jitter else 'off'}")
    why = ("ojs_retry: this task follows OJS retry semantics" if own_policy else
           "ojs_retry_semantics='ojs'")
    if not getattr(task, "autoretry_for", None):
        return (f"{why}: every failure, hard time limits and lost pool processes included, "
                f"is retried by the broker ({attempts}; {delays}); plain Celery does not "
                "retry this task (it has no autoretry_for; only self.retry() retries it)")
    return (f"{why}: the autoretry_for exceptions, and also hard time limits and lost pool "
            f"processes, are retried by the broker ({attempts}; {delays}); plain Celery "
            "retries only the autoretry_for exceptions, after its own countdown "
            "(retry_backoff or default_retry_delay)")


def _report_semantics(semantics: str, changed: list[str], report: MigrationReport) -> None:
    if semantics == "celery":
        names = ", ".join(changed) if changed else "(none)"
        report.add("info", "ojs_retry_semantics",
                   "'celery' (the default): every task without ojs_retry is retried exactly "
                   "where plain Celery retries it (autoretry_for, self.retry() within "
                   "max_retries, Celery's delays): nothing changes versus plain Celery. "
                   "ojs_retry_semantics='ojs' would change the retries of: " + names)
    else:
        report.add("info", "ojs_retry_semantics",
                   "'ojs': every task failure is a failed OJS attempt, retried under the "
                   "task's OJS policy; the default 'celery' keeps Celery's retry behaviour "
                   "(the warnings above name every task whose retries change)")


def _suggest(name: str) -> str:
    """A valid OJS type close to ``name`` (``proj.tasks.SendEmail``: ``proj.tasks.send_email``)."""
    import re

    parts = []
    for part in re.split(r"[.:/]+", name):
        snake = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", part).lower()
        snake = re.sub(r"[^a-z0-9_]", "_", snake).strip("_")
        if snake and not snake[0].isalpha():
            snake = "t_" + snake
        if snake:
            parts.append(snake)
    return ".".join(parts) or "task"


#: Task options and the app settings they default from.
_OPTION_SETTINGS = {
    "acks_late": "task_acks_late",
    "acks_on_failure_or_timeout": "task_acks_on_failure_or_timeout",
    "acks_on_failure": "task_acks_on_failure",
    "acks_on_timeout": "task_acks_on_timeout",
    "serializer": "task_serializer",
    "compression": "task_compression",
    "rate_limit": "task_default_rate_limit",
    "soft_time_limit": "task_soft_time_limit",
    "reject_on_worker_lost": "task_reject_on_worker_lost",
    "store_errors_even_if_ignored": "task_store_errors_even_if_ignored",
}


def _task_option_set(app: Any, task: Any, option: str) -> bool:
    """Whether the task itself sets ``option``.  Celery copies the app's settings into
    every task class, so "set" means: different from the setting it defaults from (or
    from Celery's own default when there is no such setting)."""
    from celery.app.task import Task

    value = getattr(task, option, None)
    setting = _OPTION_SETTINGS.get(option)
    if setting is not None and setting in app.conf:
        default = app.conf[setting]
        if default is None and option in ("acks_on_failure", "acks_on_timeout"):
            default = app.conf.get("task_acks_on_failure_or_timeout")  # Celery's fallback
        return bool(value != default)
    return bool(value != getattr(Task, option, None))


def _check_task_options(app: Any, name: str, task: Any, report: MigrationReport) -> None:
    def task_sets(task: Any, option: str) -> bool:
        return _task_option_set(app, task, option)

    subject = f"task {name}"
    if getattr(task, "acks_late", None) is False and task_sets(task, "acks_late"):
        report.add("blocker", subject, "acks_late=False: an OJS job is acked only after it "
                   "ran; the worker refuses to start (remove the option)")
    for option in ("acks_on_failure_or_timeout", "acks_on_failure", "acks_on_timeout"):
        if getattr(task, option, None) is True and task_sets(task, option):
            report.add("blocker", subject, f"{option}=True would ack and drop failed jobs; "
                       "the worker refuses to start (remove the option)")
    serializer = getattr(task, "serializer", None)
    if task_sets(task, "serializer") and serializer not in JSON_SERIALIZERS:
        report.add("blocker", subject, f"serializer={serializer!r}: OJS jobs are JSON; "
                   "publishing raises UnsupportedSerializerError")
    if task_sets(task, "compression") and getattr(task, "compression", None):
        report.add("blocker", subject, "compression: OJS bodies are plain JSON; publishing "
                   "raises UnsupportedSerializerError")
    for option, why in CELERY_ONLY_OPTIONS.items():
        if task_sets(task, option) and getattr(task, option, None):
            report.add("info", subject, f"{option}: {why}")


def _serializer_names(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value or ()]


def _check_serializers(conf: Mapping[str, Any], report: MigrationReport) -> None:
    task_serializer = conf.get("task_serializer")
    if task_serializer not in JSON_SERIALIZERS:
        report.add("blocker", "task_serializer",
                   f"{task_serializer!r}: OJS jobs are JSON; every publish would raise "
                   "UnsupportedSerializerError (set task_serializer='json')")
    if conf.get("task_compression"):
        report.add("blocker", "task_compression",
                   f"{conf.get('task_compression')!r}: OJS bodies are plain JSON")
    if conf.get("task_protocol", 2) != 2:
        report.add("blocker", "task_protocol",
                   "ojs_kombu maps Celery's task protocol 2; remove task_protocol=1")
    for setting in ("accept_content", "result_accept_content"):
        accept = _serializer_names(conf.get(setting))
        for unsafe in ("pickle", "application/x-python-serialize"):
            if unsafe in accept:
                report.add("blocker", setting,
                           f"{unsafe!r} is accepted: ojs_kombu.install() removes pickle (a "
                           "pickled message runs code in the worker), and a worker whose app "
                           "sets it again does not start; remove it, and make sure nothing "
                           "the app reads (results, remote control) is pickled")
        for unsafe in ("yaml", "msgpack"):
            if unsafe in accept:
                report.add("warning", setting,
                           f"{unsafe!r} is accepted: OJS job queues carry JSON only (the "
                           "worker dead-letters anything else), so it only matters for "
                           "non-job messages")
    result_serializer = conf.get("result_serializer")
    if result_serializer == "pickle":
        report.add("blocker", "result_serializer",
                   "'pickle': ojs_kombu.install() writes results as JSON instead (nothing is "
                   "unpickled), so results JSON cannot carry would fail; set 'json'")
    elif result_serializer not in JSON_SERIALIZERS:
        report.add("warning", "result_serializer",
                   f"{result_serializer!r}: results are not part of the OJS job, but other "
                   "OJS consumers cannot read non-JSON results; prefer 'json'")
    if conf.get("event_serializer") == "pickle":
        report.add("warning", "event_serializer",
                   "'pickle': ojs_kombu.install() sends Celery's monitoring events as JSON "
                   "instead (their readers accept JSON)")
    elif conf.get("event_serializer") not in (*JSON_SERIALIZERS, None):
        report.add("info", "event_serializer",
                   f"{conf.get('event_serializer')!r}: Celery monitoring events are not OJS "
                   "events and pass through untouched")


def _check_queues(conf: Mapping[str, Any], tasks: Mapping[str, Any], aliases: dict[str, str],
                  prefix: str, report: MigrationReport) -> None:
    try:
        names = TopologyNames(prefix=prefix, queue_aliases=aliases)
    except OJSConfigurationError as exc:
        report.add("blocker", "ojs_queue_aliases", str(exc))
        return
    queues: dict[str, str] = {conf.get("task_default_queue") or "celery": "task_default_queue"}
    for queue in conf.get("task_queues") or ():
        queues.setdefault(queue.name, "task_queues")
        if not queue.durable or queue.auto_delete or queue.exclusive:
            report.add("blocker", f"queue {queue.name}", "OJS job queues are durable, not "
                       "exclusive and not auto-delete (AMQP-003)")
        exchange = getattr(queue.exchange, "name", None)
        if exchange and exchange != conf.get("task_default_exchange", "celery") \
                and queue.routing_key not in (None, "", queue.name):
            report.add("warning", f"queue {queue.name}", f"bound to exchange {exchange!r} "
                       f"with key {queue.routing_key!r}; under ojs_kombu every job queue is "
                       "bound to ojs.exchange.direct with its own name")
    for name, task in tasks.items():
        queue = getattr(task, "queue", None)
        if queue:
            queues.setdefault(queue, f"task {name}")
    routes = conf.get("task_routes")
    for route in routes if isinstance(routes, (list, tuple)) else [routes]:
        if not isinstance(route, Mapping):
            continue
        for pattern, target in route.items():
            if isinstance(target, Mapping):
                if target.get("queue"):
                    queues.setdefault(str(target["queue"]), f"task_routes[{pattern!r}]")
                if target.get("exchange") or target.get("routing_key"):
                    report.add("blocker", f"task_routes[{pattern!r}]",
                               "routes by exchange/routing_key; OJS jobs go through "
                               "ojs.exchange.direct with the queue name as routing key "
                               "(publishing raises JobRoutingError): route with queue=...")
            elif isinstance(target, str):
                queues.setdefault(target, f"task_routes[{pattern!r}]")
    for queue, where in sorted(queues.items()):
        try:
            ojs_name = names.ojs_queue(queue)
        except OJSConfigurationError as exc:
            report.add("blocker", f"queue {queue}", f"({where}) {exc}")
            continue
        if ojs_name != queue:
            report.add("info", f"queue {queue}", f"is OJS queue {ojs_name!r} "
                       f"(AMQP {names.job_queue(ojs_name)})")


def _check_worker(conf: Mapping[str, Any], report: MigrationReport) -> None:
    pool = str(conf.get("worker_pool") or "prefork")
    if pool.split(":")[-1].lower() in GREEN_POOLS:
        report.add("info", "worker_pool", f"{pool!r}: start workers with --without-heartbeat "
                   "--without-gossip and without -E (Celery's loop for green pools waits "
                   "on the event connection after every message otherwise)"
                   + ("; eventlet is deprecated upstream" if "eventlet" in pool else ""))
    broker = str(conf.get("broker_url") or "")
    scheme = broker.partition("://")[0] if "://" in broker else ""
    if scheme not in ("ojs", "ojss"):
        report.add("info", "broker_url", f"scheme {scheme or '(default)'!r}: switch to ojs:// "
                   "(ojss:// for TLS) and call ojs_kombu.install(app)")
    if conf.get("task_acks_late") is False or conf.get("task_acks_on_failure_or_timeout"):
        report.add("info", "task_acks_late", "install() sets task_acks_late=True and "
                   "task_acks_on_failure_or_timeout=False (jobs are acked after they ran)")
    backend = str(conf.get("result_backend") or "")
    if backend:
        report.add("info", "result_backend", f"{backend.partition('://')[0]}:// keeps working "
                   "(results are not OJS jobs); task ids become UUIDv7, so AsyncResult.id is "
                   "the OJS job id")


def render_report(report: MigrationReport) -> str:
    """The report as text: one line per task, then the findings, blockers first."""
    lines = [f"app {report.app}: {len(report.tasks)} task(s)"]
    width = max((len(t.name) for t in report.tasks), default=4)
    for task in report.tasks:
        if task.builtin:
            continue
        job_type = task.job_type or "-- NEEDS A MAPPING --"
        attempts = "" if task.max_attempts is None else (
            f"  max_attempts {task.max_attempts} ({task.retry_semantics} retries)")
        lines.append(f"  {task.name:<{width}}  -> {job_type}  ({task.source}){attempts}")
    builtin = sum(t.builtin for t in report.tasks)
    if builtin:
        lines.append(f"  (+ {builtin} Celery built-in task(s), all mappable)"
                     if all(t.job_type for t in report.tasks if t.builtin)
                     else f"  (+ {builtin} Celery built-in task(s))")
    order = {"blocker": 0, "warning": 1, "info": 2}
    for finding in sorted(report.findings, key=lambda f: order[f.level]):
        lines.append(f"{finding.level.upper():<8} {finding.subject}: {finding.message}")
    lines.append(f"{len(report.blockers)} blocker(s): " + (
        "fix them before switching" if report.blockers else "nothing blocks the switch"))
    return "\n".join(lines)


def load_app(spec: str, workdir: str | None = None) -> Any:
    """Import a Celery app the way ``celery -A`` does (the current directory is importable)."""
    from celery.app.utils import find_app

    directory = os.path.abspath(workdir or os.getcwd())
    if directory not in sys.path:
        sys.path.insert(0, directory)
    try:
        return find_app(spec)
    except Exception as exc:  # an app that fails to import is a usage error, said plainly
        raise CLIError(f"cannot load the Celery app {spec!r}: {type(exc).__name__}: {exc}",
                       EXIT_USAGE, "invalid_input") from None


@click.group(cls=OJSGroup)
def migrate() -> None:
    """Check a Celery app before switching it to ojs_kombu."""


@migrate.command()
@click.option("-A", "--app", "app_spec", required=True, metavar="APP",
              help="The Celery app, as for celery -A (proj, proj.celery:app).")
@click.option("--workdir", type=click.Path(file_okay=False, exists=True),
              help="Directory to import the app from (default: the current one).")
@click.option("--json", "json_output", is_flag=True, help="Machine-readable JSON on stdout.")
@click.pass_context
def check(ctx: click.Context, app_spec: str, workdir: str | None, json_output: bool) -> None:
    """Report what the app's tasks become under ojs_kombu and what blocks the switch.

    Per task: the OJS type it will get (and from where), its OJS max_attempts
    and whose retry rules it follows (ojs_retry_semantics).  Then blockers
    (exit 1), warnings and info: task names that need an explicit mapping,
    non-JSON serializers, pickle in accept_content, compression, exchange routes,
    queue names, unsupported
    pools, ack options, options with no OJS meaning, and every task whose retry
    behaviour changes versus plain Celery.
    Does not connect to the broker.
    """
    options(ctx).json = json_output
    report = build_report(load_app(app_spec, workdir))
    emit(ctx, report.to_dict(), render_report(report))
    if report.blockers:
        ctx.exit(EXIT_FAILED)
