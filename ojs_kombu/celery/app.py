"""``ojs_kombu.install(app)``: the list of what it wires, each part in its own room.

* the app's AMQP layer is an :class:`~ojs_kombu.celery.app_amqp.OJSAMQP`: the
  app's OJS binding, every task queue an OJS job queue
  (:mod:`ojs_kombu.celery.queues`), connections that carry the binding to the
  ``ojs`` transport, and a sender that refuses non-JSON arguments;
* :class:`~ojs_kombu.celery.task.OJSTask` is the app's task base, so failed
  attempts are retried by the broker (where ``ojs_retry_semantics`` says they
  are retried: by default only where Celery would retry them);
* Celery mints UUIDv7 task ids, so a task id *is* the OJS job id;
* once the configuration is loaded (Celery's ``on_after_configure`` signal),
  OJS delivery semantics, the ``ojs`` content type and no pickle
  (:mod:`ojs_kombu.celery.conf`);
* a worker (and each prefork pool process) waits for the confirms of jobs its
  tasks published without waiting (``ojs_publish_confirms = "deferred"``)
  before it exits;
* a worker's warm shutdown starts at once (its event loop is woken, not left
  to finish a poll of up to 10 s);
* worker bootsteps: the preflight that refuses a worker that cannot speak OJS
  (:mod:`ojs_kombu.celery.preflight`), worker events, the control queues,
  reconnection reports, the dropped jobs of ``drop_oldest`` queues and the
  ``solo`` pool's inline acks.
"""

from __future__ import annotations

import logging
from typing import Any

import kombu
from celery import Celery, bootsteps
from celery.signals import (
    after_task_publish,
    before_task_publish,
    worker_init,
    worker_process_shutdown,
    worker_shutdown,
    worker_shutting_down,
)
from kombu.transport import resolve_transport

from ..amqp.publishing.app_sends import announce_app_send, end_app_send
from ..amqp.publishing.deferred import flush_on_signal
from ..amqp.transport import Transport
from ..amqp.wire.read_ahead import wake_loops
from ..spec.errors import AppNotInstalledError, OJSConfigurationError
from .app_amqp import OJSAMQP
from .celery_seam import verify_celery
from .conf import configure_when_loaded
from .control_queues import ControlQueues
from .dropped import DroppedJobs
from .events import WorkerEvents
from .inline_acks import InlineJobAcks
from .preflight import OJSPreflight
from .purge import wire_purge_command
from .reconnect import ConsumerReconnections, PermanentConnectFailure
from .task import OJSTask
from .task_ids import use_uuid7_task_ids

logger = logging.getLogger(__name__)

_INSTALLED_FLAG = "_ojs_kombu_installed"


def install(app: Celery) -> Celery:
    """Make ``app`` publish and consume OJS jobs; call it right after creating the app.

    The broker URL selects the transport (``ojs://user:pass@host:5672/vhost``);
    ``install`` wires the rest.  Idempotent.
    """
    if is_installed(app):
        return app
    _refuse_started(app)
    verify_celery()  # UnsupportedDependencyError names each private hook Celery lacks
    app.amqp_cls = OJSAMQP
    if app.task_cls == Celery.task_cls:
        app.task_cls = f"{OJSTask.__module__}:OJSTask"
    use_uuid7_task_ids()
    configure_when_loaded(app)
    _add_bootsteps(app)
    wire_purge_command()  # celery purge -Q email: the job queue ojs.queue.email
    setattr(app, _INSTALLED_FLAG, True)
    return app


@worker_shutting_down.connect(weak=False)
def _start_shutdown_now(**_: Any) -> None:
    """SIGTERM (or SIGINT, SIGQUIT) reached the worker: Celery's handler sets the flag
    its event loop checks between polls, and the poll may sleep up to 10 s before it
    looks; waking the ``ojs`` connections' loops makes it look at once."""
    wake_loops()


# Jobs tasks published without waiting for their confirms (ojs_publish_confirms =
# "deferred") are confirmed before the worker, or a prefork pool process, exits.
worker_shutdown.connect(flush_on_signal, weak=False)
worker_process_shutdown.connect(flush_on_signal, weak=False)


