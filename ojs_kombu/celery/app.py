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

from typing import Any

from celery import Celery
from celery.signals import worker_process_shutdown, worker_shutdown, worker_shutting_down

from ..amqp.publishing.deferred import flush_on_signal
from ..amqp.wire.read_ahead import wake_loops
from ..spec.errors import OJSConfigurationError
from .app_amqp import OJSAMQP
from .celery_seam import verify_celery
from .conf import configure_when_loaded
from .control_queues import ControlQueues
from .dropped import DroppedJobs
from .events import WorkerEvents
from .inline_acks import InlineJobAcks
from .preflight import OJSPreflight
from .reconnect import ConsumerReconnections, PermanentConnectFailure
from .task import OJSTask
from .task_ids import use_uuid7_task_ids

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


def is_installed(app: Celery) -> bool:
    """Whether ``install()`` already wired ``app`` (its ack settings then come from it)."""
    return bool(getattr(app, _INSTALLED_FLAG, False))


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
