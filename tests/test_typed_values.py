"""Values Celery's JSON round-trips travel as natural JSON and arrive as the types sent.

Through the publish and consume functions the transport and the pool call, without a
broker: what a job carries on the wire (and what another language reads there), and
what a Celery task is given back.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any
from uuid import UUID, uuid4

import pytest
from kombu.exceptions import EncodeError
from kombu.utils.json import register_type

import ojs_kombu  # noqa: F401  (the transport: kombu's registered types reach jobs)
from ojs_kombu.spec.decode import celery_payload, decode_job_message
from ojs_kombu.spec.encode import CELERY_CALL, encode_task_message
from ojs_kombu.spec.envelope import CONTENT_TYPE, UniquePolicy
from ojs_kombu.spec.errors import JobRejected, NonJSONArgumentError
from ojs_kombu.spec.job_ids import new_job_id
from ojs_kombu.spec.strict_input import INVALID_ENVELOPE
from ojs_kombu.spec.unique import UNIQUE_HEADER, UNIQUE_OPTION, fingerprint

EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}

VALUES: list[Any] = [
    datetime(2026, 3, 4, 5, 6, 7, 891011),                       # naive
    datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC),                  # aware, UTC
    datetime(2026, 3, 4, 5, 6, 7, tzinfo=timezone(timedelta(hours=-5))),
    date(2026, 3, 4),
    time(23, 59, 1, 5),
    UUID("0f8fad5b-d9cb-469f-a165-70867728950e"),
    Decimal("1234.5600"),
    Decimal("-0.000001"),
    b"\x00\x01binary\xff",
    float("inf"),
    float("-inf"),
]
NATURAL = ["2026-03-04T05:06:07.891011", "2026-03-04T05:06:07+00:00",
           "2026-03-04T05:06:07-05:00", "2026-03-04", "23:59:01.000005",
           "0f8fad5b-d9cb-469f-a165-70867728950e", "1234.5600", "-0.000001",
           "AAFiaW5hcnn/", "Infinity", "-Infinity"]


def publish(args: Any = (), kwargs: Any = None, embed: Any = None, task_id: str | None = None,
            **properties: Any) -> Any:
    """What the transport publishes for ``apply_async`` (Celery's call as Python values)."""
    return encode_task_message(
        body=(list(args), kwargs or {}, {**EMBED, **(embed or {})}), content_type=CELERY_CALL,
        properties=properties, headers={"task": "billing.charge", "id": task_id or new_job_id()},
        job_type="billing.charge", queue="billing")


def consume(body: bytes, properties: dict[str, Any] | None = None) -> Any:
    props = properties or {"content_type": CONTENT_TYPE, "content_encoding": "utf-8"}
    return decode_job_message(body, props, resolve_task=lambda t: t, queue="billing")


def test_every_type_arrives_as_sent_in_args_kwargs_and_nested(job_check: Any) -> None:
    nested = {"items": [{"sku": uuid4(), "price": Decimal("9.99")}], "at": date(2026, 1, 1)}
    job = publish(VALUES, {"order": nested, "when": VALUES[1]})
    wire = json.loads(job.body)
    job_check.validate(wire)
    assert wire["args"] == NATURAL  # what any other language reads
    assert "__type__" not in job.body.decode()
    for task_args, task_kwargs in (consume(job.body).payload[:2], celery_payload(job.body)[:2]):
        assert task_args == VALUES and [type(v) for v in task_args] == [type(v) for v in VALUES]
        assert task_kwargs == {"order": nested, "when": VALUES[1]}
        assert task_args[2].utcoffset() == timedelta(hours=-5)
        assert task_args[0].tzinfo is None


def test_nan_travels_as_a_string_and_arrives_as_nan() -> None:
    job = publish([float("nan"), 1.5])
    assert json.loads(job.body)["args"] == ["NaN", 1.5]
    args = celery_payload(job.body)[0]
    assert math.isnan(args[0]) and args[1] == 1.5


def test_a_job_without_typed_values_carries_no_type_map() -> None:
    job = publish(["a", 1, 2.5, None, True, {"k": [1]}])
    assert "meta" not in json.loads(job.body)


def test_values_in_canvas_signatures_arrive_as_sent() -> None:
    """A chain's next task and a link carry their own typed arguments."""
    due = date(2026, 12, 24)
    then = {"task": "billing.invoice", "args": [Decimal("10.00")], "kwargs": {"due": due},
            "options": {}, "subtask_type": None, "immutable": False}
    job = publish([1], embed={"chain": [then], "callbacks": [then]})
    wire = json.loads(job.body)
    assert wire["x_celery"]["chain"][0]["args"] == ["10.00"]
    _, _, embed = celery_payload(job.body)
    assert embed["chain"][0]["args"] == [Decimal("10.00")]
    assert embed["callbacks"][0]["kwargs"] == {"due": due}


class Money:
    def __init__(self, amount: Decimal, currency: str) -> None:
        self.amount, self.currency = amount, currency

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Money) and (self.amount, self.currency) == (
            other.amount, other.currency)


