"""``ojs-kombu migrate check -A proj``: can this Celery app switch to ojs_kombu?

:func:`build_report` loads the app as ``celery worker`` under
``ojs_kombu.install`` would: the ack settings ``install()`` sets, then the
app's default modules (``include=``, ``imports=``, ``autodiscover_tasks``),
then the tasks.  It lists, per task, the OJS type and retry policy it will
get, and every finding (see :mod:`.migrate_report`): *blockers* (the worker
would refuse to start, a publish would raise, or the app is not installed),
*warnings* (it works, but behaves differently: each difference from plain
Celery the app meets, :mod:`.migrate_differences`) and *info*.  It never
connects to the broker.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import click

from ..spec.envelope import RetryPolicy
from ..spec.errors import JobTypeError, OJSConfigurationError
from ..spec.job_types import JobTypeRegistry
from ..spec.naming import DEFAULT_QUEUE_ALIASES, TopologyNames
from ..spec.settings import OJSSettings
from .common import EXIT_FAILED, OJSGroup, emit, options, store_option
from .config import load_app
from .migrate_locks import lock_hint
from .migrate_report import (
    JSON_SERIALIZERS,
    MigrationReport,
    TaskReport,
    check_installed,
    check_queues,
    check_serializers,
    check_worker,
    render_report,
)

__all__ = ["MigrationReport", "build_report", "load_app", "migrate", "render_report"]

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


def _ojs_settings(conf: Mapping[str, Any], report: MigrationReport) -> OJSSettings | None:
    try:
        return OJSSettings.from_options(conf, source="Celery config (app.conf)")
    except OJSConfigurationError as exc:
        report.add("blocker", "config", str(exc))
        return None


#: What ``ojs_kombu.install()`` sets once the app is configured (acks after the job ran).
INSTALL_ACKS = {"task_acks_late": True, "task_acks_on_failure_or_timeout": False}


def _acks_as_installed(app: Any) -> tuple[dict[str, Any], bool]:
    """Give ``app`` the ack settings ``install()`` gives it, before any task is bound.

    Celery copies ``task_acks_late`` into every task without its own option
    when the task is bound, so a task's explicit ``acks_late=False`` (which
    the worker refuses) is told apart from the app's default only this way.
    Returns the settings as they were, and whether tasks get them (``False``
    for an app finalized before it was loaded here).
    """
    from ..celery.app import is_installed

    before: dict[str, Any] = {}
    if is_installed(app):
        return before, True
    if app.finalized:
        return before, False

    def as_installed(sender: Any, **_: Any) -> None:
        for key, value in INSTALL_ACKS.items():
            before[key] = sender.conf.get(key)
            sender.conf[key] = value

    if app.configured:
        as_installed(app)
    else:
        app.on_after_configure.connect(as_installed, sender=app, weak=False)
    return before, True


def _import_task_modules(app: Any, report: MigrationReport) -> None:
    """Import the app's default modules as ``celery worker`` does (``include=``,
    ``imports=``, and the packages given to ``autodiscover_tasks``)."""
    try:
        app.loader.import_default_modules()
    except Exception as exc:
        report.add("blocker", "task modules", f"importing them fails as it would in celery "
                   f"worker, which then does not start: {type(exc).__name__}: {exc}")
    report.modules = sorted(app.loader.task_modules)


def build_report(app: Any, scan_modules: Iterable[str] | None = None) -> MigrationReport:
    """Everything that blocks or changes when ``app`` runs under ojs_kombu.

    Loads the app's task modules and finalizes it, as a worker does.  The call sites
    read are those of the packages of ``scan_modules`` (default: the modules that
    hold the app and define its tasks).
    """
    from ..celery.app import is_installed

    report = MigrationReport(app=str(app.main))
    installed = is_installed(app)
    acks_before, exact_acks = _acks_as_installed(app)
    _import_task_modules(app, report)
    app.finalize()
    conf = app.conf
    settings = _ojs_settings(conf, report) or OJSSettings()
    aliases = {**DEFAULT_QUEUE_ALIASES, **settings.queue_aliases}
    _check_tasks(app, settings, report, exact_acks)
    if not any(not t.builtin for t in report.tasks):
        report.add("warning", "tasks", "the app has no tasks of its own after importing its "
                   "modules as celery worker does: list the modules that define them in "
                   "include=[...] or imports, or call app.autodiscover_tasks([...])")
    check_serializers(conf, report)
    check_queues(conf, app.tasks, aliases, settings.prefix, report)
    check_worker(conf, report, acks_before)
    check_installed(app, report)
    _report_differences(app, settings, report, installed, scan_modules)
    return report


def _report_differences(app: Any, settings: OJSSettings, report: MigrationReport,
                        installed: bool, scan_modules: Iterable[str] | None) -> None:
    """The differences from plain Celery the app meets, from its configuration, its
    tasks and the call sites of its own modules (read, not run)."""
    from .migrate_differences import AppFacts, report_differences
    from .migrate_scan import app_modules, scan_app

    scan = scan_app(app_modules(app, report.modules) if scan_modules is None
                    else scan_modules)
    report.scanned = scan.files
    try:
        names: TopologyNames | None = TopologyNames(
            prefix=settings.prefix, queue_aliases={**DEFAULT_QUEUE_ALIASES,
                                                   **settings.queue_aliases})
    except OJSConfigurationError:
        names = None
    tasks = {name: app.tasks[name] for name in sorted(app.tasks)
             if not name.startswith("celery.")}
    report_differences(AppFacts(
        conf=app.conf, tasks=tasks, report=report, scan=scan, names=names,
        own_aliases={k: v for k, v in settings.queue_aliases.items()
                     if DEFAULT_QUEUE_ALIASES.get(k) != v}, installed=installed,
        task_sets=lambda task, option: _task_option_set(app, task, option)))


def _check_tasks(app: Any, settings: OJSSettings, report: MigrationReport,
                 exact_acks: bool) -> None:
    from ..celery.retries import task_retry_policy

    registry = JobTypeRegistry(settings.job_types, lambda: app.tasks)
    try:
        names: TopologyNames | None = TopologyNames(
            prefix=settings.prefix, queue_aliases={**DEFAULT_QUEUE_ALIASES,
                                                   **settings.queue_aliases})
    except OJSConfigurationError:
        names = None  # check_queues reports it
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
        entry = TaskReport(name, job_type, source, attempts, builtin,
                           "ojs" if own_policy else semantics)
        if not builtin:
            entry.queue, entry.amqp_queue = _routed_queue(app, task, names)
            if attempts is not None and not own_policy and semantics == "celery":
                entry.self_retry, entry.self_retry_attempts = _self_retry(task, attempts)
        report.tasks.append(entry)
        if job_type is not None:
            other = claimed.setdefault(job_type, name)
            if other != name:
                report.add("blocker", f"task {name}",
                           f"OJS type {job_type!r} is also the type of task {other!r}; a "
                           "consumed job must map to exactly one task: map one of them "
                           "with ojs_job_types")
        if builtin:
            continue
        _check_task_options(app, name, task, report, exact_acks)
        if not own_policy:
            changed.append(name)
        if policy is not None and (own_policy or semantics == "ojs"):
            report.add("warning", f"task {name}", _retry_change(task, policy, own_policy))
    _report_semantics(semantics, changed, report)


def _self_retry(task: Any, max_attempts: int) -> tuple[bool, int | None]:
    """Whether ``self.retry()`` retries the task past ``max_attempts``, and how often: a
    task without ``autoretry_for`` states ``max_attempts`` 1, yet ``self.retry()`` retries
    it within Celery's ``max_retries`` (``None``: unbounded)."""
    from ..celery.retries import UNBOUNDED_ATTEMPTS

    max_retries = getattr(task, "max_retries", None)
    attempts = None if max_retries is None else int(max_retries) + 1
    if attempts is not None and attempts >= UNBOUNDED_ATTEMPTS:
        attempts = None
    if attempts is not None and attempts <= max_attempts:
        return False, None
    return True, attempts


