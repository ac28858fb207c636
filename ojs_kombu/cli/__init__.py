"""``ojs-kombu``: the command line of ojs_kombu (topology, jobs, dead letters, events,
a live conformance check and a migration check for Celery apps).

The top layer of the package: it may import any module of ``ojs_kombu``;
nothing in the package imports it.  Entry point: :func:`ojs_kombu.cli.main.main`.
"""

from __future__ import annotations

from .common import EXIT_CODES
from .main import cli, main

__all__ = ["EXIT_CODES", "cli", "main"]
