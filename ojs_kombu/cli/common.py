"""What every ``ojs-kombu`` command shares: options, output, exit codes and errors.

Every command takes ``--broker`` (or ``OJS_BROKER_URL``), ``--prefix`` (or
``OJS_PREFIX``) and ``--json``.  Human output goes to stdout, errors to
stderr; with ``--json`` stdout holds exactly one JSON document (``events tail``:
one per line), errors included, so scripts never parse prose.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import amqp.exceptions
import click
import kombu.exceptions

from ..control import ControlError, ControlTimeout
from ..dead_letters import DeadLetterNotFound
from ..errors import (
    JobEncodeError,
    JobPublishError,
    OJSConfigurationError,
    TopologyConflictError,
)

DEFAULT_BROKER = "ojs://guest:guest@localhost:5672//"

#: Exit codes scripts can rely on (also in ``ojs-kombu --help`` and the README).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_NOT_FOUND = 4
EXIT_TIMEOUT = 5
EXIT_INTERRUPTED = 130
EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_FAILED: "a check failed, something blocks the switch, or the broker refused the "
                 "operation (topology conflict, nack, unroutable, no confirm)",
    EXIT_USAGE: "usage error or invalid input (bad option, invalid JSON, job id, type or queue)",
    EXIT_UNREACHABLE: "the broker cannot be reached (connection refused, DNS, login, vhost)",
    EXIT_NOT_FOUND: "unknown queue, unknown job (info), or no such dead letter",
    EXIT_TIMEOUT: "no answer in time (INFO), or events tail --count not reached by --timeout",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C); nothing is lost, see the command's help",
}

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Options:
    """What the shared options hold for the running command."""

    broker: str = DEFAULT_BROKER
    prefix: str = ""
    json: bool = False
    connect_timeout: float = 5.0


class CLIError(click.ClickException):
    """An error with its exit code and a short machine-readable kind."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED, kind: str = "failed") -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.kind = kind


def options(ctx: click.Context) -> Options:
    return ctx.ensure_object(Options)


def _store(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if value is not None:
        setattr(options(ctx), param.name or "", value)
    return value


def common_options(func: F) -> F:
    """``--broker``, ``--prefix``, ``--connect-timeout`` and ``--json`` on a command."""
    decorators = [
        click.option("--broker", envvar="OJS_BROKER_URL", default=DEFAULT_BROKER,
                     show_default=True, show_envvar=True, expose_value=False, callback=_store,
                     help="Broker URL (ojs://, ojss://; amqp:// and amqps:// are taken as "
                          "ojs:// and ojss://)."),
        click.option("--prefix", envvar="OJS_PREFIX", default="", show_envvar=True,
                     expose_value=False, callback=_store,
                     help="Topology name prefix (the app's ojs_prefix)."),
        click.option("--connect-timeout", type=click.FloatRange(min=0.1), default=5.0,
                     show_default=True, expose_value=False, callback=_store,
                     help="Seconds to wait for the broker connection."),
        click.option("--json", "json", is_flag=True, default=False, expose_value=False,
                     callback=_store, help="Machine-readable JSON on stdout."),
    ]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


def emit(ctx: click.Context, data: Any, human: Callable[[], None] | str | None = None) -> None:
    """Print ``data`` as JSON with ``--json``, else the human form."""
    if options(ctx).json:
        click.echo(json.dumps(data, indent=2, default=str, ensure_ascii=False))
    elif callable(human):
        human()
    elif human is not None:
        click.echo(human)


def classify(exc: BaseException) -> CLIError | None:
    """The exit code and kind of an exception a command let through (``None``: a bug)."""
    if isinstance(exc, CLIError):
        return exc
    text = str(exc) or type(exc).__name__
    if isinstance(exc, ControlTimeout):
        return CLIError(text, EXIT_TIMEOUT, "timeout")
    if isinstance(exc, ControlError):
        if "cannot reach" in text:
            return CLIError(text, EXIT_UNREACHABLE, "unreachable")
        return CLIError(text, EXIT_FAILED, "failed")
    if isinstance(exc, DeadLetterNotFound):
        return CLIError(text, EXIT_NOT_FOUND, "not_found")
    if isinstance(exc, TopologyConflictError):
        return CLIError(text, EXIT_FAILED, "topology_conflict")
    if isinstance(exc, JobEncodeError):
        return CLIError(text, EXIT_USAGE, "invalid_job")
    if isinstance(exc, JobPublishError):
        return CLIError(text, EXIT_FAILED, "publish_failed")
    if isinstance(exc, OJSConfigurationError):
        return CLIError(text, EXIT_USAGE, "invalid_input")
    if isinstance(exc, amqp.exceptions.NotFound):
        return CLIError(f"not found: {getattr(exc, 'reply_text', text)}", EXIT_NOT_FOUND,
                        "not_found")
    if isinstance(exc, (amqp.exceptions.AccessRefused, amqp.exceptions.NotAllowed,
                        kombu.exceptions.OperationalError,
                        amqp.exceptions.RecoverableConnectionError,
                        amqp.exceptions.IrrecoverableConnectionError)):
        return CLIError(f"cannot reach the broker: {text}", EXIT_UNREACHABLE, "unreachable")
    if isinstance(exc, amqp.exceptions.AMQPError):
        return CLIError(f"the broker refused: {text}", EXIT_FAILED, "broker_error")
    if isinstance(exc, OSError):
        return CLIError(f"cannot reach the broker: {text}", EXIT_UNREACHABLE, "unreachable")
    return None


class OJSCommand(click.Command):
    """A command whose errors become one clear message and a documented exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort):
            raise
        except click.UsageError as exc:  # raised by the command body (bad JSON, ids ...)
            if not options(ctx).json:
                raise
            click.echo(exc.format_message(), err=True)
            click.echo(json.dumps({"error": "usage", "message": exc.format_message(),
                                   "exit_code": EXIT_USAGE}))
            ctx.exit(EXIT_USAGE)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)
        except Exception as exc:
            error = classify(exc)
            if error is None:
                raise
            if options(ctx).json:
                click.echo(f"Error: {error.message}", err=True)
                click.echo(json.dumps({"error": error.kind, "message": error.message,
                                       "exit_code": error.exit_code}))
                ctx.exit(error.exit_code)
            raise error from None


class OJSGroup(click.Group):
    command_class = OJSCommand
    group_class = type
