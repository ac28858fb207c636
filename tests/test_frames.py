"""Content headers py-amqp cannot decode: the delivery survives with a marker, and the
next delivery on the channel is parsed as its own, whether its frames were read ahead
or read one by one."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from struct import pack
from typing import Any

import amqp
import pytest
from amqp import spec
from amqp.method_framing import frame_handler
from amqp.serialization import dumps

from ojs_kombu.amqp.transport import Connection
from ojs_kombu.amqp.wire.frames import UNDECODABLE_HEADER
from ojs_kombu.amqp.wire.read_ahead import ReadAheadTCPTransport


def wire(frame_type: int, payload: bytes) -> bytes:
    return pack(">BHI", frame_type, 1, len(payload)) + payload + b"\xce"


def deliver(tag: int) -> bytes:
    args = dumps("sLbss", ("ctag", tag, False, "ojs.exchange.direct", "email"))
    return wire(1, pack(">HH", *spec.Basic.Deliver) + args)


def header(properties: bytes, body: bytes) -> bytes:
    return wire(2, pack(">HHQ", 60, 0, len(body)) + properties)


def body(data: bytes) -> bytes:
    return wire(3, data)


def props(**properties: Any) -> bytes:
    return amqp.Message(b"", **properties)._serialize_properties()


def overflowing_timestamp() -> bytes:
    good = props(application_headers={"sent": datetime(2020, 1, 1, tzinfo=UTC)})
    seconds = pack(">Q", int(datetime(2020, 1, 1, tzinfo=UTC).timestamp()))
    assert seconds in good
    return good.replace(seconds, pack(">Q", 2**40))  # far past the year 9999


Received = list[tuple[int, amqp.Message]]


@pytest.fixture(params=["read ahead", "read exactly"])
def reading(request: pytest.FixtureRequest) -> Iterator[tuple[Connection, socket.socket,
                                                              Received]]:
    """An ojs_kombu connection reading from a socket (the other end is the broker's),
    handing each whole delivery to py-amqp's parser's callback: ``(delivery tag, message)``.
    "read exactly": as a connection in an event loop reads outside the loop's reader."""
    ours, broker = socket.socketpair()
    transport = ReadAheadTCPTransport("localhost:5672")
    transport.sock = ours
    transport._setup_transport()
    transport.in_event_loop = request.param == "read exactly"
    connection = Connection(host="localhost:5672")
    connection.transport = transport
    received: Received = []

    def callback(channel: int, method: Any, args: Any, message: amqp.Message) -> None:
        received.append((int.from_bytes(bytes(args[4 + 5:4 + 13]), "big"), message))

    connection.on_inbound_frame = frame_handler(connection, callback)
    try:
        yield connection, broker, received
    finally:
        ours.close()
        broker.close()


@pytest.mark.parametrize("bad", [
    props(content_type=b"\xff\xfe"),
    props(message_id=b"\xc3\x28", app_id="ok"),
    props(correlation_id=b"\xa0", reply_to=b"\xff"),
    overflowing_timestamp(),
], ids=["content_type", "message_id", "reply_to", "timestamp"])
def test_an_undecodable_header_is_replaced_for_its_delivery_only(reading: Any, bad: bytes
                                                                 ) -> None:
    connection, broker, received = reading
    broker.sendall(deliver(1) + header(bad, b"poison") + body(b"poison") + deliver(2)
                   + header(props(content_type="application/openjobspec+json",
                                  message_id="good"), b"good") + body(b"good"))
    for _ in range(6):
        connection.blocking_read(timeout=1)
    (first_tag, first), (second_tag, second) = received
    assert (first_tag, first.body) == (1, b"poison")
    assert UNDECODABLE_HEADER in first.properties["application_headers"]
    assert "Error" in first.properties["application_headers"][UNDECODABLE_HEADER]
    assert (second_tag, second.body) == (2, b"good")
    assert second.properties["message_id"] == "good"
    assert UNDECODABLE_HEADER not in (second.properties.get("application_headers") or {})
    assert connection.bytes_recv == 6  # py-amqp's heartbeat check counts each frame once


def test_other_frame_errors_still_raise(reading: Any) -> None:
    connection, broker, _ = reading
    broker.sendall(body(b"no header before me"))
    with pytest.raises(Exception, match="expecting type"):
        connection.blocking_read(timeout=1)
