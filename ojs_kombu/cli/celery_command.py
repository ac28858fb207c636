"""``celery ojs``: loaded by Celery's CLI at start (the ``celery.commands`` entry point).

Celery's command line loads its click plugins before it reads ``-A`` or ``-b``, so
loading this module imports ojs_kombu in every ``celery`` process: the ``ojs://``
and ``ojss://`` broker URLs resolve there even when no app module imports
ojs_kombu (``celery -b ojs://... worker`` without ``-A``).  Such a worker's app is
Celery's default app, which ``ojs_kombu.install(app)`` never wired: it stops at
start with :class:`~ojs_kombu.spec.errors.AppNotInstalledError` (exit status 1),
saying to start it with ``-A`` on a module that installs its app.  The command
itself says whether the app of ``-A`` is installed.
"""

from __future__ import annotations

from typing import Any

import click

from ..celery.app import is_installed, needs_install, uses_ojs_transport


@click.command("ojs", help="Whether the app of -A speaks OJS (ojs_kombu.install(app)).")
@click.pass_context
def ojs(ctx: click.Context) -> None:
    app: Any = ctx.obj.app
    transport = "ojs://" if uses_ojs_transport(app) else "not ojs://"
    state = "installed" if is_installed(app) else "NOT installed: call ojs_kombu.install(app)"
    click.echo(f"app {app.main!r}: broker {transport}, {state}")
    if needs_install(app):
        ctx.exit(1)
