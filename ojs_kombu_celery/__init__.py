"""``ojs://`` for every ``celery`` command, and the ``celery ojs`` command.

Celery's command line loads its click plugins (the ``celery.commands`` entry point,
``pyproject.toml``) in every ``celery`` process, before it reads ``-A`` or ``-b``.  This
package is that plugin, and it sits outside ``ojs_kombu`` on purpose: importing
ojs_kombu here would load it (pydantic, OpenTelemetry, its checks of py-amqp's and
kombu's private hooks) into every worker of every app in the environment, those that
never use it included, and before the app module had its say.  So it only:

* names the ``ojs`` and ``ojss`` transports for kombu, so that ``ojs://`` resolves
  even when no app module imports ojs_kombu (``celery -b ojs://... worker``);
* at ``worker_init``, for an app whose broker is ``ojs://`` and that nothing imported
  ojs_kombu for, imports it and lets it refuse the worker: such an app was never
  wired by ``ojs_kombu.install(app)``, and its worker stops at start with
  :class:`~ojs_kombu.AppNotInstalledError` saying what to do;
* defines ``celery -A proj ojs`` (whether the app speaks OJS), importing ojs_kombu
  when it runs.
"""

from __future__ import annotations

import sys
from typing import Any

import click
from celery.signals import worker_init
from kombu.transport import TRANSPORT_ALIASES

#: The transports' home in ojs_kombu (``ojs_kombu.amqp.transport`` names them the same).
TRANSPORT_MODULE = "ojs_kombu.amqp.transport"
TRANSPORT_ALIASES.setdefault("ojs", f"{TRANSPORT_MODULE}:Transport")
TRANSPORT_ALIASES.setdefault("ojss", f"{TRANSPORT_MODULE}:SSLTransport")

_BROKER_SETTINGS = ("broker_url", "broker_read_url", "broker_write_url", "broker_transport")


def names_ojs(conf: Any) -> bool:
    """Whether an app's broker settings name the ``ojs``/``ojss`` transport (by scheme,
    alias or ``ojs_kombu`` dotted path), read without importing ojs_kombu."""
    for setting in _BROKER_SETTINGS:
        value = conf.get(setting)
        for url in value if isinstance(value, (list, tuple)) else [value]:
            for part in str(url or "").split(";"):
                name = part.strip().split("://", 1)[0]
                if name in ("ojs", "ojss") or name.startswith("ojs_kombu"):
                    return True
    return False


@worker_init.connect(weak=False)
def _worker_of_an_ojs_app(sender: Any, **_: Any) -> None:
    """A worker whose app is on ``ojs://`` while nothing imported ojs_kombu: ojs_kombu's
    own ``worker_init`` check was never connected, so run it now."""
    if "ojs_kombu" in sys.modules or not names_ojs(sender.app.conf):
        return
    from ojs_kombu.celery.app import refuse_uninstalled_worker

    refuse_uninstalled_worker(sender)


@click.command("ojs", help="Whether the app of -A speaks OJS (ojs_kombu.install(app)).")
@click.pass_context
def ojs(ctx: click.Context) -> None:
    from ojs_kombu.cli.celery_command import describe

    text, status = describe(ctx.obj.app)
    click.echo(text)
    if status:
        ctx.exit(status)
