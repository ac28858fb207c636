"""Where a command gets its broker and OJS settings: the options, the environment, the app.

Celery's conventions: ``-A/--app`` names the Celery app (``CELERY_APP``), whose
``broker_url``, ``broker_use_ssl``, ``broker_transport_options`` and ``ojs_*``
settings (prefix, queue aliases, queue settings) the command then uses, so it
sees the same entities as the app's workers.  The broker URL is the first of:

1. ``--broker`` / ``-b`` (after the command, else before it);
2. ``OJS_BROKER_URL`` (this tool's own variable);
3. ``CELERY_BROKER_URL`` (as ``celery``, which also lets it beat the app);
4. the app's ``broker_url``;
5. ``ojs://guest:guest@localhost:5672//``.

The prefix is ``--prefix``, else ``OJS_PREFIX``, else the app's ``ojs_prefix``.
Nothing here connects: errors name the broker (password masked), its vhost and
where the URL came from, so a wrong vhost is never a silent "unknown queue".
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import kombu

from ..amqp.binding import Binding
from ..amqp.broker.entities import extra_arguments
from ..spec.errors import OJSConfigurationError
from ..spec.settings import BINDING_OPTION, CELERY_MAX_PRIORITY, OPTION_PREFIX, OJSSettings
from .exits import EXIT_USAGE, CLIError

DEFAULT_BROKER = "ojs://guest:guest@localhost:5672//"
#: Broker URL schemes taken as the OJS transport on the same broker.
_SCHEMES = {"amqp": "ojs", "pyamqp": "ojs", "amqps": "ojss"}
_PASSWORD = re.compile(r"(://[^:/@;]*:)[^@;]*@")


def broker_url(url: str) -> str:
    """``amqp://`` is taken as ``ojs://`` (same broker, the OJS transport on top)."""
    scheme, sep, rest = url.partition("://")
    return f"{_SCHEMES.get(scheme, scheme)}{sep}{rest}" if sep else url


def mask(url: str) -> str:
    """``url`` without its password, for URLs kombu cannot parse either."""
    return _PASSWORD.sub(r"\1**@", url)


def load_app(spec: str, workdir: str | None = None) -> Any:
    """Import a Celery app the way ``celery -A`` does (the current directory is importable)."""
    from celery.app.utils import find_app

    directory = os.path.abspath(workdir or os.getcwd())
    if directory not in sys.path:
        sys.path.insert(0, directory)
    try:
        return find_app(spec)
    except Exception as exc:  # an app that fails to import is a usage error, said plainly
        raise CLIError(f"cannot load the Celery app {spec!r}: {type(exc).__name__}: {exc}",
                       EXIT_USAGE, "invalid_input") from None


@dataclass(frozen=True)
class BrokerTarget:
    """The broker a command talks to, and where its URL came from."""

    url: str
    source: str

    @property
    def uri(self) -> str:
        """The URL with its password masked (kombu's ``as_uri``)."""
        with suppress(Exception):
            return str(kombu.Connection(self.url).as_uri())
        return mask(self.url)

    @property
    def vhost(self) -> str:
        with suppress(Exception):
            return str(kombu.Connection(self.url).virtual_host)
        return "?"

    def describe(self) -> str:
        return f"broker {self.uri} (vhost {self.vhost!r}, URL from {self.source})"

    def to_dict(self) -> dict[str, str]:
        return {"broker": self.uri, "vhost": self.vhost, "broker_source": self.source}


@dataclass
class Options:
    """The shared options of the running command (``ctx.obj``), resolved on first use."""

    broker: str | None = None
    app_spec: str | None = None
    workdir: str | None = None
    prefix: str | None = None
    json: bool = False
    connect_timeout: float = 5.0
    _app: Any = field(default=None, repr=False)
    _target: BrokerTarget | None = field(default=None, repr=False)
    _binding: Binding | None = field(default=None, repr=False)

    @property
    def app_name(self) -> str | None:
        return self.app_spec or os.environ.get("CELERY_APP") or None

    def app(self) -> Any | None:
        """The Celery app of ``-A``/``CELERY_APP`` (imported once), or ``None``."""
        if self._app is None and self.app_name:
            self._app = load_app(self.app_name, self.workdir)
        return self._app

    @property
    def resolved(self) -> BrokerTarget | None:
        """The broker, if the command got as far as choosing one."""
        return self._target

    def target(self) -> BrokerTarget:
        if self._target is None:
            self._target = self._resolve()
        return self._target

    def _resolve(self) -> BrokerTarget:
        if self.broker:
            return BrokerTarget(broker_url(self.broker), "--broker")
        for variable in ("OJS_BROKER_URL", "CELERY_BROKER_URL"):
            if os.environ.get(variable):
                return BrokerTarget(broker_url(os.environ[variable]), variable)
        app = self.app()
        if app is not None:
            url = app.conf.get("broker_url")
            if isinstance(url, (list, tuple)):
                url = ";".join(url)
            if url:
                return BrokerTarget(broker_url(str(url)), f"the broker_url of app {app.main!r}")
        return BrokerTarget(DEFAULT_BROKER, "the default (no --broker, OJS_BROKER_URL, "
                                            "CELERY_BROKER_URL or -A APP)")

    def binding(self) -> Binding:
        """The OJS settings the command works with (no broker needed)."""
        if self._binding is None:
            self._binding = self._build_binding()
        return self._binding

    def _build_binding(self) -> Binding:
        app = self.app()
        conf: Mapping[str, Any] = app.conf if app is not None else {}
        values = {k: v for k, v in conf.items()
                  if isinstance(k, str) and k.startswith(OPTION_PREFIX)}
        values[CELERY_MAX_PRIORITY] = conf.get(CELERY_MAX_PRIORITY)
        prefix = self.prefix if self.prefix is not None else os.environ.get("OJS_PREFIX")
        if prefix is not None:
            values["ojs_prefix"] = prefix
        source = f"the Celery app {app.main!r}" if app is not None else "--prefix or OJS_PREFIX"
        binding = Binding.from_settings(OJSSettings.from_options(values, source=source))
        for queue in conf.get("task_queues") or ():
            with suppress(OJSConfigurationError):  # a queue its workers would refuse anyway
                binding.add_queue_arguments(binding.names.ojs_queue(queue.name),
                                            extra_arguments(queue))
        return binding

    def connection(self) -> kombu.Connection:
        """A new, unconnected connection to the broker with the app's connection settings."""
        app = self.app()
        conf: Mapping[str, Any] = app.conf if app is not None else {}
        transport_options = {**(conf.get("broker_transport_options") or {}),
                             BINDING_OPTION: self.binding()}
        kwargs: dict[str, Any] = {}
        if conf.get("broker_use_ssl"):
            kwargs["ssl"] = conf["broker_use_ssl"]
        if conf.get("broker_login_method"):
            kwargs["login_method"] = conf["broker_login_method"]
        target = self.target()
        try:
            return kombu.Connection(target.url, connect_timeout=self.connect_timeout,
                                    transport_options=transport_options, **kwargs)
        except (KeyError, ValueError, ImportError) as exc:  # unknown scheme, bad URL
            raise CLIError(f"invalid broker URL {target.uri} (from {target.source}): {exc}",
                           EXIT_USAGE, "invalid_input") from None

    def connection_for_write(self) -> kombu.Connection:
        """What :class:`~ojs_kombu.amqp.broker.control.ControlClient` asks an app for."""
        return self.connection()
