"""The ``ojs-kombu`` click group and the console script entry point."""

from __future__ import annotations

import logging
import sys
import textwrap

import click

from . import conformance, dedup, dlq, events, jobs, migrate, topology
from .common import EXIT_CODES, OJSGroup, global_options


def _epilog() -> str:
    lines = ["\b", "Exit codes:"]
    for code, meaning in EXIT_CODES.items():
        lines += textwrap.wrap(f"{code}  {meaning}", 94, initial_indent="  ",
                               subsequent_indent=" " * (len(str(code)) + 4))
    return "\n".join(lines)


@click.group(cls=OJSGroup, epilog=_epilog(), context_settings={"max_content_width": 100})
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


for command in (topology.topology, jobs.enqueue, jobs.cancel, jobs.info, dlq.dlq, dedup.dedup,
                events.events, conformance.conformance, migrate.migrate):
    cli.add_command(command)


def main(argv: list[str] | None = None) -> None:
    """Console script entry point."""
    logging.basicConfig(level=logging.WARNING, format="ojs-kombu: %(levelname)s: %(message)s")
    cli.main(args=argv, prog_name="ojs-kombu")


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
