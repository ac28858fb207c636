"""Which task a Celery app's own sender is publishing on this thread right now.

A task message reaches the transport with a ``task`` header either from a Celery
app's sender (``send_task_message``, which fires ``before_task_publish`` first)
or from any other kombu producer (documented: published as the same job).  An
installed app's connections carry its binding and never hand the transport a
task message; so a task message on a connection without an app's binding that a
Celery sender announced comes from an app that ``ojs_kombu.install(app)`` never
wired, and is refused (:class:`~ojs_kombu.spec.errors.AppNotInstalledError`)
before anything is published.  Other kombu producers announce nothing and
publish as before.  The Celery floor makes the announcements
(:mod:`ojs_kombu.celery.app`), by task id, so a stale one matches nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

from ...spec.errors import AppNotInstalledError

_SENDING: ContextVar[str | None] = ContextVar("ojs_kombu_app_sending", default=None)


def announce_app_send(task_id: str | None) -> None:
    """A Celery app's sender is about to publish the task message of ``task_id``."""
    _SENDING.set(task_id)


def end_app_send() -> None:
    """The announced publish is over."""
    _SENDING.set(None)


def refuse_uninstalled_send(headers: Mapping[str, Any]) -> None:
    """Raise :class:`AppNotInstalledError` when a Celery app's sender announced this
    task message (called for connections without an installed app's binding)."""
    task_id = headers.get("id")
    if task_id is not None and task_id == _SENDING.get():
        raise AppNotInstalledError(f"task {headers.get('task')!r} (id {task_id}) was sent")
