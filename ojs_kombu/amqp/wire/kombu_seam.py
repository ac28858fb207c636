"""Every private member of kombu that ojs_kombu uses: the kombu seam.

Checked with kombu 5.5.4, 5.6.2 and 5.7.0 (:data:`CHECKED`).  Each use is a
:class:`~ojs_kombu.spec.seams.Hook` in :data:`HOOKS`, pinned by
``tests/test_seams.py``.  :func:`fallbacks` checks them once per process: a
missing event-loop reader hook makes the transport read frames with py-amqp's
own reader (kombu's own loop reader then reads as always); any other missing
hook refuses to start with
:class:`~ojs_kombu.spec.errors.UnsupportedDependencyError`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from functools import cache
from typing import Any, TypeVar

import kombu
import kombu.utils.json as kombu_json
from kombu.asynchronous import get_event_loop, set_event_loop
from kombu.message import Message
from kombu.transport import base

from ...spec.seams import Hook, verify
from ...spec.typed_values import BUILTIN_TYPES, use_registered_types
from .py_amqp_seam import NO_READ_AHEAD

CHECKED = "5.5.4, 5.6.2, 5.7.0"

_T = TypeVar("_T")


def _decoded_cache_is_read() -> bool:
    message = Message(body=b"[1]", content_type="application/json")
    message._decoded_cache = {"decoded": "ahead"}
    return message.decode() == {"decoded": "ahead"}


def _hook(owner: Any, member: str, why: str, params: tuple[str, ...] | None = None,
          probe: Callable[[], bool] | None = None, fallback: str | None = None) -> Hook:
    return Hook("kombu", "kombu", owner, member, why, CHECKED, params, probe, fallback)


HOOKS: tuple[Hook, ...] = (
    _hook(base.Transport, "_make_reader", "the event loop's reader over a connection that "
          "reads ahead (amqp/wire/read_ahead.py LoopReads)",
          ("connection", "timeout", "error", "_unavail"), fallback=NO_READ_AHEAD),
    _hook(kombu.Connection, "_ensure_connection", "reconnecting on the binding's schedule "
          "(AMQP-025, amqp/broker/connection.py)",
          ("errback", "max_retries", "interval_start", "interval_step", "interval_max",
           "callback", "reraise_as_library_errors", "timeout")),
    _hook(kombu.Connection, "_connection_factory", "reporting a re-established connection",
          ()),
    _hook(kombu.Connection, "_close", "telling a close from a lost connection", ()),
    _hook(kombu.Connection, "_reraise_as_library_errors", "connection errors that name the "
          "broker", ("ConnectionError", "ChannelError")),
    _hook(kombu.Connection, "_dummy_context", "kombu's retry loop without its error "
          "translation", ()),
    _hook(kombu.Connection, "_info", "pool members with the pool's settings", ("resolve",)),
    _hook(Message, "_decoded_cache", "handing kombu the Celery message a job delivery "
          "was decoded into once", probe=_decoded_cache_is_read),
    _hook(kombu_json, "_encoders", "values of types an app registers with "
          "register_type travel in jobs (spec/typed_values.py)",
          probe=lambda: all(isinstance(v, tuple) and len(v) == 2
                            for v in kombu_json._encoders.values())),
    _hook(kombu_json, "_decoders", "reading back values of types an app registers with "
          "register_type", probe=lambda: isinstance(kombu_json._decoders, dict)),
)


@cache
def fallbacks() -> frozenset[str]:
    """The fallbacks in force on the installed kombu (checked once per process)."""
    return verify(HOOKS)


# -- the uses ------------------------------------------------------------------------


def set_decoded(message: Message, payload: Any) -> None:
    """What ``message.decode()`` returns (kombu decodes nothing again)."""
    message._decoded_cache = payload


def library_errors(connection: kombu.Connection) -> AbstractContextManager[None]:
    """kombu's translation of transport errors into its ``OperationalError``."""
    return connection._reraise_as_library_errors()


def no_translation(connection: kombu.Connection) -> AbstractContextManager[None]:
    return connection._dummy_context()


def connection_factory(connection: kombu.Connection) -> Callable[[], Any]:
    """kombu's one connect attempt (what its retry loop calls)."""
    return connection._connection_factory


def connection_info(connection: kombu.Connection) -> Iterator[tuple[str, Any]]:
    """The settings a copy of ``connection`` is made with, transport unresolved."""
    return connection._info(resolve=False)


def connection_hooks(cls: type[_T]) -> type[_T]:
    """kombu's connection internals call ``cls``'s public methods: ``ensure_with_policy``
    is its retry loop, ``library_errors_naming_broker`` its error translation,
    ``on_connected()`` runs after each connect and ``on_closing()`` before a close."""

    def _connection_factory(self: Any) -> Any:
        connection = super(cls, self)._connection_factory()
        self.on_connected()
        return connection

    def _close(self: Any) -> None:
        self.on_closing()
        super(cls, self)._close()

    cls._ensure_connection = cls.ensure_with_policy  # type: ignore[attr-defined]
    cls._reraise_as_library_errors = cls.library_errors_naming_broker  # type: ignore[attr-defined]
    cls._connection_factory = _connection_factory  # type: ignore[attr-defined]
    cls._close = _close  # type: ignore[attr-defined]
    return cls


