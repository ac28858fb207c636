"""The wire bytes of ``Basic.Publish``: method, content header and body frames.

py-amqp encodes every publish through its general argument and field-table
serialiser, the largest share of a batch publish's client CPU (profiled: more
than building the envelope and its JSON).  An OJS job has a fixed
shape: a handful of short-string properties, two octets, a timestamp and a
table of ``x-ojs-*`` headers holding strings and integers.  This module
encodes that shape directly and leaves every other value type (floats,
decimals, dates, nested tables and arrays, ``None``) to py-amqp's own encoder,
so the bytes are py-amqp's bytes in every case (the unit tests compare them).
Pure encoding, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from struct import Struct
from struct import error as StructError
from typing import Any

import amqp
from amqp import spec
from amqp.serialization import dumps

from .py_amqp_seam import serialize_properties

#: Frame header: type, channel, payload size.
_FRAME_HEAD = Struct(">BHI")
#: Content header payload start: class id, weight, body size.
_CONTENT_HEAD = Struct(">HHQ")
_SHORT = Struct(">B")
_SHORT_STR_ITEM = Struct(">cI")
_LONG = Struct(">I")
_INT_ITEM = Struct(">ci")
_LONGLONG_ITEM = Struct(">cq")
_LONGLONG = Struct(">Q")
_SHORT_FLAGS = Struct(">H")
_FRAME_END = b"\xce"
_INT32_MAX = 2147483647
#: Header frame + frame end, and body frame overhead (py-amqp: FRAME_OVERHEAD).
_FRAME_OVERHEAD = 8

#: Class and method id of ``Basic.Publish``, the method frame's payload start.
_CLASS_METHOD = Struct(">HH").pack(*spec.Basic.Publish)
#: ``Basic`` content properties in wire order, with their flag bit.
_PROPERTY_FLAGS = {name: 1 << (15 - i) for i, (name, _) in enumerate(amqp.Message.PROPERTIES)}
_METHOD_CACHE_MAX = 256


class _Unsupported(Exception):
    """A value outside the fast path: py-amqp encodes the whole header instead."""


def _short_str(value: str) -> bytes:
    raw = value.encode("utf-8", "surrogatepass")
    if len(raw) > 255:
        raise _Unsupported  # py-amqp raises its own error for it
    return _SHORT.pack(len(raw)) + raw


#: Encoded header names: a job's headers repeat the same few names, so each is
#: encoded once (bounded, in case they do not).
_SHORT_STRS: dict[str, bytes] = {}
_SHORT_STRS_MAX = 1024


def _cached_short_str(value: str) -> bytes:
    raw = _SHORT_STRS.get(value)
    if raw is None:
        raw = _short_str(value)
        if len(_SHORT_STRS) >= _SHORT_STRS_MAX:
            _SHORT_STRS.clear()
        _SHORT_STRS[value] = raw
    return raw


def _table(headers: Mapping[str, Any]) -> bytes:
    """A field table of string, bool and integer values (py-amqp's encoding of them)."""
    parts = []
    for key, value in headers.items():
        if not isinstance(key, str):
            raise _Unsupported
        parts.append(_cached_short_str(key))
        if isinstance(value, str):
            raw = value.encode("utf-8", "surrogatepass")
            parts.append(_SHORT_STR_ITEM.pack(b"S", len(raw)))
            parts.append(raw)
        elif isinstance(value, bool):
            parts.append(b"t\x01" if value else b"t\x00")
        elif isinstance(value, int):
            if -_INT32_MAX <= value <= _INT32_MAX:
                parts.append(_INT_ITEM.pack(b"I", value))
            else:
                parts.append(_LONGLONG_ITEM.pack(b"L", value))
        else:
            raise _Unsupported
    data = b"".join(parts)
    return _LONG.pack(len(data)) + data


def encode_properties(properties: Mapping[str, Any]) -> bytes:
    """Property flags and list of a ``Basic`` content header, as py-amqp writes them."""
    flags = 0
    parts: list[bytes] = []
    get = properties.get
    try:
        for name, kind in amqp.Message.PROPERTIES:
            value = get(name)
            if value is None:
                continue
            flags |= _PROPERTY_FLAGS[name]
            if kind == "s":
                if not isinstance(value, str):
                    raise _Unsupported
                parts.append(_short_str(value))
            elif kind == "o":
                parts.append(_SHORT.pack(value))
            elif kind == "L":
                parts.append(_LONGLONG.pack(value))
            elif kind == "F":
                if not isinstance(value, Mapping):
                    raise _Unsupported
                parts.append(_table(value))
            else:
                raise _Unsupported
    except (_Unsupported, StructError, TypeError):
        return serialize_properties(amqp.Message(b"", **properties))
    return _SHORT_FLAGS.pack(flags) + b"".join(parts)


class PublishFrames:
    """Encodes publishes for one channel; method frames are cached per destination."""

    __slots__ = ("_channel_id", "_frame_max", "_methods")

    def __init__(self, channel_id: int, frame_max: int) -> None:
        self._channel_id = channel_id
        self._frame_max = frame_max
        self._methods: dict[tuple[str, str, bool], bytes] = {}

    def _method(self, exchange: str, routing_key: str, mandatory: bool) -> bytes:
        key = (exchange, routing_key, mandatory)
        frame = self._methods.get(key)
        if frame is None:
            payload = _CLASS_METHOD + dumps("Bssbb", (0, exchange, routing_key, mandatory, False))
            frame = _FRAME_HEAD.pack(1, self._channel_id, len(payload)) + payload + _FRAME_END
            if len(self._methods) >= _METHOD_CACHE_MAX:
                self._methods.clear()
            self._methods[key] = frame
        return frame

    def encode(self, exchange: str, routing_key: str, mandatory: bool, body: bytes | str,
               properties: dict[str, Any]) -> bytes:
        """Method, content header and body frames of one publish.

        A ``str`` body is encoded as py-amqp does: with ``content_encoding``,
        set to ``utf-8`` in ``properties`` when it has none.
        """
        if isinstance(body, str):
            body = body.encode(properties.setdefault("content_encoding", "utf-8"))
        channel = self._channel_id
        header = _CONTENT_HEAD.pack(60, 0, len(body)) + encode_properties(properties)
        out = [self._method(exchange, routing_key, mandatory),
               _FRAME_HEAD.pack(2, channel, len(header)), header, _FRAME_END]
        chunk = self._frame_max - _FRAME_OVERHEAD
        for start in range(0, len(body), chunk):
            piece = body[start:start + chunk]
            out += (_FRAME_HEAD.pack(3, channel, len(piece)), piece, _FRAME_END)
        return b"".join(out)
