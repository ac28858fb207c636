"""``migrate check``'s report on Celery apps (no broker: the report never connects)."""

from __future__ import annotations

import pytest
from celery import Celery
from kombu import Queue

from ojs_kombu.cli.migrate import build_report, render_report
from ojs_kombu.spec.errors import OJSConfigurationError


def make_app(**conf: object) -> Celery:
    app = Celery("proj", broker="amqp://guest:guest@localhost//", set_as_current=False)
    app.conf.update(**conf)
    return app


def blockers(report: object) -> dict[str, str]:
    return {f.subject: f.message for f in report.blockers}  # type: ignore[attr-defined]


def test_a_plain_json_app_can_switch_and_each_task_gets_its_type() -> None:
    app = make_app(ojs_job_types={"proj.tasks.SendEmail": "email.send"})

    @app.task(name="proj.tasks.add", max_retries=4, shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="proj.tasks.SendEmail", shared=False)
    def send(to: str) -> str:
        return to

    @app.task(name="proj.tasks.Legacy", ojs_type="legacy.run", shared=False)
    def legacy() -> None:
        return None

    report = build_report(app)
    assert report.blockers == []
    tasks = {t.name: t for t in report.tasks}
    assert (tasks["proj.tasks.add"].job_type, tasks["proj.tasks.add"].source) == (
        "proj.tasks.add", "task name")
    # ojs_retry_semantics="celery" (the default): without autoretry_for a failure is not
    # retried (self.retry() still is, within max_retries), as under plain Celery
    assert tasks["proj.tasks.add"].max_attempts == 1
    assert tasks["proj.tasks.add"].retry_semantics == "celery"
    assert (tasks["proj.tasks.SendEmail"].job_type,
            tasks["proj.tasks.SendEmail"].source) == ("email.send", "ojs_job_types")
    assert tasks["proj.tasks.Legacy"].source == "ojs_type option"
    text = render_report(report)
    assert "proj.tasks.SendEmail" in text and "-> email.send" in text
    assert "0 blocker(s)" in text.splitlines()[-1]
    assert "nothing blocks the switch; read each warning" in text.splitlines()[-1]
    assert report.to_dict()["ok"] is True


