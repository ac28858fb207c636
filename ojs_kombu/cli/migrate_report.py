"""The report of ``ojs-kombu migrate check``, and the checks of an app's configuration.

:mod:`.migrate` checks the tasks; the checks here read only ``app.conf``
(serializers, queues and routes, the worker's pool, broker and acks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ..spec.errors import OJSConfigurationError
from ..spec.naming import TopologyNames

Level = Literal["blocker", "warning", "info"]
JSON_SERIALIZERS = ("json", "application/json")
#: Green pools: supported, with Celery's event dispatcher off (docs: getting started).
GREEN_POOLS = ("gevent", "eventlet")


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
    #: whether ``self.retry()`` can retry the task beyond ``max_attempts`` (a task
    #: without ``autoretry_for`` states ``max_attempts`` 1: its failures are not retried)
    self_retry: bool = False
    #: attempts a job can then make (``max_retries + 1``; ``None``: unbounded)
    self_retry_attempts: int | None = None
    #: the Celery queue its jobs are routed to (``task_routes``, its ``queue`` option,
    #: ``task_default_queue``) and that queue's AMQP name under ojs_kombu
    queue: str | None = None
    amqp_queue: str | None = None


@dataclass
class MigrationReport:
    app: str
    tasks: list[TaskReport] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    #: the task modules imported as ``celery worker`` imports them
    modules: list[str] = field(default_factory=list)
    #: each difference from plain Celery the app meets (anchor in docs/differences.rst),
    #: with where in the app: a setting, a task, ``file:line``
    differences: dict[str, list[str]] = field(default_factory=dict)
    #: the differences nothing in the app meets
    other_differences: list[str] = field(default_factory=list)
    #: the source files whose call sites were read
    scanned: list[str] = field(default_factory=list)

    @property
    def blockers(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "blocker"]

    def add(self, level: Level, subject: str, message: str) -> None:
        self.findings.append(Finding(level, subject, message))

    def to_dict(self) -> dict[str, Any]:
        return {"app": self.app, "ok": not self.blockers, "modules": self.modules,
                "tasks": [asdict(t) for t in self.tasks],
                "findings": [asdict(f) for f in self.findings],
                "differences": self.differences,
                "other_differences": self.other_differences,
                "scanned": self.scanned, "blockers": len(self.blockers)}


def _serializer_names(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value or ()]


def check_serializers(conf: Mapping[str, Any], report: MigrationReport) -> None:
    task_serializer = conf.get("task_serializer")
    if task_serializer not in JSON_SERIALIZERS:
        report.add("blocker", "task_serializer",
                   f"{task_serializer!r}: OJS jobs are JSON; every publish would raise "
                   "UnsupportedSerializerError (set task_serializer='json')")
    if conf.get("task_compression"):
        report.add("blocker", "task_compression",
                   f"{conf.get('task_compression')!r}: OJS bodies are plain JSON")
    if conf.get("task_protocol", 2) != 2:
        report.add("info", "task_protocol",
                   "task messages are written in protocol 2 under ojs_kombu (an OJS job maps "
                   "it); Celery workers read both")
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


def check_queues(conf: Mapping[str, Any], tasks: Mapping[str, Any], aliases: dict[str, str],
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


def check_installed(app: Any, report: MigrationReport) -> None:
    """A blocker when the app's broker is ``ojs://`` but ``ojs_kombu.install(app)`` never
    ran when its modules were loaded: its callers would publish Celery messages nobody
    consumes, and wait.  The same test as the worker's and the sender's refusal
    (:func:`ojs_kombu.celery.app.needs_install`)."""
    from ..celery.app import needs_install

    if needs_install(app):
        report.add("blocker", "not installed",
                   f"the broker is ojs:// but ojs_kombu.install(app) was never called on "
                   f"app {app.main!r} when its module and task modules were loaded: call "
                   "ojs_kombu.install(app) right after Celery(...), in the module that "
                   "creates the app")


def check_worker(conf: Mapping[str, Any], report: MigrationReport,
                 acks_before: Mapping[str, Any] | None = None) -> None:
    """``acks_before``: the app's ack settings before they were set as install() sets them."""
    before = acks_before or {}

    def acks(key: str) -> Any:
        return before[key] if key in before else conf.get(key)

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
    if acks("task_acks_late") is False or acks("task_acks_on_failure_or_timeout"):
        report.add("info", "task_acks_late", "install() sets task_acks_late=True and "
                   "task_acks_on_failure_or_timeout=False (jobs are acked after they ran)")
    backend = str(conf.get("result_backend") or "")
    if backend:
        report.add("info", "result_backend", f"{backend.partition('://')[0]}:// keeps working "
                   "(results are not OJS jobs); task ids become UUIDv7, so AsyncResult.id is "
                   "the OJS job id")


def _queue_text(task: TaskReport) -> str:
    if task.queue is None:
        return ""
    return f"  queue {task.queue} ({task.amqp_queue or 'not an OJS queue'})"


def _attempts_text(task: TaskReport) -> str:
    if task.max_attempts is None:
        return ""
    text = f"  max_attempts {task.max_attempts}"
    if task.self_retry:
        text += (" on failure, self.retry() up to " + (
            "unbounded attempts" if task.self_retry_attempts is None else
            f"{task.self_retry_attempts} attempts (max_retries "
            f"{task.self_retry_attempts - 1})"))
    return text + f" ({task.retry_semantics} retries)"


def render_report(report: MigrationReport) -> str:
    """The report as text: one line per task, then the findings, blockers first."""
    lines = [f"app {report.app}: {len(report.tasks)} task(s)"
             + (f" (modules imported as by celery worker: {', '.join(report.modules)})"
                if report.modules else "")]
    width = max((len(t.name) for t in report.tasks), default=4)
    for task in report.tasks:
        if task.builtin:
            continue
        job_type = task.job_type or "-- NEEDS A MAPPING --"
        lines.append(f"  {task.name:<{width}}  -> {job_type}  ({task.source})"
                     f"{_queue_text(task)}{_attempts_text(task)}")
    builtin = sum(t.builtin for t in report.tasks)
    if builtin:
        lines.append(f"  (+ {builtin} Celery built-in task(s), all mappable)"
                     if all(t.job_type for t in report.tasks if t.builtin)
                     else f"  (+ {builtin} Celery built-in task(s))")
    order = {"blocker": 0, "warning": 1, "info": 2}
    for finding in sorted(report.findings, key=lambda f: order[f.level]):
        lines.append(f"{finding.level.upper():<8} {finding.subject}: {finding.message}")
    warnings = sum(f.level == "warning" for f in report.findings)
    lines.append(f"{len(report.blockers)} blocker(s), {warnings} warning(s): " + (
        "fix the blockers before switching" if report.blockers else
        "nothing blocks the switch; read each warning before it"))
    return "\n".join(lines)
