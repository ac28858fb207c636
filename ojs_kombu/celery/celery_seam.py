"""Every private member of Celery that ojs_kombu uses: the Celery seam.

Checked with Celery 5.5.3, 5.6.3 and 5.7.0 (:data:`CHECKED`).  Each use is a
:class:`~ojs_kombu.spec.seams.Hook` in :data:`HOOKS`, pinned by
``tests/test_seams.py`` and checked by :func:`verify_celery` when
``install(app)`` runs: a missing one refuses with
:class:`~ojs_kombu.spec.errors.UnsupportedDependencyError` naming it, before
any worker starts.  The Redis result backend's hook (which loads the redis client and,
through it, OpenTelemetry's SDK) is checked only where a Redis backend is in use: by
:func:`verify_result_backend`, at the start of a worker and before the first chord
header task is published.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable
from functools import cache
from typing import Any, TypeVar

from celery import canvas
from celery.app import amqp as celery_amqp
from celery.app.task import Task
from celery.events.dispatcher import EventDispatcher
from celery.worker.request import Request

from ..spec.seams import Hook, source_uses, verify

_REDIS_BACKEND = "celery.backends.redis"

CHECKED = "5.5.3, 5.6.3, 5.7.0"

_T = TypeVar("_T")

#: A chain built with ``|`` (``celery.canvas.chain`` makes these, and is one itself).
Chain: type = canvas._chain


def _hook(owner: Any, member: str, why: str, params: tuple[str, ...] | None = None,
          probe: Callable[[], bool] | None = None) -> Hook:
    return Hook("Celery", "celery", owner, member, why, CHECKED, params, probe)


@cache
def _redis_backend() -> Any:
    """Celery's Redis result backend module, imported on first need (``None`` without the
    redis client, an optional dependency: then there is no Redis backend to mind)."""
    try:
        return importlib.import_module(_REDIS_BACKEND)
    except ImportError:  # pragma: no cover  (no client)
        return None


@cache
def _chord_done_marker() -> str | None:
    """The key suffix of the Redis backend's chord done marker (``".c"``, Celery 5.7), or
    ``""`` when the backend has none (its chords have no such race)."""
    redis_backend = _redis_backend()
    if redis_backend is None:
        return ""
    source = inspect.getsource(redis_backend)
    if "done_marker" not in source:
        return ""
    set_size = inspect.getsource(redis_backend.RedisBackend.set_chord_size)
    return ".c" if "'.c'" in set_size or '".c"' in set_size else None


#: The hooks every app needs, checked by ``install(app)``.
CORE_HOOKS: tuple[Hook, ...] = (
    _hook(celery_amqp.AMQP, "_create_task_sender", "publishing every task as an OJS job "
          "through Celery's own send path (celery/task_sender.py)", ()),
    _hook(celery_amqp.AMQP, "_producer_pool", "producers of the app's own class",
          probe=source_uses(celery_amqp.AMQP, "self._producer_pool")),
    _hook(celery_amqp.Queues, "_add", "making every queue of the table a job queue",
          ("queue",)),
    _hook(Request, "_announce_revoked", "acking a cancelled job and emitting job.cancelled",
          ("reason", "terminated", "signum", "expired")),
    _hook(Request, "_context", "the task request a retry's result is stored with",
          probe=lambda: inspect.getattr_static(Request, "_context", None) is not None),
    _hook(Task, "_get_exec_options", "a task's own options in enqueue_many", ()),
    _hook(canvas, "_chain", "telling chains from single signatures in enqueue_many",
          probe=lambda: isinstance(canvas.chain(), canvas._chain)),
    _hook(EventDispatcher, "_group_buffer", "flushing buffered task events without losing "
          "one a pool thread adds meanwhile (celery/events.py)",
          probe=source_uses(EventDispatcher, "self._group_buffer = defaultdict(list)")),
    _hook(EventDispatcher, "_publish", "publishing the buffered task events taken",
          ("event", "producer", "routing_key", "retry", "retry_policy", "utcoffset")),
)


@cache
def redis_backend_hooks() -> tuple[Hook, ...]:
    """The Redis result backend's hooks (none without the redis client)."""
    redis_backend = _redis_backend()
    if redis_backend is None:
        return ()
    return (_hook(redis_backend.RedisBackend, "set_chord_size", "clearing a re-applied "
                  "chord's done marker before its first header task is published "
                  "(celery/task_sender.py)", ("group_id", "chord_size"),
                  probe=lambda: _chord_done_marker() is not None),)


def __getattr__(name: str) -> Any:
    """``HOOKS``: every hook of the seam, the Redis backend's included (loads it)."""
    if name == "HOOKS":
        return CORE_HOOKS + redis_backend_hooks()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@cache
def verify_celery() -> None:
    """Refuse to start on a Celery without the hooks (once per process)."""
    verify(CORE_HOOKS)


