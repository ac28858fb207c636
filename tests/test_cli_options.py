"""Where ``ojs-kombu`` takes its broker and settings from, and how it fails (no broker).

The broker URLs point at 127.0.0.1:1, where nothing listens: a command that
gets as far as connecting exits 3, and its error names the broker it tried,
which is how these tests see which URL won.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from ojs_kombu.cli import EXIT_CODES, cli

ROOT = Path(__file__).resolve().parents[1]
JOB_ID = "0190b5a8-1234-7abc-8def-0123456789ab"


def nowhere(vhost: str, password: str = "secret") -> str:
    return f"ojs://guest:{password}@127.0.0.1:1/{vhost}"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("OJS_BROKER_URL", "CELERY_BROKER_URL", "CELERY_APP", "OJS_PREFIX"):
        monkeypatch.delenv(variable, raising=False)


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=env)


def error_of(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    result = invoke(*args, "--json", env=env)
    return result.exit_code, json.loads(result.stdout)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A Celery app module with its own broker and OJS settings."""
    (tmp_path / "tenantproj.py").write_text(textwrap.dedent("""
        from celery import Celery

        app = Celery("tenantproj", broker="amqp://guest:appsecret@127.0.0.1:1/from-app")
        app.conf.ojs_prefix = "tenant1"
        app.conf.ojs_queue_aliases = {"High_Priority": "high"}
    """))
    return tmp_path


def test_broker_precedence_is_option_then_ojs_then_celery_variable_then_app(
        project: Path) -> None:
    command = ["-A", "tenantproj", "--workdir", str(project), "topology", "show", "-q", "email"]
    code, error = error_of(*command)
    assert (code, error["vhost"]) == (3, "from-app")
    assert error["broker_source"] == "the broker_url of app 'tenantproj'"
    env = {"CELERY_BROKER_URL": nowhere("from-celery")}
    assert error_of(*command, env=env)[1]["vhost"] == "from-celery"  # as celery: env > app
    env["OJS_BROKER_URL"] = nowhere("from-ojs")
    assert error_of(*command, env=env)[1]["vhost"] == "from-ojs"
    before = ["-b", nowhere("from-option"), *command]
    assert error_of(*before, env=env)[1]["vhost"] == "from-option"
    after = [*before, "--broker", nowhere("after-the-command")]
    code, error = error_of(*after, env=env)
    assert (error["vhost"], error["broker_source"]) == ("after-the-command", "--broker")


def command_paths(command: click.Command, path: tuple[str, ...] = ()) -> list[list[str]]:
    """Every command of the CLI as its words (the root first), read from the CLI itself,
    so a command added later is covered too."""
    paths = [list(path)]
    if isinstance(command, click.Group):
        context = click.Context(command)
        for name in command.list_commands(context):
            sub = command.get_command(context, name)
            assert sub is not None, name
            paths += command_paths(sub, (*path, name))
    return paths


COMMANDS = command_paths(cli)


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) or "root" for c in COMMANDS])
def test_every_command_has_help(command: list[str]) -> None:
    """As the installed script prints it (``prog_name``: the console script's name)."""
    result = CliRunner().invoke(cli, [*command, "--help"], prog_name="ojs-kombu")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(" ".join(["Usage: ojs-kombu", *command]))
    if command and command[-1] in ("declare", "show", "enqueue", "list", "tail", "conformance"):
        assert "OJS_BROKER_URL" in result.stdout and "--json" in result.stdout


@pytest.mark.parametrize("command", [
    ["topology", "show", "-q", "email"],
    ["topology", "declare", "-q", "email"],
    ["enqueue", "math.add", "[1, 2]"],
    ["info", JOB_ID, "-q", "email"],
    ["cancel", JOB_ID, "-q", "email"],
    ["dlq", "list", "-q", "email"],
    ["dlq", "show", "-q", "email", JOB_ID],
    ["events", "tail", "--count", "1", "--timeout", "1"],
    ["conformance", "-q", "email"],
])
def test_every_broker_error_names_the_broker_and_vhost_with_the_password_masked(
        command: list[str]) -> None:
    env = {"OJS_BROKER_URL": nowhere("tenant-a", "s3cret")}
    result = invoke(*command, env=env)
    assert result.exit_code == 3, result.output
    assert "on broker ojs://guest:**@127.0.0.1:1/tenant-a (vhost 'tenant-a', URL from " \
           "OJS_BROKER_URL)" in result.stderr
    code, error = error_of(*command, env=env)
    assert (code, error["error"], error["exit_code"]) == (3, "unreachable", 3)
    assert (error["broker"], error["vhost"]) == ("ojs://guest:**@127.0.0.1:1/tenant-a",
                                                 "tenant-a")
    assert "s3cret" not in result.output + json.dumps(error)


