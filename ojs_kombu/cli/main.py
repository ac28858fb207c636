"""The ``ojs-kombu`` click group and the console script entry point."""

from __future__ import annotations

import importlib
import logging
import sys
import textwrap

import click

from .common import EXIT_CODES, OJSGroup, global_options

#: Each command and where it is defined (``module:attribute`` under ``ojs_kombu.cli``),
#: imported only when asked for: ``ojs-kombu dlq list`` does not load the conformance
#: worker or the migration check (click's lazy group).
COMMANDS = {
    "cancel": "jobs:cancel", "conformance": "conformance:conformance", "dedup": "dedup:dedup",
    "dlq": "dlq:dlq", "enqueue": "jobs:enqueue", "events": "events:events",
    "info": "jobs:info", "migrate": "migrate:migrate", "topology": "topology:topology",
}


class LazyGroup(OJSGroup):
    """The top group: its commands load on first use (:data:`COMMANDS`)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS and cmd_name not in self.commands:
            module, _, attribute = COMMANDS[cmd_name].partition(":")
            command = getattr(importlib.import_module(f"{__package__}.{module}"), attribute)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)


def _epilog() -> str:
    lines = ["\b", "Exit codes:"]
    for code, meaning in EXIT_CODES.items():
        lines += textwrap.wrap(f"{code}  {meaning}", 94, initial_indent="  ",
                               subsequent_indent=" " * (len(str(code)) + 4))
    return "\n".join(lines)


@click.group(cls=LazyGroup, epilog=_epilog(), context_settings={"max_content_width": 100})
@click.version_option(package_name="ojs_kombu", prog_name="ojs-kombu")
@global_options
def cli() -> None:
    """Inspect and operate OJS jobs on RabbitMQ (ojs_kombu).

    As with celery, -A APP and --broker go before the command (every command
    also takes them, with --prefix and --json, after it).  The broker URL is
    the first of: --broker, $OJS_BROKER_URL, $CELERY_BROKER_URL, the app's
    broker_url, ojs://guest:guest@localhost:5672//.  With -A the app's ojs_*
    settings (prefix, queue aliases, queue settings) apply.  A job id is the
    argument JOB_ID.  Run `ojs-kombu COMMAND --help` for a command's options.
    """


def main(argv: list[str] | None = None) -> None:
    """Console script entry point."""
    logging.basicConfig(level=logging.WARNING, format="ojs-kombu: %(levelname)s: %(message)s")
    cli.main(args=argv, prog_name="ojs-kombu")


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