register_type(Money, "test_money", lambda m: {"amount": m.amount, "currency": m.currency},
              lambda d: Money(d["amount"], d["currency"]))


def test_a_type_the_app_registers_with_kombu_arrives_as_sent() -> None:
    job = publish([Money(Decimal("5.25"), "EUR")])
    wire = json.loads(job.body)
    assert wire["args"] == [{"amount": "5.25", "currency": "EUR"}]
    assert wire["meta"]["x_celery_types"] == {"/args/0": "test_money",
                                              "/args/0/amount": "decimal"}
    money = celery_payload(job.body)[0][0]
    assert money == Money(Decimal("5.25"), "EUR") and isinstance(money.amount, Decimal)


def test_a_foreign_producer_sends_a_date_a_uuid_and_a_decimal() -> None:
    """What docs/polyglot.rst tells a client in another language to write."""
    body = json.dumps({
        "specversion": "1.0", "id": new_job_id(), "type": "billing.charge", "queue": "billing",
        "args": ["2026-07-01", "0f8fad5b-d9cb-469f-a165-70867728950e", "19.90"],
        "meta": {"x_celery_types": {"/args/0": "date", "/args/1": "uuid", "/args/2": "decimal"}},
    }).encode()
    args, _, _ = consume(body).payload
    assert args == [date(2026, 7, 1), UUID("0f8fad5b-d9cb-469f-a165-70867728950e"),
                    Decimal("19.90")]
    assert celery_payload(body)[0] == args


@pytest.mark.parametrize("types, words", [
    ({"/args/5": "date"}, "points at no value"),
    ({"/kwargs/x": "date"}, "may not be retyped"),
    ({"/args/0": "money"}, "names type 'money'"),
    ({"/args/0": "uuid"}, "does not read as uuid"),
    ({"/args/1": "date"}, "does not read as date"),
    (["/args/0"], "must be an object"),
])
def test_a_type_map_that_cannot_apply_is_dead_lettered_naming_the_entry(
        types: Any, words: str) -> None:
    body = json.dumps({"specversion": "1.0", "id": new_job_id(), "type": "billing.charge",
                       "queue": "billing", "args": ["not-a-uuid", 5],
                       "meta": {"x_celery_types": types}}).encode()
    with pytest.raises(JobRejected, match=words) as info:
        consume(body)
    assert info.value.code == INVALID_ENVELOPE


@pytest.mark.parametrize("call, path, advice", [
    (([1, {2, 3}], {}), "args[1]", "pass a list"),
    (([], {"order": {"tags": frozenset("a")}}), "kwargs['order']['tags']", "pass a list"),
    (([object()], {}), "args[0]", "register_type"),
    (([bytearray(b"x")], {}), "args[0]", "bytes("),
    (([{(1, 2): "tuple key"}], {}), "args[0]['(1, 2)']", "mapping key"),
])
def test_what_json_cannot_carry_is_an_encode_error_naming_the_value(
        call: Any, path: str, advice: str) -> None:
    with pytest.raises(EncodeError) as info:
        publish(*call)
    assert isinstance(info.value, NonJSONArgumentError)
    assert info.value.path == path and path in str(info.value) and advice in str(info.value)
    assert "'billing.charge'" in str(info.value)


def test_a_typed_value_in_meta_is_refused_naming_it() -> None:
    with pytest.raises(NonJSONArgumentError, match=r"ojs_meta\['when'\]"):
        publish([1], ojs_meta={"when": date(2026, 1, 1)})


def test_unique_fingerprints_agree_between_producer_and_worker() -> None:
    """A unique job's fingerprint from the producer's Python values equals the one the
    worker computes from the wire: the same work whoever looks at it."""
    policy = UniquePolicy(keys=["type", "args"])
    when = datetime(2026, 1, 1, 9, 30, tzinfo=UTC)  # str() and isoformat() differ
    args, kwargs = [when, Decimal("1.0"), float("nan")], {"u": VALUES[5]}
    producer = fingerprint(policy, job_type="billing.charge", queue="billing", args=args,
                           kwargs=kwargs)
    job = publish(args, kwargs, **{UNIQUE_OPTION: policy.model_dump(mode="json",
                                                                    exclude_unset=True)})
    worker = consume(job.body, job.properties).headers[UNIQUE_HEADER]["fingerprint"]
    assert producer == worker


