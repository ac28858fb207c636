"""Jobs built to stop or bloat a worker are refused by the spec floor with a code,
before anything of them reaches Celery: a compression named in ``x_celery`` (kombu
would decompress the body and Celery ack it undecoded), a type map larger than the
worker reads or than the values it could type.  The consume path dead-letters each
with that code (integration/test_hostile_storm.py)."""

from __future__ import annotations

import json
from datetime import date
from typing import Any

import amqp
import pytest

from ojs_kombu.amqp.consuming.delivery import JobMessage
from ojs_kombu.amqp.job_channel import JobDelivery
from ojs_kombu.spec.decode import decode_job_message
from ojs_kombu.spec.encode import CELERY_CALL, encode_task_message
from ojs_kombu.spec.envelope import CONTENT_TYPE
from ojs_kombu.spec.errors import JobRejected, OJSConfigurationError
from ojs_kombu.spec.failures import Action
from ojs_kombu.spec.job_ids import new_job_id
from ojs_kombu.spec.settings import OJSSettings
from ojs_kombu.spec.strict_input import (
    INVALID_ENVELOPE,
    JOB_TOO_LARGE,
    UNSUPPORTED_CONTENT_TYPE,
)
from ojs_kombu.spec.typed_values import TYPE_MAP_TOO_LARGE, TYPES_KEY

from .test_delivery import SettlingChannel

PROPS = {"content_type": CONTENT_TYPE, "content_encoding": "utf-8"}
EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def job(args: list[Any], **extra: Any) -> dict[str, Any]:
    return {"specversion": "1.0", "id": new_job_id(), "type": "billing.charge",
            "queue": "billing", "args": args, **extra}


def consume(body: dict[str, Any] | bytes, props: dict[str, Any] | None = None,
            **options: Any) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return decode_job_message(raw, props or PROPS, resolve_task=lambda t: t, queue="billing",
                              **options)


def refused(body: dict[str, Any] | bytes, props: dict[str, Any] | None = None,
            **options: Any) -> JobRejected:
    with pytest.raises(JobRejected) as info:
        consume(body, props, **options)
    return info.value


@pytest.mark.parametrize("compression", ["gzip", "zlib", "bzip2", "application/x-gzip"])
def test_a_compression_named_in_x_celery_is_refused(compression: str) -> None:
    rejected = refused(job([1], x_celery={"compression": compression}))
    assert rejected.code == INVALID_ENVELOPE
    assert "x_celery.compression" in rejected.message and "compressed" in rejected.message


@pytest.mark.parametrize("encoding", ["gzip", "binary", "latin-1", "utf-16", "x-unknown"])
def test_a_body_in_another_content_encoding_is_refused(encoding: str) -> None:
    rejected = refused(job([1]), {"content_type": CONTENT_TYPE, "content_encoding": encoding})
    assert rejected.code == UNSUPPORTED_CONTENT_TYPE and repr(encoding) in rejected.message


def typed_dates(count: int) -> dict[str, Any]:
    return job(["2026-01-01"] * count,
               meta={TYPES_KEY: {f"/args/{i}": "date" for i in range(count)}})


def test_a_type_map_at_the_limit_is_read() -> None:
    incoming = consume(typed_dates(50), max_type_map_entries=50)
    assert incoming.payload[0] == [date(2026, 1, 1)] * 50


def test_a_type_map_over_the_limit_is_refused_naming_the_setting() -> None:
    rejected = refused(typed_dates(51), max_type_map_entries=50)
    assert rejected.code == TYPE_MAP_TOO_LARGE
    assert "51 entries" in rejected.message and "ojs_max_type_map_entries=50" in rejected.message


def test_the_default_limit_holds_a_real_call_and_refuses_a_storm() -> None:
    limit = OJSSettings().max_type_map_entries
    assert consume(typed_dates(limit)).payload[0][-1] == date(2026, 1, 1)
    assert refused(typed_dates(limit + 1)).code == TYPE_MAP_TOO_LARGE


