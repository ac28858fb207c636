"""Every private member of py-amqp that ojs_kombu uses: the py-amqp seam.

Checked with py-amqp 5.3.1 and 5.4.2 (:data:`CHECKED`).  Each use is a
:class:`~ojs_kombu.spec.seams.Hook` in :data:`HOOKS`, pinned by
``tests/test_seams.py``.  :func:`fallbacks` checks them once per process: a
missing read-ahead hook makes the transport read frames with py-amqp's own
reader, a missing delivery hook makes acks go out one at a time (py-amqp's own
``basic_ack``); any other missing hook refuses to start with
:class:`~ojs_kombu.spec.errors.UnsupportedDependencyError`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any, TypeVar

import amqp
from amqp import serialization
from amqp import transport as amqp_transport

from ...spec.seams import Hook, source_uses, verify

CHECKED = "5.3.1, 5.4.2"
#: Fallbacks (:func:`fallbacks` holds the ones in force).
NO_READ_AHEAD = "reading frames with py-amqp's own reader (no read-ahead)"
NO_LOOP_ACKS = "acking each delivery at once (no acks collected per loop iteration)"
NO_TLS_ALERT = ("a client certificate the broker refuses under TLS 1.3 is retried as a lost "
                "connection (its alert is not read)")

_T = TypeVar("_T")


def _hook(owner: Any, member: str, why: str, params: tuple[str, ...] | None = None,
          probe: Callable[[], bool] | None = None, fallback: str | None = None) -> Hook:
    return Hook("py-amqp", "amqp", owner, member, why, CHECKED, params, probe, fallback)


TCP = amqp_transport.TCPTransport
SSL = amqp_transport.SSLTransport
HOOKS: tuple[Hook, ...] = (
    _hook(TCP, "_read", "reading the socket ahead (amqp/wire/read_ahead.py)",
          ("n", "initial", "_errnos"), fallback=NO_READ_AHEAD),
    _hook(TCP, "_read_buffer", "the bytes read ahead and not parsed, which py-amqp restores "
          "when a read times out mid-frame",
          probe=source_uses(amqp_transport, "self._read_buffer = read_frame_buffer"),
          fallback=NO_READ_AHEAD),
    _hook(TCP, "_quick_recv", "the socket's recv, as py-amqp's own reader calls it",
          probe=source_uses(TCP, "self._quick_recv = self.sock.recv"),
          fallback=NO_READ_AHEAD),
    _hook(amqp.Channel, "_on_basic_deliver", "knowing every delivery that needs an ack, so "
          "that collected acks may settle a run with one frame (amqp/wire/loop_acks.py)",
          ("consumer_tag", "delivery_tag", "redelivered", "exchange", "routing_key", "msg"),
          fallback=NO_LOOP_ACKS),
    _hook(amqp.Channel, "_do_revive", "resetting a channel's OJS state when kombu revives it",
          ()),
    _hook(amqp.Channel, "_basic_publish", "a publish of a non-job message without py-amqp's "
          "per-publish confirm wait",
          ("msg", "exchange", "routing_key", "mandatory", "immediate", "timeout")),
    _hook(amqp.Channel, "_confirm_selected", "telling py-amqp that ojs_kombu selected confirms",
          probe=source_uses(amqp.Channel, "self._confirm_selected = False",
                             "if not self._confirm_selected")),
    _hook(amqp.Channel, "_on_close", "a confirm channel whose close is reported to its "
          "publisher instead of raised into the loop (amqp/consuming/outcomes.py)",
          ("reply_code", "reply_text", "class_id", "method_id")),
    _hook(SSL, "_init_socket", "reading the broker's TLS alert behind the protocol header's "
          "failed write (a client certificate refused under TLS 1.3: amqp/broker/tls.py)",
          ("socket_settings", "read_timeout", "write_timeout"), fallback=NO_TLS_ALERT),
    _hook(serialization.GenericContent, "_serialize_properties",
          "encoding message properties the fast encoder does not handle", ()),
)


@cache
def fallbacks() -> frozenset[str]:
    """The fallbacks in force on the installed py-amqp (checked once per process)."""
    return verify(HOOKS)


# -- the uses ------------------------------------------------------------------------


def serialize_properties(message: amqp.Message) -> bytes:
    """py-amqp's encoding of ``message``'s properties (a content header's tail)."""
    return message._serialize_properties()


def publish_unconfirmed(channel: amqp.Channel, msg: amqp.Message, exchange: str,
                        routing_key: str, mandatory: bool, immediate: bool,
                        timeout: float | None) -> Any:
    """py-amqp's publish without its confirm wait (on a channel in confirm mode)."""
    return channel._basic_publish(msg, exchange, routing_key, mandatory, immediate, timeout)


def confirms_selected(channel: amqp.Channel) -> None:
    """Tell py-amqp confirms are selected on ``channel``: its own confirmed publish
    then never selects them again."""
    channel._confirm_selected = True


def socket_recv(transport: amqp_transport.TCPTransport) -> Callable[[int], bytes]:
    return transport._quick_recv


def read_hooks(cls: type[_T]) -> type[_T]:
    """``cls``'s ``read_exact`` and ``unparsed`` become py-amqp's ``_read`` and
    ``_read_buffer`` (no call in between: every frame read goes through them)."""
    cls._read = cls.read_exact  # type: ignore[attr-defined]
    cls._read_buffer = cls.unparsed  # type: ignore[attr-defined]
    return cls


def channel_hooks(cls: type[_T]) -> type[_T]:
    """py-amqp's channel callbacks call ``cls``'s ``on_revive()`` (before a revive) and,
    unless :data:`NO_LOOP_ACKS` is in force, ``on_deliver(consumer_tag, delivery_tag)``
    (before a ``Basic.Deliver`` is handled)."""

    def _do_revive(self: Any) -> None:
        self.on_revive()
        super(cls, self)._do_revive()

    def _on_basic_deliver(self: Any, consumer_tag: str, delivery_tag: int,
                          redelivered: bool, exchange: str, routing_key: str,
                          msg: amqp.Message) -> None:
        if NO_LOOP_ACKS not in fallbacks():  # verified once, at the first delivery at latest
            self.on_deliver(consumer_tag, delivery_tag)
        super(cls, self)._on_basic_deliver(consumer_tag, delivery_tag, redelivered, exchange,
                                           routing_key, msg)

    cls._do_revive = _do_revive  # type: ignore[attr-defined]
    cls._on_basic_deliver = _on_basic_deliver  # type: ignore[attr-defined]
    return cls


def close_hook(cls: type[_T]) -> type[_T]:
    """A channel close the broker sends calls ``cls``'s ``on_broker_close(reply_code,
    reply_text)`` instead of py-amqp's handler, which raises it."""

    def _on_close(self: Any, reply_code: int, reply_text: str, class_id: int,
                  method_id: int) -> None:
        self.on_broker_close(reply_code, reply_text)

    cls._on_close = _on_close  # type: ignore[attr-defined]
    return cls


def write_failure_hook(cls: type[_T]) -> type[_T]:
    """When the set-up of ``cls``'s socket (a py-amqp ``SSLTransport``: the TLS handshake,
    then the AMQP protocol header's write) fails with an ``OSError``, what ``cls``'s
    ``on_setup_failed(exc)`` returns is raised (``exc`` itself: unchanged), with the
    socket still open; unless :data:`NO_TLS_ALERT` is in force (checked at the first set-up,
    not at import: py-amqp's hooks are verified once, when a connection first needs them)."""

    def _init_socket(self: Any, *args: Any, **kwargs: Any) -> None:
        if NO_TLS_ALERT in fallbacks():  # py-amqp's own set-up, unchanged
            return super(cls, self)._init_socket(*args, **kwargs)
        try:
            super(cls, self)._init_socket(*args, **kwargs)
        except OSError as exc:
            raised = self.on_setup_failed(exc)
            if raised is exc:
                raise
            raise raised from exc

    cls._init_socket = _init_socket  # type: ignore[attr-defined]
    return cls