def test_the_apps_queue_aliases_name_the_queue(project: Path) -> None:
    app = ["-A", "tenantproj", "--workdir", str(project)]
    # without the app, High_Priority is no OJS queue name: a usage error, nothing sent
    code, error = error_of("topology", "show", "-q", "High_Priority",
                           env={"OJS_BROKER_URL": nowhere("v")})
    assert (code, error["error"]) == (2, "invalid_input") and "High_Priority" in error["message"]
    assert "broker" not in error
    # with it, the alias maps it, and the command goes on to the (absent) broker
    code, error = error_of(*app, "topology", "show", "-q", "High_Priority")
    assert (code, error["vhost"]) == (3, "from-app")


def test_app_given_after_the_command_and_through_celery_app(project: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.chdir(project)  # celery -A imports from the current directory
    code, error = error_of("topology", "show", "-q", "High_Priority", "-A", "tenantproj")
    assert (code, error["vhost"]) == (3, "from-app")
    code, error = error_of("topology", "show", "-q", "High_Priority",
                           env={"CELERY_APP": "tenantproj"})
    assert (code, error["vhost"]) == (3, "from-app")


@pytest.mark.parametrize("command, fragment", [
    (["info", "", "-q", "email"], "neither a job id nor a task id"),
    (["cancel", "x" * 256, "-q", "email"], "neither a job id nor a task id"),
    (["dlq", "show", "-q", "email", "x" * 256], "neither a job id nor a task id"),
    (["dlq", "show", "-q", "email", "--id", "a\tb"], "neither a job id nor a task id"),
    (["dlq", "show", "-q", "email"], "give the ID"),
    (["dlq", "replay", "-q", "email"], "give ID or --all"),
    (["dlq", "replay", "-q", "email", JOB_ID, "--all"], "give ID or --all"),
    (["dlq", "purge", "-q", "email", JOB_ID, "--all", "--yes"], "not both"),
    (["dlq", "show", "-q", "email", JOB_ID, "--id", "0190b5a8-1234-7abc-8def-0123456789ac"],
     "give the job id once"),
    (["topology", "show", "-q", "Bad Queue"], "Bad Queue"),
])
def test_usage_errors_exit_2_before_any_connection(command: list[str], fragment: str) -> None:
    env = {"OJS_BROKER_URL": nowhere("v")}
    result = invoke(*command, env=env)
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr
    assert "on broker" not in result.stderr  # the broker is not the problem
    code, error = error_of(*command, env=env)
    assert code == 2 and error["exit_code"] == 2 and fragment in error["message"]


def test_the_old_id_option_still_works_with_a_deprecation_note() -> None:
    result = invoke("dlq", "show", "-q", "email", "--id", JOB_ID,
                    env={"OJS_BROKER_URL": nowhere("v")})
    assert result.exit_code == 3  # got as far as the broker
    assert "--id is deprecated: give the job id as the argument JOB_ID" in result.stderr


@pytest.mark.parametrize("url, fragment", [
    ("redis://127.0.0.1:1/0", "is not an ojs:// (or amqp://) broker URL"),
    ("nosuchscheme://127.0.0.1:1/", "invalid broker URL"),
])
def test_a_broker_url_of_another_transport_is_a_usage_error(url: str, fragment: str) -> None:
    result = invoke("-b", url, "topology", "show", "-q", "email")
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr and "--broker" in result.stderr


def test_an_app_that_cannot_be_imported_is_a_usage_error(tmp_path: Path) -> None:
    result = invoke("-A", "no_such_project_module", "--workdir", str(tmp_path),
                    "topology", "show", "-q", "email")
    assert result.exit_code == 2 and "cannot load the Celery app" in result.stderr


def test_the_docs_and_the_help_list_every_exit_code_as_the_cli_defines_them() -> None:
    """docs/cli.rst writes its exit-code table from EXIT_CODES (the ``ojs-exit-codes``
    directive) and the table of commands from the commands (``ojs-commands``)."""
    page = (ROOT / "docs" / "cli.rst").read_text()
    assert ".. ojs-exit-codes::" in page and ".. ojs-commands::" in page
    assert "* - 130" not in page  # no hand-written copy that could drift
    help_text = invoke("--help").stdout
    for code in EXIT_CODES:
        assert re.search(rf"^ +{code}  \S", help_text, re.MULTILINE), code