def _routed_queue(app: Any, task: Any, names: TopologyNames | None
                  ) -> tuple[str | None, str | None]:
    """The Celery queue ``task``'s jobs go to, as ``apply_async`` routes them (its
    ``queue`` option, then ``task_routes``, then ``task_default_queue``), and its AMQP
    name under ojs_kombu (``None`` when the name is not an OJS queue name)."""
    options = {"queue": task.queue} if getattr(task, "queue", None) else {}
    try:
        route = app.amqp.router.route(options, task.name)
    except Exception:  # a route Celery itself cannot resolve: check_queues names it
        return None, None
    queue = route.get("queue")
    # an installed app routes to job queues: name them by their OJS queue name
    name = getattr(queue, "ojs_queue", None) or getattr(queue, "name", queue)
    if not name:
        return None, None
    try:
        amqp = names.job_queue(names.ojs_queue(str(name))) if names is not None else None
    except OJSConfigurationError:
        amqp = None
    return str(name), amqp


def _retry_change(task: Any, policy: RetryPolicy, own_policy: bool) -> str:
    """How a task that follows OJS retry semantics is retried unlike under plain Celery."""
    from ..celery.retries import UNBOUNDED_ATTEMPTS

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
    "time_limit": "task_time_limit",
    "priority": "task_default_priority",
    "reject_on_worker_lost": "task_reject_on_worker_lost",
    "store_errors_even_if_ignored": "taskstore_option_errors_even_if_ignored",
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