def test_a_difference_is_reported_only_where_the_app_meets_it() -> None:
    """An app with one plain task meets the differences every task meets, and none of
    those its code would have to use (a countdown, a priority, a task id ...)."""
    app = make_app(broker_heartbeat=30)

    @app.task(name="proj.add", shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    report = build_report(app, scan_modules=())  # its code is this test module
    assert set(report.differences) == {"failed-jobs", "queue-layout"}
    assert "proj.add" in report.differences["failed-jobs"][0]
    text = render_report(report)
    assert "docs/differences.rst#failed-jobs" in text
    assert "docs/differences.rst#priority-range" not in text
    rest = [line for line in text.splitlines() if line.startswith("INFO     other differences")]
    assert len(rest) == 1 and "priority-range" in rest[0] and "docs/differences.rst" in rest[0]


def test_settings_and_task_options_meet_differences_and_are_named() -> None:
    app = make_app(broker_heartbeat=30, task_default_priority=255, task_time_limit=10,
                   task_soft_time_limit=20, beat_schedule={"x": {"task": "proj.t",
                                                                 "schedule": 5.0}})

    @app.task(name="proj.t", expires=60, default_retry_delay=60 * 24 * 3600, shared=False)
    def t() -> None:
        return None

    found = build_report(app, scan_modules=()).differences
    assert found["priority-range"] == ["task_default_priority=255"]
    assert found["time-limits-and-size"] == ["task_soft_time_limit=20, task_time_limit=10"]
    assert found["reject-and-expires"] == ["task proj.t: expires=60"]
    assert found["long-countdowns"] == ["task proj.t: default_retry_delay=5184000"]
    assert found["install-defaults"] == [
        "beat_schedule (1 entries): beat runs ojs_kombu.celery.beat:OJSScheduler"]


def test_names_needing_a_mapping_and_shared_types_block() -> None:
    app = make_app()

    @app.task(name="proj.tasks.SendEmail", shared=False)
    def send(to: str) -> str:
        return to

    @app.task(name="email.send", shared=False)
    def send2(to: str) -> str:
        return to

    @app.task(name="proj.other", ojs_type="email.send", shared=False)
    def other() -> None:
        return None

    found = blockers(build_report(app))
    assert "ojs_job_types" in found["task proj.tasks.SendEmail"]
    assert "proj.tasks.send_email" in found["task proj.tasks.SendEmail"]  # a suggestion
    assert "also the type of task" in found["task proj.other"]
    assert "NEEDS A MAPPING" in render_report(build_report(app))


def test_pickle_and_other_serializers_block_or_warn() -> None:
    app = make_app(task_serializer="pickle", accept_content=["pickle", "json"],
                   result_serializer="pickle", task_compression="gzip")

    @app.task(name="proj.msg", serializer="msgpack", shared=False)
    def msg() -> None:
        return None

    report = build_report(app)
    found = blockers(report)
    assert "UnsupportedSerializerError" in found["task_serializer"]
    assert "task_compression" in found
    assert "msgpack" in found["task proj.msg"]
    # pickle stays off everywhere: install() removes it, so accepting it blocks
    assert "install() removes pickle" in found["accept_content"]
    assert "'json'" in found["result_serializer"]


def test_options_without_ojs_meaning_and_lossy_acks() -> None:
    # Celery copies task_acks_late into every task: a task's own acks_late=False shows
    # only against an app that acks late (install() sets it).
    app = make_app(task_acks_late=True)

    @app.task(name="proj.slow", rate_limit="1/s", soft_time_limit=5, shared=False)
    def slow() -> None:
        return None

    @app.task(name="proj.early", acks_late=False, shared=False)
    def early() -> None:
        return None

    @app.task(name="proj.auto", autoretry_for=(IOError,), shared=False)
    def auto() -> None:
        return None

    report = build_report(app)
    info = [f.message for f in report.findings if f.subject == "task proj.slow"]
    assert any(m.startswith("rate_limit") for m in info)
    assert any(m.startswith("soft_time_limit") for m in info)
    assert "acks_late=False" in blockers(report)["task proj.early"]
    # autoretry_for keeps Celery's meaning under the default ojs_retry_semantics="celery"
    assert not any(f.level == "warning" and f.subject == "task proj.auto"
                   for f in report.findings)


def test_queues_routes_and_pools_that_block() -> None:
    app = make_app(task_queues=[Queue("High_Priority"), Queue("tmp", durable=False)],
                   task_routes={"proj.*": {"exchange": "other", "routing_key": "x"}},
                   worker_pool="gevent")
    found = blockers(build_report(app))
    assert "ojs_queue_aliases" in found["queue High_Priority"]
    assert "AMQP-003" in found["queue tmp"]
    assert "JobRoutingError" in found["task_routes['proj.*']"]
    assert "worker_pool" not in found  # gevent is supported
    green = build_report(make_app(worker_pool="gevent"))
    assert any(f.level == "info" and f.subject == "worker_pool"
               and "--without-heartbeat" in f.message for f in green.findings)

    aliased = make_app(task_queues=[Queue("High_Priority")],
                       ojs_queue_aliases={"High_Priority": "high-priority"})
    assert blockers(build_report(aliased)) == {}


def test_unknown_ojs_settings_block() -> None:
    report = build_report(make_app(ojs_perfix="tenant1"))
    assert "ojs_perfix" in blockers(report)["config"]


def retry_app(**conf: object) -> Celery:
    app = make_app(**conf)

    @app.task(name="proj.send_email", shared=False)
    def send_email() -> None:
        return None

    @app.task(name="proj.fetch", autoretry_for=(IOError,), max_retries=5, shared=False)
    def fetch() -> None:
        return None

    @app.task(name="proj.charge", ojs_retry={"max_attempts": 4}, shared=False)
    def charge() -> None:
        return None

    return app


def retry_warnings(report: object) -> dict[str, str]:
    return {f.subject: f.message for f in report.findings  # type: ignore[attr-defined]
            if f.level == "warning" and f.subject.startswith("task ")}


def test_celery_retry_semantics_change_nothing_but_ojs_retry_tasks() -> None:
    report = build_report(retry_app())
    tasks = {t.name: t for t in report.tasks}
    assert {n: (tasks[n].max_attempts, tasks[n].retry_semantics)
            for n in ("proj.send_email", "proj.fetch", "proj.charge")} == {
        "proj.send_email": (1, "celery"), "proj.fetch": (6, "celery"),
        "proj.charge": (4, "ojs")}
    warnings = retry_warnings(report)
    assert "task proj.send_email" not in warnings and "task proj.fetch" not in warnings
    assert "task proj.charge" in warnings  # it chose OJS semantics
    assert "OJS retry semantics" in retry_warnings(report)["task proj.charge"]
    summary = next(f.message for f in report.findings if f.subject == "ojs_retry_semantics")
    assert "nothing changes versus plain Celery" in summary
    changed = summary.rpartition("would change the retries of: ")[2].split(", ")
    assert {"proj.fetch", "proj.send_email"} <= set(changed) and "proj.charge" not in changed
    assert "max_attempts 1 on failure, self.retry() up to 4 attempts (max_retries 3) " \
        "(celery retries)" in render_report(report)


def test_ojs_retry_semantics_name_every_task_whose_retries_change() -> None:
    report = build_report(retry_app(ojs_retry_semantics="ojs"))
    tasks = {t.name: t for t in report.tasks}
    assert (tasks["proj.send_email"].max_attempts, tasks["proj.fetch"].max_attempts) == (3, 6)
    warnings = retry_warnings(report)
    assert {"task proj.send_email", "task proj.fetch", "task proj.charge"} <= set(warnings)
    assert "plain Celery does not retry this task" in warnings["task proj.send_email"]
    assert "hard time limits" in warnings["task proj.fetch"]
    assert report.blockers == []


def test_acks_late_false_blocks_whatever_the_app_acks() -> None:
    """Celery's default task_acks_late=False is copied into every task, yet the worker
    (under install(), which sets it True) refuses only a task's own acks_late=False."""
    app = make_app()  # task_acks_late left at Celery's default

    @app.task(name="proj.early", acks_late=False, shared=False)
    def early() -> None:
        return None

    @app.task(name="proj.plain", shared=False)
    def plain() -> None:
        return None

    report = build_report(app)
    found = blockers(report)
    assert "acks_late=False" in found["task proj.early"]
    assert "task proj.plain" not in found
    assert any(f.subject == "task_acks_late" and f.level == "info" for f in report.findings)


def test_acks_late_false_blocks_in_an_installed_app() -> None:
    import ojs_kombu

    app = make_app()
    ojs_kombu.install(app)

    @app.task(name="proj.early", acks_late=False, shared=False)
    def early() -> None:
        return None

    assert "acks_late=False" in blockers(build_report(app))["task proj.early"]
    with pytest.raises(OJSConfigurationError, match="acks_late=False"):
        ojs_kombu.check_app(app)  # what the worker runs at start



def test_tasks_wrapped_in_a_lock_library_get_the_ojs_options_that_replace_it() -> None:
    import functools

    from celery import Task

    app = make_app()
    # what celery-once and celery-singleton give (their classes' modules), and a
    # hand-made decorator
    queue_once = type("QueueOnce", (Task,), {"__module__": "celery_once.tasks",
                                              "abstract": True})
    singleton = type("Singleton", (Task,), {"__module__": "celery_singleton.singleton",
                                             "abstract": True})

    def acquire_lock(func):  # type: ignore[no-untyped-def]
        @functools.wraps(func)
        def with_lock(*args, **kwargs):  # type: ignore[no-untyped-def]
            return func(*args, **kwargs)
        return with_lock

    @app.task(name="proj.once", base=queue_once, shared=False)
    def once() -> None: ...

    @app.task(name="proj.single", base=singleton, shared=False)
    def single() -> None: ...

    @app.task(name="proj.locked", shared=False)
    @acquire_lock
    def locked() -> None: ...

    @app.task(name="proj.plain", shared=False)
    def plain() -> None: ...

    report = build_report(app)
    hints = {f.subject: f.message for f in report.findings if "wrapped in a lock" in f.message}
    assert "celery-once" in hints["task proj.once"]
    assert "'on_conflict': 'reject'" in hints["task proj.once"]
    assert "celery-singleton" in hints["task proj.single"]
    assert "'on_conflict': 'ignore'" in hints["task proj.single"]
    assert "acquire_lock.<locals>.with_lock" in hints["task proj.locked"]
    assert "task proj.plain" not in hints
    assert report.blockers == []


def test_a_task_retried_only_by_self_retry_shows_how_often_it_can_run() -> None:
    """A task without autoretry_for states max_attempts 1 (its failures are not retried),
    yet ``self.retry()`` retries it within ``max_retries``: the report says both."""
    app = make_app()

    @app.task(bind=True, name="proj.poll", max_retries=5, shared=False)
    def poll(self: object) -> None:
        return None

    @app.task(bind=True, name="proj.forever", max_retries=None, shared=False)
    def forever(self: object) -> None:
        return None

    @app.task(name="proj.auto", autoretry_for=(IOError,), max_retries=2, shared=False)
    def auto() -> None:
        return None

    report = build_report(app)
    tasks = {t.name: t for t in report.tasks}
    assert (tasks["proj.poll"].max_attempts, tasks["proj.poll"].self_retry,
            tasks["proj.poll"].self_retry_attempts) == (1, True, 6)
    assert (tasks["proj.forever"].self_retry, tasks["proj.forever"].self_retry_attempts) == (
        True, None)
    assert (tasks["proj.auto"].max_attempts, tasks["proj.auto"].self_retry) == (3, False)
    lines = {line.split()[0]: line for line in render_report(report).splitlines()
             if line.startswith("  proj.")}
    assert "max_attempts 1 on failure, self.retry() up to 6 attempts (max_retries 5)" in (
        lines["proj.poll"])
    assert "self.retry() up to unbounded attempts" in lines["proj.forever"]
    assert "max_attempts 3 (celery retries)" in lines["proj.auto"]
    as_json = {t["name"]: t for t in report.to_dict()["tasks"]}
    assert as_json["proj.poll"]["self_retry_attempts"] == 6


def test_each_task_line_names_the_queue_its_jobs_are_routed_to() -> None:
    app = make_app(task_routes={"proj.mail.*": {"queue": "email"}},
                   task_default_queue="celery")

    @app.task(name="proj.mail.send", shared=False)
    def send() -> None:
        return None

    @app.task(name="proj.report", queue="reports", shared=False)
    def report_task() -> None:
        return None

    @app.task(name="proj.ping", shared=False)
    def ping() -> None:
        return None

    report = build_report(app)
    tasks = {t.name: (t.queue, t.amqp_queue) for t in report.tasks
             if t.name.startswith("proj.")}  # not the shared tasks other tests made
    assert tasks == {"proj.mail.send": ("email", "ojs.queue.email"),
                     "proj.report": ("reports", "ojs.queue.reports"),
                     "proj.ping": ("celery", "ojs.queue.default")}
    text = render_report(report)
    assert "queue email (ojs.queue.email)" in text
    assert "queue celery (ojs.queue.default)" in text