def _is_redis_backend(backend: Any) -> bool:
    """Whether ``backend`` is Celery's Redis result backend (or a subclass); a backend of
    that class means its module is loaded, so this never imports it."""
    redis_backend = sys.modules.get(_REDIS_BACKEND)
    return redis_backend is not None and isinstance(backend, redis_backend.RedisBackend)


def verify_result_backend(backend: Any) -> None:
    """Refuse, with :class:`~ojs_kombu.spec.errors.UnsupportedDependencyError`, a Redis
    result backend whose Celery lacks its hook (other backends have none)."""
    if _is_redis_backend(backend):
        _verify_redis_backend()


@cache
def _verify_redis_backend() -> None:
    verify(redis_backend_hooks())


# -- the uses ------------------------------------------------------------------------


def producer_pool(amqp: celery_amqp.AMQP) -> Any:
    """The app's producer pool if made (``None`` before its first use)."""
    return amqp._producer_pool


def exec_options(task: Task) -> dict[str, Any]:
    """The options ``apply_async`` takes from the task itself (queue, priority, ...)."""
    return task._get_exec_options()


def request_context(request: Request) -> Any:
    """The task request Celery stores results and retries with."""
    return request._context


def set_default_consume_from(queues: celery_amqp.Queues, consume_from: dict[str, Any]) -> None:
    """What the worker consumes without ``-Q`` (Celery 5.7+ keeps it apart, keyed by AMQP
    name; 5.5 and 5.6 compute it from the table)."""
    if "_default_consume_from" in vars(queues):
        queues._default_consume_from = consume_from


def amqp_hooks(cls: type[_T]) -> type[_T]:
    """Celery's ``AMQP._create_task_sender`` returns ``cls.wrap_task_sender(sender)`` of
    Celery's own sender."""

    def _create_task_sender(self: Any) -> Any:
        return self.wrap_task_sender(super(cls, self)._create_task_sender())

    cls._create_task_sender = _create_task_sender  # type: ignore[attr-defined]
    return cls


def queues_hooks(cls: type[_T]) -> type[_T]:
    """Celery's ``Queues._add`` is ``cls.add_queue``."""
    cls._add = cls.add_queue  # type: ignore[attr-defined]
    return cls


def request_hooks(cls: type[_T]) -> type[_T]:
    """Celery's ``Request._announce_revoked`` calls ``cls.on_revoked(expired)`` first and
    ``cls.after_revoked(expired)`` after it."""

    def _announce_revoked(self: Any, reason: Any, terminated: Any, signum: Any,
                          expired: Any) -> None:
        self.on_revoked(expired)
        super(cls, self)._announce_revoked(reason, terminated, signum, expired)
        self.after_revoked(reason, expired)

    cls._announce_revoked = _announce_revoked  # type: ignore[attr-defined]
    return cls


def clear_chord_done_marker(backend: Any, group_id: str) -> None:
    """Clear the done marker a previous run of the chord ``group_id`` left, as Celery's
    Redis backend does in ``set_chord_size`` (a frozen chord applied again is a new run).

    Celery clears it just before it publishes the last header task; with confirmed
    publishes a worker can finish an earlier header task before that, and Celery then
    drops its result and never calls the body.  Called as the first header task is
    published; other backends have no marker."""
    if not _is_redis_backend(backend):
        return
    _verify_redis_backend()
    suffix = _chord_done_marker()
    if suffix:
        backend.ensure(backend.client.delete, (backend.get_key_for_group(group_id, suffix),))


def flush_task_events(dispatcher: EventDispatcher) -> None:
    """``dispatcher.flush()`` without its race: Celery publishes a group's buffered events
    and then empties the list, so an event a threads-pool thread appended meanwhile
    (``task-started``, ``task-succeeded``) is dropped unsent (Celery 5.5 and 5.6; 5.7
    keeps them, as this does).  Here only the events taken are removed (a copy and a
    ``del`` of that many, each atomic), under the dispatcher's mutex as Celery's flush
    holds it."""
    if dispatcher.producer is None:  # closed
        return
    dispatcher.flush(errors=True, groups=False)
    with dispatcher.mutex:
        for group, events in list(dispatcher._group_buffer.items()):
            taken = events[:]
            if taken:
                del events[:len(taken)]
                dispatcher._publish(taken, dispatcher.producer, f"{group}.multi")


def around_purge_command(wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Run Celery's ``celery purge`` command through ``wrap(callback)`` (once: a callback
    already wrapped is left alone).  Click looks the callback up when the command runs,
    after ``-A`` loaded the app, so installing an app wires the command.  (The command's
    ``callback`` is click's public attribute; integration/test_purge.py runs the command.)"""
    from celery.bin import purge as purge_command  # Celery's command line: loaded on use

    command = purge_command.purge
    if not getattr(command.callback, "ojs_wrapped", False):
        wrapped = wrap(command.callback)
        wrapped.ojs_wrapped = True  # type: ignore[attr-defined]
        command.callback = wrapped
