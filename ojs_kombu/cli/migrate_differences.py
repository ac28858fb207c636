"""``migrate check``: which differences from plain Celery this app meets, and where.

Each row of :data:`.differences.DIFFERENCES` has a detector here that reads the
app's configuration (``app.conf``), its tasks' options and the call sites of its
code (:mod:`.migrate_scan`) and returns where the app meets it (a setting, a task,
``file:line``).  A value the scan cannot read (``countdown=delay``) is named with
"not a literal": the check cannot rule it out.  The rows met are warnings, each
with its places; the rest are one line with the link to docs/differences.rst.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..spec.errors import OJSConfigurationError
from ..spec.naming import TopologyNames
from .differences import DIFFERENCES, DOCS_PAGE
from .migrate_report import JSON_SERIALIZERS, MigrationReport, TaskReport
from .migrate_scan import (
    AppScan,
    calls_self_retry,
    literal,
    never_a_uuid,
    project_mentions,
    timedelta_seconds,
)

#: The furthest ``countdown``/``eta`` the scheduling ladder reaches (2**32 - 1 ms).
MAX_DELAY_S = (2**32 - 1) / 1000
PRIORITY_RANGE = range(-100, 101)
#: AMQP properties the binding sets itself (``apply_async`` options it does not carry).
AMQP_PROPERTIES = ("app_id", "user_id", "content_type", "content_encoding",
                   "correlation_id", "message_id", "type", "timestamp", "cluster_id",
                   "expiration", "delivery_mode")
TYPED_CALLS = frozenset({"Decimal", "datetime", "date", "time", "UUID", "uuid1", "uuid4",
                         "uuid7", "now", "utcnow", "today", "fromisoformat",
                         "fromtimestamp"})
TYPED_ANNOTATIONS = ("Decimal", "datetime", "date", "time", "UUID", "bytes")
NOT_LITERAL = " (not a literal: check it)"
SHOWN = 6  # places shown per row; the rest are counted


@dataclass
class AppFacts:
    """What the detectors read: the app, as ``migrate check`` loaded it."""

    conf: Mapping[str, Any]
    #: the app's own tasks (not Celery's), by name
    tasks: dict[str, Any]
    report: MigrationReport
    scan: AppScan
    names: TopologyNames | None
    #: the queue aliases the app itself sets (``ojs_queue_aliases``)
    own_aliases: Mapping[str, str]
    installed: bool
    task_sets: Callable[[Any, str], bool]

    @property
    def own(self) -> list[TaskReport]:
        return [t for t in self.report.tasks if not t.builtin]


def _task_names(facts: AppFacts) -> list[str]:
    found = []
    for task in facts.own:
        if task.job_type is None:
            found.append(f"task {task.name} (needs a mapping: see the blocker)")
        elif task.job_type != task.name:
            found.append(f"task {task.name} -> {task.job_type} ({task.source})")
    return found


def _bad_queue(facts: AppFacts, name: Any) -> bool:
    if facts.names is None or not isinstance(name, str):
        return True
    try:
        facts.names.ojs_queue(name)
    except OJSConfigurationError:
        return True
    return False


def _queue_names(facts: AppFacts) -> list[str]:
    found = [f"{f.subject} ({f.level})" for f in facts.report.findings
             if f.subject.startswith(("queue ", "task_routes[")) and f.level != "info"]
    found += [f"ojs_queue_aliases[{name!r}] -> {alias!r}"
              for name, alias in facts.own_aliases.items()]
    for name, task in facts.tasks.items():
        for option in ("exchange", "routing_key"):
            if getattr(task, option, None):
                found.append(f"task {name}: {option}={getattr(task, option)!r}")
    for call in facts.scan.with_option("queue"):
        known, value = literal(call.options["queue"])
        if not known:
            found.append(call.shown("queue") + NOT_LITERAL)
        elif _bad_queue(facts, value):
            found.append(call.shown("queue"))
    found += [call.shown(option) for option in ("exchange", "routing_key")
              for call in facts.scan.with_option(option)]
    return found


def _serializers(facts: AppFacts) -> list[str]:
    conf = facts.conf
    found = []
    if conf.get("task_serializer") not in JSON_SERIALIZERS:
        found.append(f"task_serializer={conf.get('task_serializer')!r}")
    for setting in ("task_compression", "result_compression"):
        if conf.get(setting):
            found.append(f"{setting}={conf.get(setting)!r}")
    for setting in ("result_serializer", "event_serializer"):
        if conf.get(setting) == "pickle":
            found.append(f"{setting}='pickle'")
    for setting in ("accept_content", "result_accept_content"):
        accept = conf.get(setting) or ()
        if any(v in ("pickle", "application/x-python-serialize") for v in accept):
            found.append(f"{setting} has pickle")
    for name, task in facts.tasks.items():
        if facts.task_sets(task, "serializer") and task.serializer not in JSON_SERIALIZERS:
            found.append(f"task {name}: serializer={task.serializer!r}")
        if facts.task_sets(task, "compression") and getattr(task, "compression", None):
            found.append(f"task {name}: compression={task.compression!r}")
    for call in facts.scan.with_option("serializer"):
        known, value = literal(call.options["serializer"])
        if not known or value not in (*JSON_SERIALIZERS, None):
            found.append(call.shown("serializer") + ("" if known else NOT_LITERAL))
    for call in facts.scan.with_option("compression"):
        known, value = literal(call.options["compression"])
        if not known or value is not None:
            found.append(call.shown("compression") + ("" if known else NOT_LITERAL))
    return found


def _priority_range(facts: AppFacts) -> list[str]:
    def outside(value: Any) -> bool:
        return value is not None and not (
            isinstance(value, int) and not isinstance(value, bool) and value in PRIORITY_RANGE)

    found = []
    if outside(facts.conf.get("task_default_priority")):
        found.append(f"task_default_priority={facts.conf.get('task_default_priority')!r}")
    found += [f"task {name}: priority={task.priority!r}" for name, task in facts.tasks.items()
              if facts.task_sets(task, "priority") and outside(getattr(task, "priority", None))]
    for call in facts.scan.with_option("priority"):
        known, value = literal(call.options["priority"])
        if not known or outside(value):
            found.append(call.shown("priority") + ("" if known else NOT_LITERAL))
    return found


def _long_countdowns(facts: AppFacts) -> list[str]:
    found = []
    for call in facts.scan.with_option("countdown"):
        known, value = literal(call.options["countdown"])
        if not known or (isinstance(value, (int, float)) and value > MAX_DELAY_S):
            found.append(call.shown("countdown") + ("" if known else NOT_LITERAL))
    for call in facts.scan.with_option("eta"):
        seconds = timedelta_seconds(call.options["eta"])
        if seconds is None:
            found.append(call.shown("eta") + " (no timedelta of literals: check it)")
        elif seconds > MAX_DELAY_S:
            found.append(call.shown("eta"))
    for name, task in facts.tasks.items():
        for option in ("default_retry_delay", "retry_backoff_max"):
            value = getattr(task, option, None)
            if isinstance(value, (int, float)) and value > MAX_DELAY_S:
                found.append(f"task {name}: {option}={value!r}")
    return found


def _bad_limits(soft: Any, hard: Any) -> bool:
    numbers = [v for v in (soft, hard) if v is not None]
    if any(not isinstance(v, (int, float)) or v < 0 for v in numbers):
        return True
    return len(numbers) == 2 and soft > hard


def _time_limits(facts: AppFacts) -> list[str]:
    found = []
    conf = facts.conf
    if _bad_limits(conf.get("task_soft_time_limit"), conf.get("task_time_limit")):
        found.append(f"task_soft_time_limit={conf.get('task_soft_time_limit')!r}, "
                     f"task_time_limit={conf.get('task_time_limit')!r}")
    for name, task in facts.tasks.items():
        soft, hard = getattr(task, "soft_time_limit", None), getattr(task, "time_limit", None)
        own = facts.task_sets(task, "soft_time_limit") or facts.task_sets(task, "time_limit")
        if own and _bad_limits(soft, hard):
            found.append(f"task {name}: soft_time_limit={soft!r}, time_limit={hard!r}")
    for call in facts.scan.calls:
        given = {o: literal(call.options[o]) for o in ("soft_time_limit", "time_limit")
                 if o in call.options}
        if not given:
            continue
        option = next(iter(given))
        if not all(known for known, _ in given.values()):
            found.append(call.shown(option) + NOT_LITERAL)
        elif _bad_limits(given.get("soft_time_limit", (1, None))[1],
                         given.get("time_limit", (1, None))[1]):
            found.append(call.shown(option))
    return found


def _acks_late(facts: AppFacts) -> list[str]:
    return [f"{f.subject} (see the blocker)" for f in facts.report.blockers
            if f.subject.startswith("task ") and "acks_" in f.message]


def _calls(facts: AppFacts, name: str) -> list[str]:
    return [f"{call.where} {call.name}()" for call in facts.scan.named(name)]


def _failed_jobs(facts: AppFacts) -> list[str]:
    names = [t.name for t in facts.own]
    return [f"{len(names)} task(s): {', '.join(names)}"] if names else []


def _delays(facts: AppFacts) -> list[str]:
    found = [call.shown(option) for option in ("countdown", "eta")
             for call in facts.scan.with_option(option)]
    found += [f"{call.where} {call.receiver}.retry()" for call in facts.scan.named("retry")
              if call.receiver and not call.options.keys() & {"countdown", "eta"}]
    found += [f"task {name}: autoretry_for" for name, task in facts.tasks.items()
              if getattr(task, "autoretry_for", None)]
    return found


def _reject_and_expires(facts: AppFacts) -> list[str]:
    found = [call.shown("expires") for call in facts.scan.with_option("expires")]
    found += [f"task {name}: expires={task.expires!r}" for name, task in facts.tasks.items()
              if getattr(task, "expires", None) is not None]
    for call in facts.scan.named("Reject"):
        node = call.keywords.get("requeue", call.args[1] if len(call.args) > 1 else None)
        if node is None:
            continue
        known, value = literal(node)
        if not known or value:
            found.append(f"{call.where} Reject(requeue={ast.unparse(node)})"
                         + ("" if known else NOT_LITERAL))
    return found


def _stated_attempts(facts: AppFacts) -> list[str]:
    """Tasks whose own code calls ``self.retry()`` beyond the attempts they state."""
    return [f"task {t.name}: max_attempts {t.max_attempts}, self.retry() up to "
            + ("unbounded attempts" if t.self_retry_attempts is None
               else f"{t.self_retry_attempts}") for t in facts.own
            if t.self_retry and calls_self_retry(facts.tasks.get(t.name))]


def _queue_layout(facts: AppFacts) -> list[str]:
    queues = sorted({(t.amqp_queue, t.queue) for t in facts.own if t.queue and t.amqp_queue})
    return [amqp + ("" if queue == amqp else f" (Celery queue {queue})")
            for amqp, queue in queues]


def _native_delayed_delivery(facts: AppFacts) -> list[str]:
    conf = facts.conf
    found = []
    if conf.get("task_default_queue_type") == "quorum":
        found.append("task_default_queue_type='quorum'")
    for queue in conf.get("task_queues") or ():
        arguments = getattr(queue, "queue_arguments", None) or {}
        if arguments.get("x-queue-type") == "quorum":
            found.append(f"task_queues: {queue.name} (x-queue-type quorum)")
    for key in conf:
        if str(key).startswith("broker_native_delayed_delivery") and key in getattr(
                conf, "changes", {}):
            found.append(f"{key}={conf[key]!r}")
    return found


def _purge_and_scheduled(facts: AppFacts) -> list[str]:
    found = [f"{c.where} {c.name}()" for c in facts.scan.named("purge", "scheduled")
             if (c.name == "purge" and c.receiver.endswith("control"))
             or (c.name == "scheduled" and "inspect" in c.receiver)]
    delays = _delays(facts)
    if delays:
        found.append(f"jobs that are not yet due ({len(delays)} place(s), under "
                     "delays-in-the-broker)")
    return found


def _acked_after_run(facts: AppFacts) -> list[str]:
    found = [f"{c.where} {c.name}()" for c in facts.scan.named("active", "query_task")
             if "inspect" in c.receiver]
    found += [f"{where} delivery_info" for where in facts.scan.attributes.get(
        "delivery_info", [])]
    return found


def _message_properties(facts: AppFacts) -> list[str]:
    return [call.shown(option) for option in AMQP_PROPERTIES
            for call in facts.scan.with_option(option)]


def _task_ids(facts: AppFacts) -> list[str]:
    from ..spec.job_ids import is_job_id

    found = []
    for call in facts.scan.with_option("task_id"):
        known, value = literal(call.options["task_id"])
        if not known and never_a_uuid(call.options["task_id"]):
            found.append(call.shown("task_id"))
        elif not known:
            found.append(call.shown("task_id") + NOT_LITERAL)
        elif value is not None and not is_job_id(str(value)):
            found.append(call.shown("task_id"))
    return found


def _typed_values(facts: AppFacts) -> list[str]:
    found = []
    for name, task in facts.tasks.items():
        annotations = getattr(getattr(task, "run", None), "__annotations__", None) or {}
        for argument, annotation in annotations.items():
            text = annotation if isinstance(annotation, str) else getattr(
                annotation, "__name__", str(annotation))
            words = set(text.replace("[", " ").replace("]", " ").replace("|", " ")
                        .replace(".", " ").replace(",", " ").split())
            if argument != "return" and words & set(TYPED_ANNOTATIONS):
                found.append(f"task {name}: {argument}: {text}")
    for call in facts.scan.calls:
        for value in call.values:
            typed = [n for n in ast.walk(value) if (isinstance(n, ast.Call) and getattr(
                n.func, "attr", getattr(n.func, "id", None)) in TYPED_CALLS) or (
                isinstance(n, ast.Constant) and isinstance(n.value, bytes))]
            if typed:
                found.append(f"{call.where} {call.name}(... {ast.unparse(typed[0])[:40]} ...)")
                break
    found += _calls(facts, "register_type")
    return found


def _install_defaults(facts: AppFacts) -> list[str]:
    conf = facts.conf
    found = []
    heartbeat = conf.get("broker_heartbeat")
    if heartbeat == 120 or (facts.installed and heartbeat == 60):
        found.append("broker_heartbeat: 60 s under install() (Celery's default is 120 s)")
    scheduler = str(conf.get("beat_scheduler"))
    if conf.get("beat_schedule") and scheduler in ("celery.beat:PersistentScheduler",
                                                   "ojs_kombu.celery.beat:OJSScheduler"):
        found.append(f"beat_schedule ({len(conf['beat_schedule'])} entries): beat runs "
                     "ojs_kombu.celery.beat:OJSScheduler")
    return found


def _flower(facts: AppFacts) -> list[str]:
    return [f"{where} import flower" for where in facts.scan.flower_imports] + (
        project_mentions(facts.scan.roots, "flower"))


DETECTORS: dict[str, Callable[[AppFacts], list[str]]] = {
    "task-names": _task_names,
    "queue-names": _queue_names,
    "serializers": _serializers,
    "priority-range": _priority_range,
    "long-countdowns": _long_countdowns,
    "time-limits-and-size": _time_limits,
    "acks-late": _acks_late,
    "batch-canvas": lambda facts: _calls(facts, "enqueue_many"),
    "failed-jobs": _failed_jobs,
    "delays-in-the-broker": _delays,
    "reject-and-expires": _reject_and_expires,
    "stated-attempts": _stated_attempts,
    "queue-layout": _queue_layout,
    "native-delayed-delivery": _native_delayed_delivery,
    "purge-and-scheduled": _purge_and_scheduled,
    "acked-after-run": _acked_after_run,
    "message-properties": _message_properties,
    "task-ids": _task_ids,
    "typed-values": _typed_values,
    "install-defaults": _install_defaults,
    "batch-signals": lambda facts: _calls(facts, "enqueue_many"),
    "cancel": lambda facts: [],  # CANCEL is new; revoke() keeps working as in Celery
    "flower-broker-tab": _flower,
}


def report_differences(facts: AppFacts) -> None:
    """Add a warning per difference the app meets, naming where; then one line for the
    rest, with the link."""
    report = facts.report
    rest = []
    for difference in DIFFERENCES:
        places = DETECTORS[difference.anchor](facts)
        if not places:
            rest.append(difference.anchor)
            continue
        report.differences[difference.anchor] = places
        shown = "; ".join(places[:SHOWN]) + (
            f"; and {len(places) - SHOWN} more" if len(places) > SHOWN else "")
        report.add("warning", f"difference {difference.anchor}",
                   f"{difference.summary} ({difference.link}): {shown}")
    report.other_differences = rest
    if rest:
        report.add("info", "other differences",
                   f"{len(rest)} more that nothing in the app's configuration, tasks or code "
                   f"meets ({', '.join(rest)}): {DOCS_PAGE}")
    scan = facts.scan
    if scan.truncated or scan.unreadable:
        report.add("info", "call sites", f"{len(scan.files)} file(s) read"
                   + (f", stopped at {len(scan.files)} files" if scan.truncated else "")
                   + (f"; not read: {', '.join(scan.unreadable[:SHOWN])}"
                      if scan.unreadable else "")
                   + ": differences met only there are not reported")
