"""What every ``ojs-kombu`` command shares: options, output, exit codes and errors.

Every broker command takes ``-A/--app``, ``-b/--broker``, ``--prefix``,
``--connect-timeout`` and ``--json`` (``-A`` and ``--broker`` also before the
command, as ``celery`` takes them; see :mod:`.config` for where the broker and
settings come from).  Human output goes to stdout, errors to stderr; with
``--json`` stdout holds exactly one JSON document (``events tail``: one per
line), errors included, so scripts never parse prose.  A job id is always the
positional ``JOB_ID``, as in ``celery result``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import amqp.exceptions
import click
import kombu.exceptions

from ..amqp.broker.permissions import is_permission_refusal, permission_error
from ..spec.errors import (
    BrokerTLSError,
    ControlError,
    ControlTimeout,
    DeadLetterNotFound,
    JobEncodeError,
    JobPublishError,
    OJSConfigurationError,
    TopologyConflictError,
    TopologyPermissionError,
)
from ..spec.job_ids import is_task_id
from ..spec.naming import is_job_id
from .config import DEFAULT_BROKER, Options
from .exits import (
    EXIT_CODES,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    CLIError,
)

__all__ = ["DEFAULT_BROKER", "EXIT_CODES", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_NOT_FOUND",
           "EXIT_OK", "EXIT_TIMEOUT", "EXIT_UNREACHABLE", "EXIT_USAGE", "CLIError", "Options"]

F = TypeVar("F", bound=Callable[..., Any])
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                   r"[0-9a-fA-F]{12}$")
BROKER_HELP = ("Broker URL (ojs://, ojss://; amqp:// and amqps:// are taken as ojs:// and "
               "ojss://).  Else $OJS_BROKER_URL, $CELERY_BROKER_URL, the app's broker_url, "
               f"then {DEFAULT_BROKER}.")
APP_HELP = ("The Celery app, as for celery -A (proj, proj.celery:app; else $CELERY_APP): "
            "its broker_url and ojs_* settings are used.")


def options(ctx: click.Context) -> Options:
    return ctx.ensure_object(Options)


def store_option(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if value is not None:
        setattr(options(ctx), param.name or "", value)
    return value


def _app_option() -> Callable[[F], F]:
    return click.option("-A", "--app", "app_spec", metavar="APP", expose_value=False,
                        callback=store_option, help=APP_HELP)


def _broker_option() -> Callable[[F], F]:
    return click.option("-b", "--broker", metavar="URL", expose_value=False,
                        callback=store_option, help=BROKER_HELP)


def _apply(func: F, decorators: list[Callable[[F], F]]) -> F:
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


def global_options(func: F) -> F:
    """``-A``, ``--broker`` and ``--workdir`` before the command, as ``celery`` takes them."""
    return _apply(func, [
        _app_option(), _broker_option(),
        click.option("--workdir", type=click.Path(file_okay=False, exists=True),
                     expose_value=False, callback=store_option,
                     help="Directory to import the app from (default: the current one)."),
    ])


def common_options(func: F) -> F:
    """``-A``, ``--broker``, ``--prefix``, ``--connect-timeout`` and ``--json`` on a command;
    given here they win over the same options before the command."""
    return _apply(func, [
        _app_option(), _broker_option(),
        click.option("--prefix", expose_value=False, callback=store_option,
                     help="Topology name prefix; else $OJS_PREFIX, else the app's ojs_prefix."),
        click.option("--connect-timeout", type=click.FloatRange(min=0.1), default=5.0,
                     show_default=True, expose_value=False, callback=store_option,
                     help="Seconds to wait for the broker connection."),
        click.option("--json", "json", is_flag=True, default=False, expose_value=False,
                     callback=store_option, help="Machine-readable JSON on stdout."),
    ])


def emit(ctx: click.Context, data: Any, human: Callable[[], None] | str | None = None) -> None:
    """Print ``data`` as JSON with ``--json``, else the human form."""
    if options(ctx).json:
        click.echo(json.dumps(data, indent=2, default=str, ensure_ascii=False))
    elif callable(human):
        human()
    elif human is not None:
        click.echo(human)


def fail(ctx: click.Context, message: str, exit_code: int) -> NoReturn:
    """End a command whose output is already printed: ``message`` and the broker on stderr."""
    target = options(ctx).resolved
    click.echo(message + (f"\n  on {target.describe()}" if target else ""), err=True)
    ctx.exit(exit_code)
    raise AssertionError("unreachable")  # pragma: no cover  (ctx.exit raises)


def check_job_id(value: str, *, any_uuid: bool = False, task_id: bool = False,
                 hint: str = "JOB_ID") -> str:
    """A job id given on the command line (exit 2 when malformed).

    CANCEL and INFO take a job's OJS id (UUIDv7) or its Celery task id
    (``task_id=True``); a dead letter may come from another producer, so the
    ``dlq`` commands take any UUID.
    """
    if task_id:
        if not is_task_id(value):
            raise click.BadParameter(f"{value!r} is neither a job id nor a task id (a "
                                     "non-empty printable string of at most 255 characters)",
                                     param_hint=hint)
    elif any_uuid:
        if not _UUID.match(value):
            raise click.BadParameter(f"{value!r} is not a job id (a UUID)", param_hint=hint)
    elif not is_job_id(value):
        raise click.BadParameter(f"{value!r} is not a lowercase UUIDv7 job id",
                                 param_hint=hint)
    return value


def job_id_or_legacy(ctx: click.Context, job_id: str | None, legacy: str | None) -> str | None:
    """``JOB_ID``, or the deprecated ``--id`` (with a note on stderr)."""
    if legacy is None:
        return job_id
    click.echo("ojs-kombu: --id is deprecated: give the job id as the argument JOB_ID "
               f"(ojs-kombu {ctx.command_path.partition(' ')[2]} ... JOB_ID)", err=True)
    if job_id is not None and job_id != legacy:
        raise click.UsageError("give the job id once (JOB_ID, or the deprecated --id)")
    return legacy


def legacy_id_option(func: F) -> F:
    """The old ``--id JOB_ID`` spelling, hidden and deprecated."""
    return click.option("--id", "legacy_id", hidden=True,
                        help="Deprecated: give JOB_ID as the argument.")(func)


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
    if isinstance(exc, BrokerTLSError):  # for good: no retry, one line (kind in the text)
        return CLIError(f"cannot reach the broker: {text}", EXIT_UNREACHABLE, "unreachable")
    if isinstance(exc, TopologyPermissionError):
        return CLIError(text, EXIT_FAILED, "permission_refused")
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
    if is_permission_refusal(exc):
        return CLIError(str(permission_error(exc)), EXIT_FAILED,
                        "permission_refused")
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
    """A command whose errors become one clear message, naming the broker, and a
    documented exit code."""

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
            target = options(ctx).resolved
            if target is None or error.exit_code == EXIT_USAGE:
                where, suffix = {}, ""
            else:
                where, suffix = target.to_dict(), f"\n  on {target.describe()}"
            if options(ctx).json:
                click.echo(f"Error: {error.message}{suffix}", err=True)
                click.echo(json.dumps({"error": error.kind, "message": error.message,
                                       "exit_code": error.exit_code, **where}))
                ctx.exit(error.exit_code)
            if suffix:
                error = CLIError(error.message + suffix, error.exit_code, error.kind)
            raise error from None


class OJSGroup(click.Group):
    command_class = OJSCommand
    group_class = type