def test_a_type_map_with_more_entries_than_values_is_refused() -> None:
    """450,000 pointers to three values: refused by counting, before any pointer is read."""
    body = job(["2026-01-01", 2, {"k": "v"}],
               meta={TYPES_KEY: {f"/args/{i}": "date" for i in range(450_000)}})
    rejected = refused(body, max_type_map_entries=10**6)
    assert rejected.code == TYPE_MAP_TOO_LARGE
    assert "more than the values of args and x_celery" in rejected.message


def test_a_type_map_pointing_into_kwargs_counts_kwargs_values() -> None:
    body = job([], x_celery={"kwargs": {"a": "2026-01-01", "b": "2026-01-02"}},
               meta={TYPES_KEY: {"/x_celery/kwargs/a": "date", "/x_celery/kwargs/b": "date"}})
    assert consume(body).payload[1] == {"a": date(2026, 1, 1), "b": date(2026, 1, 2)}


def test_what_ojs_kombu_publishes_stays_under_the_bounds() -> None:
    values = [date(2026, 1, d) for d in range(1, 29)]
    sent = encode_task_message(
        body=(values, {"due": values[0]}, EMBED), content_type=CELERY_CALL, properties={},
        headers={"task": "billing.charge", "id": new_job_id()}, job_type="billing.charge",
        queue="billing")
    assert consume(sent.body, max_type_map_entries=29).payload[0] == values


@pytest.mark.parametrize("value", [-1, "many", None])
def test_the_limits_are_settings_validated_at_start(value: Any) -> None:
    for name in ("ojs_max_type_map_entries", "ojs_chord_unlock_max_retries"):
        with pytest.raises(OJSConfigurationError, match=name.removeprefix("ojs_")):
            OJSSettings.from_options({name: value}, source="app.conf")


def test_a_body_over_ojs_max_job_bytes_is_refused_before_it_is_parsed() -> None:
    body = json.dumps(job(["x" * 2000])).encode()
    assert consume(body, max_job_bytes=len(body)).payload[0] == ["x" * 2000]
    rejected = refused(body[:-1] + b"garbage", max_job_bytes=len(body))  # not even JSON
    assert rejected.code == JOB_TOO_LARGE
    assert f"{len(body) + 6} bytes" in rejected.message
    assert f"ojs_max_job_bytes={len(body)}" in rejected.message


def test_a_job_message_kombu_cannot_decode_is_dead_lettered_not_acked() -> None:
    """Celery acks what kombu cannot decode ("Can't decode message body"); a job is
    dead-lettered ``INVALID_PAYLOAD`` instead."""
    channel = SettlingChannel()
    raw = amqp.Message(b'{"not": "gzip"}', message_id="j-1", content_type=CONTENT_TYPE,
                       application_headers={"compression": "application/x-gzip"})
    raw.delivery_info = {"delivery_tag": 3, "exchange": "ojs.exchange.direct",
                         "routing_key": "billing", "redelivered": False}
    message = JobMessage(raw, channel=channel)
    message.ojs = JobDelivery("billing", "j-1", raw.body, dict(raw.properties), "b.c")
    assert message.errors  # kombu's decompression failed
    message.ack()
    [(_, tag, outcome)] = channel.settled
    assert (tag, outcome.action, outcome.failure.code) == (3, Action.DEAD_LETTER,
                                                           "INVALID_PAYLOAD")
    assert "could not be decoded" in outcome.failure.message
    assert message.acknowledged


def test_a_decoded_job_message_is_acked_as_usual() -> None:
    channel = SettlingChannel()
    raw = amqp.Message(b"{}", message_id="j-2", content_type=CONTENT_TYPE)
    raw.delivery_info = {"delivery_tag": 4, "exchange": "ojs.exchange.direct",
                         "routing_key": "billing", "redelivered": False}
    message = JobMessage(raw, channel=channel)
    message.ojs = JobDelivery("billing", "j-2", raw.body, dict(raw.properties), "b.c")
    acked: list[int] = []
    channel.no_ack_consumers = None  # type: ignore[attr-defined]
    channel.basic_ack = lambda tag, multiple=False: acked.append(tag)  # type: ignore[attr-defined]
    message.ack()
    assert acked == [4] and channel.settled == []
