"""Basic.Publish wire bytes: ojs_kombu's encoder against py-amqp's frame writer."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from struct import error as StructError
from typing import Any

import amqp
import pytest
from amqp import spec
from amqp.serialization import dumps

from ojs_kombu.amqp.wire.publish_frames import PublishFrames, encode_properties
from ojs_kombu.spec.encode import build_job

from .py_amqp_wire import py_amqp_bytes

JOB_ID = "019a6f0e-1111-7222-8333-444455556666"


def publish_bytes(channel: int, exchange: str, routing_key: str, mandatory: bool,
                  body: bytes | str, properties: dict[str, Any], frame_max: int) -> bytes:
    args = dumps("Bssbb", (0, exchange, routing_key, mandatory, False))
    return py_amqp_bytes([(1, channel, spec.Basic.Publish, args,
                           amqp.Message(body, **properties))], frame_max)


def ojs_job_properties() -> tuple[bytes, dict[str, Any]]:
    job = build_job(
        job_id=JOB_ID, job_type="email.send", queue="email", args=["a@example.com", 3],
        task_name="proj.send", now=datetime(2026, 11, 22, 10, 0, tzinfo=UTC),
        created="2026-11-22T10:00:00.000Z", meta={"tags": ["x", "y"], "tenant": "ü"},
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        tracestate="rojo=00f067aa0ba902b7", priority=7,
        scheduled_at=datetime(2026, 11, 22, 10, 5, tzinfo=UTC), reply_to="replies",
    )
    return job.body, job.properties


HEADER_VALUES: list[Any] = [
    "plain", "ünïcödé ✓", "", True, False, 0, -1, 2**31 - 1, -(2**31 - 1), 2**31,
    -(2**31), 2**62, 1.5, Decimal("12.34"), datetime(2026, 1, 2, 3, 4, 5), None,
    {"nested": {"deep": 1}}, ["a", 1, True], b"raw-bytes",
]


@pytest.mark.parametrize("value", HEADER_VALUES, ids=repr)
def test_every_header_value_type_gives_py_amqps_bytes(value: Any) -> None:
    properties = {"content_type": "application/json", "application_headers": {"x-k": value}}
    expected = publish_bytes(3, "ojs.exchange.direct", "ojs.queue.q", True, b"{}",
                             dict(properties), 131072)
    got = PublishFrames(3, 131072).encode("ojs.exchange.direct", "ojs.queue.q", True, b"{}",
                                          dict(properties))
    assert got == expected


def test_an_ojs_job_gives_py_amqps_bytes() -> None:
    body, properties = ojs_job_properties()
    assert properties["application_headers"]["x-ojs-attempt"] == 1  # integers in the table
    for exchange, key, mandatory in (("ojs.exchange.direct", "email", True),
                                     ("", "ojs.queue.email", False)):
        expected = publish_bytes(1, exchange, key, mandatory, body, dict(properties), 131072)
        frames = PublishFrames(1, 131072)
        assert frames.encode(exchange, key, mandatory, body, dict(properties)) == expected
        # the cached method frame gives the same bytes the second time
        assert frames.encode(exchange, key, mandatory, body, dict(properties)) == expected


@pytest.mark.parametrize("size", [0, 1, 4088, 4089, 4096, 10_000])
def test_bodies_split_into_frames_as_py_amqp_splits_them(size: int) -> None:
    """frame_max 4096: a body frame holds at most 4088 bytes."""
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    properties = {"message_id": JOB_ID, "delivery_mode": 2, "timestamp": 1_763_805_600}
    expected = publish_bytes(2, "", "q", False, body, dict(properties), 4096)
    assert PublishFrames(2, 4096).encode("", "q", False, body, dict(properties)) == expected


def test_a_str_body_is_encoded_with_its_content_encoding() -> None:
    for properties in ({}, {"content_encoding": "latin-1"}):
        expected = publish_bytes(1, "", "q", False, "café", dict(properties), 131072)
        sent = dict(properties)
        assert PublishFrames(1, 131072).encode("", "q", False, "café", sent) == expected
        assert sent["content_encoding"] == properties.get("content_encoding", "utf-8")


def test_every_basic_property_is_written_in_py_amqps_order() -> None:
    properties = {name: (5 if kind in "oL" else "v") for name, kind in amqp.Message.PROPERTIES
                  if kind != "F"}
    properties["application_headers"] = {"a": 1}
    expected = amqp.Message(b"", **properties)._serialize_properties()
    assert encode_properties(properties) == expected


def test_values_py_amqp_refuses_raise_py_amqps_error() -> None:
    too_long = {"message_id": "x" * 256}
    with pytest.raises(StructError):
        amqp.Message(b"", **too_long)._serialize_properties()
    with pytest.raises(StructError):
        encode_properties(too_long)
    with pytest.raises(amqp.exceptions.FrameSyntaxError):
        encode_properties({"application_headers": {"k": object()}})
