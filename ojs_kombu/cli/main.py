"""The ``ojs-kombu`` click group and the console script entry point."""

from __future__ import annotations

import logging
import sys

import click

from . import conformance, dlq, events, jobs, migrate, topology
from .common import EXIT_CODES, OJSGroup


def _epilog() -> str:
    lines = ["\b", "Exit codes:"]
    lines += [f"  {code}  {meaning}" for code, meaning in EXIT_CODES.items()]
    return "\n".join(lines)


@click.group(cls=OJSGroup, epilog=_epilog(), context_settings={"max_content_width": 100})
@click.version_option(package_name="ojs_kombu", prog_name="ojs-kombu")
def cli() -> None:
    """Inspect and operate OJS jobs on RabbitMQ (ojs_kombu).

    Every command takes --broker (env OJS_BROKER_URL), --prefix and --json;
    run `ojs-kombu COMMAND --help` for its options.
    """


for command in (topology.topology, jobs.enqueue, jobs.cancel, jobs.info, dlq.dlq,
                events.events, conformance.conformance, migrate.migrate):
    cli.add_command(command)


def main(argv: list[str] | None = None) -> None:
    """Console script entry point."""
    logging.basicConfig(level=logging.WARNING, format="ojs-kombu: %(levelname)s: %(message)s")
    cli.main(args=argv, prog_name="ojs-kombu")


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
