"""What py-amqp itself writes: the reference the hand-encoded frames are compared with."""

from __future__ import annotations

from typing import Any

from amqp.method_framing import frame_writer


class _Capture:
    """A transport that keeps what py-amqp's frame writer writes."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: Any) -> None:
        self.data += bytes(data)


class _Connection:
    bytes_sent = 0

    def __init__(self, frame_max: int) -> None:
        self.frame_max = frame_max


def py_amqp_bytes(frames: list[tuple[int, int, Any, bytes, Any]],
                  frame_max: int = 131072) -> bytes:
    """The bytes py-amqp's frame writer writes for ``(type, channel, method, args,
    content)`` frames."""
    capture = _Capture()
    write = frame_writer(_Connection(frame_max), capture)
    for frame in frames:
        write(*frame)
    return bytes(capture.data)
