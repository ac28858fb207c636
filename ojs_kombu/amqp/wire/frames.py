"""py-amqp's frame parser, made safe against content headers it cannot decode.

RabbitMQ passes message properties through as bytes: a short string that is
not UTF-8 (``content_type``, ``message_id``, ``app_id`` ...) or a header
timestamp past the year 9999 reaches the consumer as sent, and py-amqp's
parser raises while decoding the content header (``UnicodeDecodeError``,
``OverflowError``).  Raised into the worker's loop that ends the worker, and
every fresh worker dies on the same message at the head of the queue.

:meth:`ojs_kombu.amqp.transport.Connection.blocking_read` guards py-amqp's
parser: a content header that does not decode is replaced
(:func:`replacement_frame`), for that delivery only, by one carrying just the
:data:`UNDECODABLE_HEADER` with the reason; the delivery then completes with
its own body, and the consumer dead-letters it (see
:mod:`ojs_kombu.amqp.consuming.receiver`).  The parser's state stays
that of this delivery, so no other delivery's header or body is ever
attributed to it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from struct import error as StructError
from struct import pack, unpack_from
from typing import Any

import amqp
from amqp.method_framing import frame_writer

from .py_amqp_seam import serialize_properties

logger = logging.getLogger(__name__)

#: Header a delivery carries when its own properties could not be decoded.
UNDECODABLE_HEADER = "x-ojs-undecodable-properties"
#: What decoding a content header can raise on bytes the broker passed through.
DECODE_ERRORS = (UnicodeDecodeError, OverflowError, ValueError, StructError)
_CONTENT_HEADER = 2


def replacement_header(buf: Any, reason: str) -> bytes:
    """A content header with the class and body size of ``buf`` and only the
    :data:`UNDECODABLE_HEADER` (``delivery_mode`` 2) as properties."""
    class_id, body_size = unpack_from(">HxxQ", buf, 0)
    properties = amqp.Message(b"", delivery_mode=2,
                              application_headers={UNDECODABLE_HEADER: reason[:1024]})
    return pack(">HHQ", class_id, 0, body_size) + serialize_properties(properties)


def replacement_frame(frame: tuple[int, int, Any], error: Exception
                      ) -> tuple[int, int, bytes] | None:
    """What py-amqp's parser reads instead of ``frame``, whose parse raised ``error``
    (one of :data:`DECODE_ERRORS`): for a content header, :func:`replacement_header`
    with the reason; ``None`` for any other frame (the error stands)."""
    frame_type, channel, buf = frame
    if frame_type != _CONTENT_HEADER:
        return None
    reason = f"{type(error).__name__}: {error}"
    logger.debug("a delivery on channel %d has properties that cannot be decoded "
                 "(%s); it is dead-lettered", channel, reason)
    return frame_type, channel, replacement_header(buf, reason)


def locked_frame_writer(connection: Any, transport: Any) -> Callable[..., Any]:
    """py-amqp's frame writer under the connection's ``ojs_write_lock``, the lock every
    other write of the connection takes too (:meth:`ojs_kombu.amqp.transport.Connection.
    write_frames`): greenlets of the gevent and eventlet pools ack, retry and
    dead-letter at the same time, and a write that yields half-way must not let
    another one's bytes in between."""
    write = frame_writer(connection, transport)
    lock = connection.ojs_write_lock

    def locked(*args: Any) -> Any:
        with lock:
            return write(*args)

    return locked
