"""Exit codes scripts can rely on, and the error that carries one.

Also in ``ojs-kombu --help`` and the docs' "Command line" page, whose table is
written from :data:`EXIT_CODES`.
"""

from __future__ import annotations

import click

from ..spec.errors import Picklable

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_NOT_FOUND = 4
EXIT_TIMEOUT = 5
EXIT_INTERRUPTED = 130
EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_FAILED: "a check failed, something blocks the switch, the broker refused the "
                 "operation (topology conflict, nack, unroutable, no confirm), a worker "
                 "answered INFO with an error, or a confirmation was declined",
    EXIT_USAGE: "usage error or invalid input (bad option, invalid JSON, job id, type, queue "
                "or broker URL, an app that cannot be imported)",
    EXIT_UNREACHABLE: "the broker cannot be reached (connection refused, DNS, login, vhost, a "
                      "TLS handshake refused for good), "
                      "or the dedup store cannot",
    EXIT_NOT_FOUND: "unknown queue, unknown job (info: not_found or unknown), no such "
                    "dead letter, or no such dedup record",
    EXIT_TIMEOUT: "no answer in time (INFO), or events tail --count not reached by --timeout",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C); nothing is lost, see the command's help",
}


class CLIError(Picklable, click.ClickException):
    """An error with its exit code and a short machine-readable kind."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED, kind: str = "failed") -> None:
        super().__init__(message)
        # click types exit_code as a class variable, but reads it from the instance
        self.exit_code = exit_code  # type: ignore[misc]
        self.kind = kind
