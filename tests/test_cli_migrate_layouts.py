"""``migrate check`` on projects laid out as Celery's documentation lays them out.

Their tasks live in modules the app module never imports: ``celery worker``
imports them (``include=``, ``imports``, ``autodiscover_tasks``), and so must
the check, or it reports Celery's built-in tasks only.  Each run is a
subprocess of the installed console script, as a user runs it (and so the
projects' ``@shared_task``s never reach the apps of other tests).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ojs_kombu.cli import cli

LAYOUTS = Path(__file__).resolve().parent / "celery_layouts"


def check(*args: str, cwd: Path = LAYOUTS) -> tuple[int, dict[str, Any]]:
    script = shutil.which("ojs-kombu", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.fail("ojs-kombu is not installed: run .venv/bin/pip install -e '.[test]'")
    env = {k: v for k, v in os.environ.items() if k != "CELERY_APP"}
    result = subprocess.run([script, *args, "--json"], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    try:
        return result.returncode, json.loads(result.stdout)
    except ValueError:
        pytest.fail(f"not JSON (rc {result.returncode}): {result.stdout!r} {result.stderr!r}")


def own_tasks(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in report["tasks"] if not t["builtin"]}


def findings(report: dict[str, Any], level: str) -> dict[str, str]:
    return {f["subject"]: f["message"] for f in report["findings"] if f["level"] == level}


def test_tasks_of_include_and_imports_modules_are_checked() -> None:
    code, report = check("migrate", "check", "-A", "layout_include")
    assert report["modules"] == ["layout_include.reports", "layout_include.tasks"]
    tasks = own_tasks(report)
    assert set(tasks) == {"layout_include.tasks.send_email", "layout_include.tasks.charge",
                          "layout_include.tasks.fetch", "layout_include.reports.BuildReport"}
    assert tasks["layout_include.reports.BuildReport"]["job_type"] == "reports.build"
    # the worker refuses acks_late=False at start: it blocks the switch
    assert code == 1 and report["ok"] is False
    assert "acks_late=False" in findings(report, "blocker")["task layout_include.tasks.charge"]
    assert set(findings(report, "blocker")) == {"task layout_include.tasks.charge"}
    # every task whose retries change is named: the one with ojs_retry now, and under
    # ojs_retry_semantics="ojs" the others
    assert "task layout_include.reports.BuildReport" in findings(report, "warning")
    summary = findings(report, "info")["ojs_retry_semantics"]
    changed = set(summary.rpartition("would change the retries of: ")[2].split(", "))
    assert changed == {"layout_include.tasks.send_email", "layout_include.tasks.charge",
                       "layout_include.tasks.fetch"}


def test_autodiscovered_shared_tasks_are_checked() -> None:
    code, report = check("migrate", "check", "-A", "layout_autodiscover")
    assert report["modules"] == ["layout_autodiscover.emails.tasks",
                                 "layout_autodiscover.orders.tasks"]
    tasks = own_tasks(report)
    assert set(tasks) == {"layout_autodiscover.orders.tasks.ship",
                          "layout_autodiscover.orders.tasks.reserve",
                          "layout_autodiscover.emails.tasks.welcome"}
    assert code == 1
    assert "acks_late=False" in findings(report, "blocker")[
        "task layout_autodiscover.orders.tasks.ship"]
    # ojs_retry_semantics="ojs": every task's retries change, and each is named
    warnings = findings(report, "warning")
    assert {f"task {name}" for name in tasks} <= set(warnings)
    assert tasks["layout_autodiscover.orders.tasks.reserve"]["max_attempts"] == 4


def test_app_and_workdir_before_the_command_as_in_celery(tmp_path: Path) -> None:
    code, report = check("-A", "layout_autodiscover", "--workdir", str(LAYOUTS), "migrate",
                         "check", cwd=tmp_path)
    assert code == 1 and len(own_tasks(report)) == 3


def test_a_task_module_that_fails_to_import_blocks(tmp_path: Path) -> None:
    (tmp_path / "brokenincludeproj.py").write_text(textwrap.dedent("""
        from celery import Celery

        app = Celery("brokenincludeproj", broker="amqp://guest:guest@127.0.0.1:1//",
                     include=["brokenincludeproj_tasks"])
    """))
    (tmp_path / "brokenincludeproj_tasks.py").write_text("import no_such_dependency\n")
    result = CliRunner().invoke(cli, ["migrate", "check", "-A", "brokenincludeproj",
                                      "--workdir", str(tmp_path), "--json"])
    assert result.exit_code == 1, result.output
    blockers = {f["subject"]: f["message"] for f in json.loads(result.stdout)["findings"]
                if f["level"] == "blocker"}
    assert "no_such_dependency" in blockers["task modules"]


def test_an_app_whose_tasks_are_not_found_is_warned(tmp_path: Path) -> None:
    """The tasks are in a module neither include= nor autodiscover_tasks names."""
    (tmp_path / "notasksproj.py").write_text(textwrap.dedent("""
        from celery import Celery

        app = Celery("notasksproj", broker="amqp://guest:guest@127.0.0.1:1//")
    """))
    (tmp_path / "notasksproj_tasks.py").write_text(textwrap.dedent("""
        from notasksproj import app

        @app.task
        def add(x, y):
            return x + y
    """))
    code, report = check("migrate", "check", "-A", "notasksproj", cwd=tmp_path)
    assert code == 0 and own_tasks(report) == {}
    assert "include=" in findings(report, "warning")["tasks"]


#: Each app of tests/celery_layouts and exactly the differences from plain Celery it
#: meets (docs/differences.rst anchors): anything more is a false alarm, less is missed.
MEETS = {
    "meets_baseline": {"failed-jobs", "queue-layout"},
    # a typical shop app: none of queue names, serializers, priority range, long
    # countdowns, time limits, message properties, native delayed delivery, Flower
    "shop": {"failed-jobs", "queue-layout", "delays-in-the-broker", "reject-and-expires",
             "stated-attempts", "purge-and-scheduled", "task-ids", "typed-values",
             "install-defaults"},
    "edges": {"task-names", "queue-names", "serializers", "priority-range",
              "long-countdowns", "time-limits-and-size", "batch-canvas", "failed-jobs",
              "delays-in-the-broker", "reject-and-expires", "queue-layout",
              "native-delayed-delivery", "purge-and-scheduled", "acked-after-run",
              "message-properties", "batch-signals", "flower-broker-tab"},
    "layout_include": {"task-names", "acks-late", "failed-jobs", "delays-in-the-broker",
                       "queue-layout", "purge-and-scheduled", "install-defaults"},
}


@pytest.mark.parametrize("app", sorted(MEETS))
def test_migrate_check_reports_exactly_the_differences_each_app_meets(app: str) -> None:
    from ojs_kombu.cli.differences import DIFFERENCES

    _, report = check("migrate", "check", "-A", app)
    assert set(report["differences"]) == MEETS[app]
    assert set(report["other_differences"]) == {d.anchor for d in DIFFERENCES} - MEETS[app]
    warned = {f["subject"].removeprefix("difference ") for f in report["findings"]
              if f["subject"].startswith("difference ")}
    assert warned == MEETS[app]
    # the rest: one line, with the link
    rest = [f for f in report["findings"] if f["subject"] == "other differences"]
    assert len(rest) == 1 and "docs/differences.rst" in rest[0]["message"]


def test_each_difference_says_where_in_the_app_it_comes_from() -> None:
    _, report = check("migrate", "check", "-A", "edges")
    places = report["differences"]
    assert places["queue-names"] == [
        "edges/ops.py:8 apply_async(queue='Bulk Feeds')",
        "edges/ops.py:9 apply_async(exchange='feeds')",
        "edges/ops.py:9 apply_async(routing_key='feeds.bulk')"]
    assert places["priority-range"] == ["edges/ops.py:11 apply_async(priority=200)"]
    # a value the scan cannot read is named, not guessed
    assert places["long-countdowns"] == [
        "edges/ops.py:12 apply_async(countdown=60 * 24 * 3600)",
        "edges/ops.py:15 apply_async(countdown=delay) (not a literal: check it)"]
    assert places["message-properties"] == ["edges/ops.py:14 apply_async(app_id='feeds')",
                                             "edges/ops.py:14 apply_async(user_id='feeder')"]
    assert places["native-delayed-delivery"] == ["task_default_queue_type='quorum'"]
    assert places["flower-broker-tab"] == ["edges/requirements.txt:2 flower"]
    assert places["reject-and-expires"] == ["edges/tasks.py:9 Reject(requeue=True)"]
    assert places["acked-after-run"] == ["edges/ops.py:20 active()",
                                         "edges/tasks.py:15 delivery_info"]
    _, shop = check("migrate", "check", "-A", "shop")
    assert shop["differences"]["typed-values"] == [
        "task shop.orders.charge: amount: Decimal",
        "shop/views.py:11 apply_async(... Decimal('9.99') ...)"]
    assert shop["differences"]["task-ids"] == [
        "shop/views.py:11 apply_async(task_id=f'order-{order_id}-charge')"]
    assert shop["differences"]["stated-attempts"] == [
        "task shop.emails.confirm: max_attempts 1, self.retry() up to 6"]
    assert "shop/views.py" in shop["scanned"] and "shop/orders.py" in shop["scanned"]


def test_an_ojs_app_never_installed_is_a_blocker_naming_install(tmp_path: Path) -> None:
    (tmp_path / "forgotproj.py").write_text(textwrap.dedent("""
        from celery import Celery

        app = Celery("forgotproj", broker="ojs://guest:guest@127.0.0.1:1//")

        @app.task
        def add(x, y):
            return x + y
    """))
    code, report = check("migrate", "check", "-A", "forgotproj", cwd=tmp_path)
    assert code == 1 and report["ok"] is False
    assert "ojs_kombu.install(app)" in findings(report, "blocker")["not installed"]
    (tmp_path / "forgotproj.py").write_text(
        (tmp_path / "forgotproj.py").read_text().replace(
            'broker="ojs://', 'broker="amqp://'))
    code, report = check("migrate", "check", "-A", "forgotproj", cwd=tmp_path)
    assert code == 0 and "not installed" not in findings(report, "blocker")
