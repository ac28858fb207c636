"""Content headers py-amqp cannot decode: the delivery survives with a marker, and the
next delivery on the channel is parsed as its own."""

from __future__ import annotations

from datetime import UTC, datetime
from struct import pack
from typing import Any

import amqp
import pytest
from amqp import spec
from amqp.serialization import dumps

from ojs_kombu.amqp.frames import UNDECODABLE_HEADER, guarded_frame_handler


class Counting:
    bytes_recv = 0


def deliver(tag: int) -> tuple[int, int, bytes]:
    args = dumps("sLbss", ("ctag", tag, False, "ojs.exchange.direct", "email"))
    return 1, 1, pack(">HH", *spec.Basic.Deliver) + args


def header(properties: bytes, body: bytes) -> tuple[int, int, bytes]:
    return 2, 1, pack(">HHQ", 60, 0, len(body)) + properties


def body(data: bytes) -> tuple[int, int, bytes]:
    return 3, 1, data


def props(**properties: Any) -> bytes:
    return amqp.Message(b"", **properties)._serialize_properties()


def overflowing_timestamp() -> bytes:
    good = props(application_headers={"sent": datetime(2020, 1, 1, tzinfo=UTC)})
    seconds = pack(">Q", int(datetime(2020, 1, 1, tzinfo=UTC).timestamp()))
    assert seconds in good
    return good.replace(seconds, pack(">Q", 2**40))  # far past the year 9999


@pytest.mark.parametrize("bad", [
    props(content_type=b"\xff\xfe"),
    props(message_id=b"\xc3\x28", app_id="ok"),
    props(correlation_id=b"\xa0", reply_to=b"\xff"),
    overflowing_timestamp(),
], ids=["content_type", "message_id", "reply_to", "timestamp"])
def test_an_undecodable_header_is_replaced_for_its_delivery_only(bad: bytes) -> None:
    received: list[tuple[int, amqp.Message]] = []

    def callback(channel: int, method: Any, args: Any, message: amqp.Message) -> None:
        received.append((int.from_bytes(bytes(args[4 + 5:4 + 13]), "big"), message))

    on_frame = guarded_frame_handler(Counting(), callback)
    for frame in (deliver(1), header(bad, b"poison"), body(b"poison"),
                  deliver(2), header(props(content_type="application/openjobspec+json",
                                           message_id="good"), b"good"), body(b"good")):
        on_frame(frame)
    (first_tag, first), (second_tag, second) = received
    assert (first_tag, first.body) == (1, b"poison")
    assert UNDECODABLE_HEADER in first.properties["application_headers"]
    assert "Error" in first.properties["application_headers"][UNDECODABLE_HEADER]
    assert (second_tag, second.body) == (2, b"good")
    assert second.properties["message_id"] == "good"
    assert UNDECODABLE_HEADER not in (second.properties.get("application_headers") or {})


def test_other_frame_errors_still_raise() -> None:
    on_frame = guarded_frame_handler(Counting(), lambda *a: None)
    with pytest.raises(Exception, match="expecting type"):
        on_frame(body(b"no header before me"))
