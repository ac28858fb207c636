"""``migrate check``'s reading of call sites: what it takes for a sending option, and
what it leaves alone (no false alarm from code that only looks alike)."""

from __future__ import annotations

import textwrap

from ojs_kombu.cli.migrate_scan import literal, scan_source, timedelta_seconds


def scan(source: str) -> dict[str, dict[str, str]]:
    """``{where: {option: value as written}}`` of the calls with sending options."""
    import ast

    found = scan_source(textwrap.dedent(source), "m.py")
    return {f"{c.where} {c.name}": {k: ast.unparse(v) for k, v in c.options.items()}
            for c in found.calls if c.options}


def test_sending_options_are_read_where_celery_takes_them() -> None:
    assert scan("""
        add.apply_async((1, 2), countdown=5, queue="email")
        app.send_task("proj.add", [1], eta=when, task_id="report-42")
        add.s(1).set(priority=3)
        signature("proj.add", options={"user_id": "bob"})
        self.retry(countdown=60, exc=exc)
    """) == {"m.py:2 apply_async": {"countdown": "5", "queue": "'email'"},
             "m.py:3 send_task": {"eta": "when", "task_id": "'report-42'"},
             "m.py:4 set": {"priority": "3"},
             "m.py:5 signature": {"user_id": "'bob'"},
             "m.py:6 retry": {"countdown": "60"}}


def test_task_arguments_and_look_alikes_are_not_options() -> None:
    """``delay``'s and ``s``'s keywords are the task's own arguments; tenacity's
    ``retry(...)`` and a cache's ``set(..., timeout=...)`` carry none of Celery's."""
    found = scan_source(textwrap.dedent("""
        add.delay(1, countdown=5)
        add.s(priority=300)
        @retry(stop=stop_after_attempt(3))
        def fetch(): ...
        cache.set("k", "v", timeout=5)
    """), "m.py")
    options = {name for call in found.calls for name in call.options}
    assert options <= {"stop", "timeout"}  # no option a detector reads
    assert not {"countdown", "priority", "queue", "eta"} & options


def test_literals_and_timedeltas_are_evaluated_never_run() -> None:
    import ast

    assert literal(ast.parse("60 * 24 * 3600", mode="eval").body) == (True, 5184000)
    assert literal(ast.parse("-1", mode="eval").body) == (True, -1)
    assert literal(ast.parse("delay", mode="eval").body) == (False, None)
    eta = ast.parse("now() + timedelta(days=3, hours=1)", mode="eval").body
    assert timedelta_seconds(eta) == 3 * 86400 + 3600
    assert timedelta_seconds(ast.parse("timedelta(days=n)", mode="eval").body) is None
