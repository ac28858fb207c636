"""What ``celery -A proj ojs`` says about an app (the command itself is defined in
``ojs_kombu_celery``, the plugin Celery's CLI loads at start, which imports this
module only when the command runs)."""

from __future__ import annotations

from typing import Any

from ..celery.app import is_installed, needs_install, uses_ojs_transport


def describe(app: Any) -> tuple[str, int]:
    """The line ``celery ojs`` prints for ``app`` and its exit status (1: an ``ojs://``
    app that ``ojs_kombu.install(app)`` never wired)."""
    transport = "ojs://" if uses_ojs_transport(app) else "not ojs://"
    state = "installed" if is_installed(app) else "NOT installed: call ojs_kombu.install(app)"
    return f"app {app.main!r}: broker {transport}, {state}", 1 if needs_install(app) else 0