def _check_task_options(app: Any, name: str, task: Any, report: MigrationReport,
                        exact_acks: bool) -> None:
    def task_sets(task: Any, option: str) -> bool:
        return _task_option_set(app, task, option)

    subject = f"task {name}"
    acks_late = getattr(task, "acks_late", None)
    # exact_acks: bound under install()'s task_acks_late=True, False is the task's own
    if acks_late is False and (exact_acks or task_sets(task, "acks_late")):
        report.add("blocker", subject, "acks_late=False: an OJS job is acked only after it "
                   "ran; the worker refuses to start (ojs_kombu.check_app, at worker start: "
                   "remove the option)")
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
    lock = lock_hint(task)
    if lock is not None:
        report.add("info", subject, lock)


@click.group(cls=OJSGroup)
def migrate() -> None:
    """Check a Celery app before switching it to ojs_kombu."""


@migrate.command()
@click.option("-A", "--app", "app_spec", metavar="APP", expose_value=False, callback=store_option,
              help="The Celery app, as for celery -A (proj, proj.celery:app; else -A before "
                   "the command, else $CELERY_APP).")
@click.option("--workdir", type=click.Path(file_okay=False, exists=True), expose_value=False,
              callback=store_option, help="Directory to import the app from (default: the current "
                                    "one).")
@click.option("--json", "json", is_flag=True, expose_value=False, callback=store_option,
              help="Machine-readable JSON on stdout.")
@click.pass_context
def check(ctx: click.Context) -> None:
    """Report what the app's tasks become under ojs_kombu and what blocks the switch.

    The app is loaded as celery worker loads it: its task modules (include=,
    imports=, autodiscover_tasks) are imported.  Per task: the OJS type it will
    get (and from where), its OJS max_attempts and whose retry rules it follows
    (ojs_retry_semantics).  Then blockers (exit 1), warnings and info: task
    names that need an explicit mapping, acks_late=False and other ack options
    the worker refuses, non-JSON serializers, pickle in accept_content,
    compression, exchange routes, queue names, unsupported pools, options with
    no OJS meaning, every task whose retry behaviour changes versus plain
    Celery, and an ojs:// app that never calls ojs_kombu.install(app).  Then
    each difference from plain Celery the app meets (docs/differences.rst),
    with where: a setting, a task, or file:line of a call in the app's own
    packages (read, never run); the others in one line.  Does not connect to
    the broker.
    """
    app = options(ctx).app()
    if app is None:
        raise click.UsageError("give the Celery app with -A APP (ojs-kombu migrate check -A "
                               "proj)")
    report = build_report(app)
    emit(ctx, report.to_dict(), render_report(report))
    if report.blockers:
        ctx.exit(EXIT_FAILED)