@before_task_publish.connect(weak=False)
def _announce_send(headers: dict[str, Any] | None = None, **_: Any) -> None:
    """Celery's sender is about to publish: the transport refuses the message when the
    app was never installed (:mod:`ojs_kombu.amqp.publishing.app_sends`)."""
    announce_app_send((headers or {}).get("id"))


@after_task_publish.connect(weak=False)
def _end_send(**_: Any) -> None:
    end_app_send()


@worker_init.connect(weak=False)
def refuse_uninstalled_worker(sender: Any, **_: Any) -> None:
    """A worker of an app on ``ojs://`` that ``install()`` never wired does not start
    (its first worker bootstep raises :class:`AppNotInstalledError`).  ``worker_init``
    comes before the worker builds its bootsteps, for ``celery worker`` and for
    ``celery.contrib.testing``'s in-process workers alike."""
    app = sender.app
    if needs_install(app):
        app.steps["worker"].add(RefuseUninstalledWorker)


class RefuseUninstalledWorker(bootsteps.Step):
    """Worker bootstep: stops the start of a worker whose app was never installed."""

    name = "ojs_kombu.not_installed"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        if needs_install(parent.app):
            error = AppNotInstalledError(f"worker of app {parent.app.main!r} started")
            logger.critical("worker cannot start: AppNotInstalledError: %s", error)
            raise error
        super().__init__(parent, **kwargs)


def is_installed(app: Celery) -> bool:
    """Whether ``install()`` already wired ``app`` (its ack settings then come from it)."""
    return bool(getattr(app, _INSTALLED_FLAG, False))


def uses_ojs_transport(app: Celery) -> bool:
    """Whether ``app``'s broker (``broker_url``, ``broker_read_url``,
    ``broker_write_url``, ``broker_transport``) selects the ``ojs``/``ojss``
    transport, by alias or dotted path; a setting may be a failover list of URLs, as
    kombu takes it.  Reads the configuration only: the app's AMQP layer is not
    created (``install()`` must come before it)."""
    conf = app.conf
    urls: list[Any] = []
    for setting in (conf.broker_read_url, conf.broker_write_url, conf.broker_url):
        urls.extend(setting if isinstance(setting, list | tuple) else [setting])
    for url in dict.fromkeys(urls):
        if not url and not conf.broker_transport:
            continue
        transport = kombu.Connection(url, transport=conf.broker_transport).transport_cls
        try:
            cls = resolve_transport(transport)
        except (KeyError, ImportError, ValueError):
            continue  # kombu says so itself when the app connects
        if isinstance(cls, type) and issubclass(cls, Transport):
            return True
    return False


def needs_install(app: Celery) -> bool:
    """Whether ``app`` names an ``ojs://`` broker but ``ojs_kombu.install(app)`` never
    ran on it: such an app would publish Celery messages that no OJS worker reads
    and consume a queue no OJS producer fills, so its worker and its publishes are
    refused (:class:`RefuseUninstalledWorker`,
    :class:`~ojs_kombu.spec.errors.AppNotInstalledError`)."""
    return not is_installed(app) and uses_ojs_transport(app)


def _refuse_started(app: Celery) -> None:
    """``app.amqp`` is created once: one made before ``install()`` keeps Celery's
    queues and connections, whatever ``install()`` wires after it."""
    if "amqp" in app.__dict__ and not isinstance(app.__dict__["amqp"], OJSAMQP):
        raise OJSConfigurationError(
            f"ojs_kombu.install({app.main!r}) ran after the app's AMQP layer was created; "
            "call it right after Celery(...), before the app sends or consumes anything"
        )


def _add_bootsteps(app: Celery) -> None:
    app.steps["worker"].add(OJSPreflight)
    for step in (WorkerEvents, ControlQueues, DroppedJobs, ConsumerReconnections,
                 PermanentConnectFailure, InlineJobAcks):
        app.steps["consumer"].add(step)