def test_a_unique_call_with_a_set_is_an_encode_error_naming_it() -> None:
    policy = UniquePolicy(keys=["type", "args"])
    with pytest.raises(EncodeError, match=r"args\[1\] is a set"):
        fingerprint(policy, job_type="billing.charge", queue="billing", args=[1, {2}])


def test_a_value_that_refers_to_itself_is_an_encode_error() -> None:
    looped: list[Any] = [1]
    looped.append(looped)
    with pytest.raises(NonJSONArgumentError, match="refers to itself or is nested too deeply"):
        publish([looped])


def test_float_keys_are_written_as_json_writes_them() -> None:
    job = publish([{1.5: "a", float("nan"): "b", 2: "c", True: "d"}, date(2026, 1, 1)])
    assert json.loads(job.body)["args"][0] == {"1.5": "a", "NaN": "b", "2": "c", "true": "d"}


def test_a_custom_header_named_task_id_is_a_header_like_any_other() -> None:
    task_id = new_job_id()
    job = encode_task_message(
        body=([1], {}, EMBED), content_type=CELERY_CALL, properties={},
        headers={"task": "billing.charge", "id": task_id, "task_id": "from-a-header"},
        job_type="billing.charge", queue="billing")
    headers = consume(job.body, job.properties).headers
    assert headers["id"] == task_id and headers["task_id"] == "from-a-header"


def test_a_decoder_that_raises_anything_refuses_the_job_naming_the_entry() -> None:
    """An app's decoder may raise KeyError or IndexError on a foreign job's value: the
    job is dead-lettered, naming the entry (the worker goes on)."""
    body = json.dumps({"specversion": "1.0", "id": new_job_id(), "type": "billing.charge",
                       "queue": "billing", "args": [[]],
                       "meta": {"x_celery_types": {"/args/0": "test_money"}}}).encode()
    with pytest.raises(JobRejected, match=r"\[\'/args/0\'\].*KeyError|TypeError") as info:
        consume(body)
    assert info.value.code == INVALID_ENVELOPE


@pytest.mark.parametrize("pointer", [
    "/x_celery/id", "/x_celery", "/x_celery/kwargs", "/x_celery/chain/0/task",
    "/x_celery/root_id", "/x_celery/retries", "/args", "/meta/x",
])
def test_a_type_map_may_not_retype_what_celery_reads(pointer: str) -> None:
    body = json.dumps({"specversion": "1.0", "id": new_job_id(), "type": "billing.charge",
                       "queue": "billing", "args": ["0f8fad5b-d9cb-469f-a165-70867728950e"],
                       "x_celery": {"id": "0f8fad5b-d9cb-469f-a165-70867728950e",
                                    "kwargs": {"a": "1"}},
                       "meta": {"x_celery_types": {pointer: "uuid"}}}).encode()
    with pytest.raises(JobRejected, match="may not be retyped"):
        consume(body)


@pytest.mark.parametrize("pointer", ["/args/-1", "/args/00", "/args/+0", "/args/\u0660"])
def test_list_indexes_are_rfc_6901_indexes(pointer: str) -> None:
    body = json.dumps({"specversion": "1.0", "id": new_job_id(), "type": "billing.charge",
                       "queue": "billing", "args": ["2026-01-01"],
                       "meta": {"x_celery_types": {pointer: "date"}}}).encode()
    with pytest.raises(JobRejected, match="points at no value"):
        consume(body)


def test_a_builtin_type_the_app_registers_itself_travels_as_it_says() -> None:
    """An app that registers ``Decimal`` with its own marker and encoder keeps them (as
    plain Celery's JSON would), and its workers read it back with its decoder."""
    register_type(Decimal, "test_cents", lambda d: int(d * 100), lambda c: Decimal(c) / 100)
    try:
        job = publish([Decimal("12.34")])
        wire = json.loads(job.body)
        assert wire["args"] == [1234]
        assert wire["meta"]["x_celery_types"] == {"/args/0": "test_cents"}
        assert celery_payload(job.body)[0] == [Decimal("12.34")]
    finally:  # kombu's own registration again: the natural decimal string
        register_type(Decimal, "decimal", str, Decimal)
    assert json.loads(publish([Decimal("1.50")]).body)["args"] == ["1.50"]
