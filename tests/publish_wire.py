"""Reading back the ``Basic.Publish`` frames a publisher wrote, as the broker reads them,
and the channel whose deliveries the published copies replace."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from struct import unpack_from
from typing import Any

from amqp import spec
from amqp.serialization import decode_properties_basic, loads


@dataclass
class WirePublish:
    """One publish as the broker read it."""

    exchange: str
    routing_key: str
    mandatory: bool
    properties: dict[str, Any]
    body: bytes

    @property
    def message_id(self) -> str | None:
        return self.properties.get("message_id")


class Deliveries:
    """The channel jobs were delivered on: which deliveries were acked, in order."""

    generation = 1
    is_open = True

    def __init__(self) -> None:
        self.acked: list[int] = []

    def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
        self.acked.append(delivery_tag)


def read_publishes(data: bytes) -> list[WirePublish]:
    """Every publish in ``data``, in wire order (other frames are skipped)."""
    found: list[WirePublish] = []
    offset, current, body, size = 0, None, b"", 0
    while offset < len(data):
        kind, _channel, length = unpack_from(">BHI", data, offset)
        payload = data[offset + 7:offset + 7 + length]
        assert data[offset + 7 + length] == 0xCE, "frame end"
        offset += 8 + length
        if kind == 1:
            if unpack_from(">HH", payload) != spec.Basic.Publish:
                continue
            (_, exchange, routing_key, mandatory, _), _ = loads("Bssbb", payload, 4)
            current = WirePublish(exchange, routing_key, mandatory, {}, b"")
        elif kind == 2 and current is not None:
            size = unpack_from(">Q", payload, 4)[0]
            current.properties, _ = decode_properties_basic(payload, 12)
            body = b""
            if size == 0:
                found.append(current)
                current = None
        elif kind == 3 and current is not None:
            body += payload
            if len(body) >= size:
                current.body = body
                found.append(current)
                current = None
    return found


def at_each_line(package: str, pause: Callable[[int], None]) -> Callable[..., Any]:
    """A trace function for :func:`sys.settrace`: ``pause(n)`` before the n-th line the
    calling thread runs in ``package``'s code (to interleave another thread there)."""
    counter = [0]

    def local(frame: Any, event: str, _arg: Any) -> Any:
        if event == "line":
            counter[0] += 1
            pause(counter[0])
        return local

    def trace(frame: Any, event: str, _arg: Any) -> Any:
        if event == "call" and package in frame.f_code.co_filename:
            return local
        return None

    return trace


def run_traced(work: Callable[[], None], trace: Callable[..., Any]) -> None:
    """``work()`` in a thread of its own, traced by ``trace``; re-raises what it raised."""
    failed: list[BaseException] = []

    def traced() -> None:
        sys.settrace(trace)
        try:
            work()
        except BaseException as exc:
            failed.append(exc)
        finally:
            sys.settrace(None)

    thread = threading.Thread(target=traced)
    thread.start()
    thread.join(10)
    if failed:
        raise failed[0]