def reader_hook(cls: type[_T]) -> type[_T]:
    """kombu's event-loop reader reads through ``cls.loop_reader(connection)`` (unless
    :data:`~.py_amqp_seam.NO_READ_AHEAD` is in force)."""

    def _make_reader(self: Any, connection: Any, *args: Any, **kwargs: Any) -> Any:
        if NO_READ_AHEAD in fallbacks():  # verified when first needed, not at import
            return super(cls, self)._make_reader(connection, *args, **kwargs)
        return super(cls, self)._make_reader(self.loop_reader(connection), *args, **kwargs)

    cls._make_reader = _make_reader  # type: ignore[attr-defined]
    return cls


def wake_on_foreign_call_soon(loop: Any, new_wake: Callable[[], Any]) -> None:
    """Make ``loop.call_soon`` from another thread wake ``loop``, on kombu before 5.7.

    The threads pool acks and settles its jobs through the hub's ``call_soon`` from
    its own threads; kombu 5.7's hub then wakes its poll (its ``_Waker``), kombu 5.5
    and 5.6's waits for the poll to return, up to 10 s while the timer has nothing
    due sooner, and a retry or an ack waits as long.  Here the hub instance's
    ``call_soon`` also wakes the loop through ``new_wake()`` (a
    :class:`~.read_ahead.LoopWake`), made again when the loop closed the last one (a
    hub is reused by the next worker started in the same process).  Called from the
    loop's thread each time a connection registers with it."""
    if hasattr(loop, "_create_waker"):  # kombu 5.7 and later wake the hub themselves
        return
    wake = getattr(loop, "_ojs_wake", None)
    if wake is None or wake.closed:
        loop._ojs_wake = new_wake()
    loop._ojs_loop_thread = threading.get_ident()
    if getattr(loop, "_ojs_call_soon", None) is not None:
        return
    call_soon = loop._ojs_call_soon = loop.call_soon

    def call_soon_and_wake(callback: Any, *args: Any) -> Any:
        handle = call_soon(callback, *args)
        if threading.get_ident() != loop._ojs_loop_thread:
            loop._ojs_wake.wake()
        return handle

    loop.call_soon = call_soon_and_wake


def forget_loop_on_close(loop: Any) -> None:
    """Make ``loop.close()`` stop it being the process's current event loop, as kombu
    5.7's hub does itself.

    Celery's worker takes the current loop if there is one and makes its own hub,
    with its own timer, only if there is none.  kombu 5.5 and 5.6 keep a closed hub
    current, so a second worker started in the same process (one
    ``celery.contrib.testing.worker`` after another) runs on the first one's hub,
    which fires the first worker's timer: the second worker's timer entries (an ETA
    or countdown job Celery holds, the worker heartbeat, a job's BEATs) never run.
    Only public kombu names: ``Hub.on_close``, ``get_event_loop``, ``set_event_loop``.
    """
    loop.on_close.add(_forget_if_current)


def _forget_if_current(loop: Any) -> None:
    if get_event_loop() is loop:
        set_event_loop(None)


def registered_type(value: Any) -> tuple[str | None, Any] | None:
    """``(marker, JSON value)`` of ``value`` as kombu's JSON encoder writes it, when the
    first type it matches in kombu's registry (``register_type``, in order) is one an
    app registered; ``None`` for kombu's own datetime, date, time, Decimal and UUID,
    which travel in their natural forms (:mod:`ojs_kombu.spec.typed_values`)."""
    for registered, (marker, encoder) in kombu_json._encoders.items():
        encode: Callable[[Any], Any] = encoder
        if isinstance(value, registered):
            builtin = BUILTIN_TYPES.get(marker) if marker is not None else None
            if builtin is not None and builtin[0] is registered:
                return None
            return marker, encode(value)
    return None


def overrides_builtin(kind: type) -> bool:
    """Whether the app registered built-in type ``kind`` (``Decimal``) itself, with a
    marker or encoder of its own (its values then travel as it says)."""
    return kombu_json._encoders.get(kind) is not _KOMBU_DEFAULTS.get(kind)


def registered_decoder(marker: str) -> Callable[[Any], Any] | None:
    """What kombu reads a value tagged ``marker`` back with."""
    return kombu_json._decoders.get(marker)


# Jobs carry values of the types registered with kombu from the moment the transport
# is imported (in a prefork child too: it forks from a process that imported it).
#: kombu's own registrations of the built-in types (``register_type`` replaces the entry).
_KOMBU_DEFAULTS = {kind: entry for kind, entry in kombu_json._encoders.items()
                   if entry[0] in BUILTIN_TYPES and BUILTIN_TYPES[entry[0]][0] is kind}
use_registered_types(registered_type, registered_decoder, tuple(kombu_json.textual_types),
                     overrides_builtin)
