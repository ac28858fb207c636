"""Unique jobs and idempotency keys: the rules (spec/unique.py), the envelope and header
they put on the wire, and the refusal without a store (no broker, no Redis)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from celery import Celery

import ojs_kombu
from ojs_kombu.spec.decode import decode_job_message
from ojs_kombu.spec.encode import build_job
from ojs_kombu.spec.envelope import UniquePolicy
from ojs_kombu.spec.errors import DedupNotConfigured, JobEncodeError, JobOptionError
from ojs_kombu.spec.job_ids import new_job_id
from ojs_kombu.spec.unique import (
    UNIQUE_HEADER,
    KeyRecord,
    Resolution,
    RunVerdict,
    fingerprint,
    idempotency_key,
    period_ms,
    resolve,
    run_verdict,
    unique_policy,
)


def policy(**fields: Any) -> UniquePolicy:
    return UniquePolicy.model_validate(fields)


def test_type_is_always_in_the_fingerprint_and_other_dimensions_only_when_listed() -> None:
    default = policy()
    base = dict(job_type="email.send", queue="email", args=[1], kwargs={"to": "a"})
    assert fingerprint(default, **base) == fingerprint(default, **{**base, "queue": "other",
                                                                     "args": [2]})
    assert fingerprint(default, **base) != fingerprint(default, **{**base,
                                                                     "job_type": "email.x"})
    with_queue = policy(keys=["type", "queue"])
    assert fingerprint(with_queue, **base) != fingerprint(with_queue, **{**base, "queue": "b"})


def test_args_keys_pick_keyword_arguments_then_objects_among_the_positional_ones() -> None:
    by_user = policy(keys=["type", "args"], args_keys=["user_id"])
    one = fingerprint(by_user, job_type="t", queue="q", args=[], kwargs={"user_id": 7, "x": 1})
    assert one == fingerprint(by_user, job_type="t", queue="q", args=[], kwargs={"user_id": 7})
    assert one == fingerprint(by_user, job_type="t", queue="q", args=[{"user_id": 7, "y": 2}])
    assert one != fingerprint(by_user, job_type="t", queue="q", args=[{"user_id": 8}])
    whole = policy(keys=["type", "args"])
    assert fingerprint(whole, job_type="t", queue="q", args=[1], kwargs={"a": 1}) != \
        fingerprint(whole, job_type="t", queue="q", args=[1], kwargs={"a": 2})


def test_meta_keys_pick_meta() -> None:
    by_tenant = policy(keys=["type", "meta"], meta_keys=["tenant_id"])
    a = fingerprint(by_tenant, job_type="t", queue="q", args=[], meta={"tenant_id": "a",
                                                                      "trace_id": "x"})
    assert a == fingerprint(by_tenant, job_type="t", queue="q", args=[1], meta={"tenant_id": "a"})
    assert a != fingerprint(by_tenant, job_type="t", queue="q", args=[], meta={"tenant_id": "b"})


@pytest.mark.parametrize(("state", "states", "expected"), [
    (None, None, Resolution.ENQUEUE),
    ("available", None, Resolution.REJECT),
    ("active", None, Resolution.REJECT),
    ("completed", None, Resolution.ENQUEUE),
    ("completed", ["completed"], Resolution.REJECT),
    ("active", ["available"], Resolution.ENQUEUE),
])
def test_only_a_checked_state_is_a_conflict(state: str | None, states: list[str] | None,
                                            expected: Resolution) -> None:
    fields: dict[str, Any] = {} if states is None else {"states": states}
    assert resolve(policy(**fields), state) is expected


@pytest.mark.parametrize("mode", ["reject", "ignore", "replace", "replace_except_schedule"])
def test_on_conflict_names_the_resolution(mode: str) -> None:
    assert resolve(policy(on_conflict=mode), "available").value == mode


def test_every_record_expires() -> None:
    assert period_ms(policy(period="PT5M"), 86_400) == 300_000
    assert period_ms(policy(), 86_400) == 86_400_000


def test_a_unique_option_the_schema_refuses_names_the_option() -> None:
    with pytest.raises(JobOptionError, match="ojs_unique"):
        unique_policy({"keys": ["type", "meta"]}, task_name="t")  # meta_keys missing
    with pytest.raises(JobOptionError, match="ojs_unique"):
        unique_policy({"on_conflict": "merge"}, task_name="t")
    assert unique_policy(True, task_name="t") == UniquePolicy()
    assert unique_policy(None, task_name="t") is None


def test_an_idempotency_key_is_a_string_the_job_id_or_computed() -> None:
    job_id = new_job_id()
    assert idempotency_key("k", task_name="t", job_id=job_id, args=[], kwargs={}) == "k"
    assert idempotency_key(True, task_name="t", job_id=job_id, args=[], kwargs={}) == job_id
    assert idempotency_key(lambda args, kwargs: f"order:{kwargs['id']}", task_name="t",
                           job_id=job_id, args=[], kwargs={"id": 4}) == "order:4"
    with pytest.raises(JobOptionError, match="ojs_idempotency_key"):
        idempotency_key("", task_name="t", job_id=job_id, args=[], kwargs={})


@pytest.mark.parametrize(("record", "attempt", "redelivered", "expected"), [
    (None, 1, False, RunVerdict.RUN),
    (KeyRecord("completed", "a", 1), 1, False, RunVerdict.DUPLICATE),
    (KeyRecord("completed", "b", 1), 1, True, RunVerdict.DUPLICATE),
    # the broker retried the job: attempts are tracked, not blocked
    (KeyRecord("running", "a", 1), 2, False, RunVerdict.RUN),
    # redelivered after the holder's channel closed (worker killed)
    (KeyRecord("running", "a", 1), 1, True, RunVerdict.RUN),
    # a second copy while the first runs
    (KeyRecord("running", "a", 1), 1, False, RunVerdict.BUSY),
    (KeyRecord("running", "b", 1), 1, True, RunVerdict.BUSY),
])
def test_run_verdict(record: KeyRecord | None, attempt: int, redelivered: bool,
                     expected: RunVerdict) -> None:
    assert run_verdict(record, job_id="a", attempt=attempt, redelivered=redelivered) \
        is expected


def test_the_envelope_carries_the_policy_and_the_key_in_meta_and_header(job_check: Any) -> None:
    job_id = new_job_id()
    now = datetime.now(UTC)
    job = build_job(job_id=job_id, job_type="email.send", queue="email", args=[1],
                    task_name="send", now=now, created=now.isoformat(),
                    unique=policy(keys=["type", "args"], period="PT1H"),
                    idempotency_key="order:1")
    body = json.loads(job.body)
    job_check.validate(body)
    assert body["unique"] == {"keys": ["type", "args"], "period": "PT1H"}
    assert body["meta"]["idempotency_key"] == "order:1"
    assert job.properties["application_headers"]["x-ojs-idempotency-key"] == "order:1"
    consumed = decode_job_message(job.body, job.properties, resolve_task=lambda t: "send",
                                  queue="email")
    unique = consumed.headers[UNIQUE_HEADER]
    assert unique["fingerprint"] == fingerprint(policy(keys=["type", "args"]),
                                                job_type="email.send", queue="email", args=[1])
    assert consumed.headers["x-ojs-idempotency-key"] == "order:1"


@pytest.fixture
def app() -> Celery:
    app = Celery("unique", broker="ojs://guest:guest@127.0.0.1:1//", set_as_current=False)
    ojs_kombu.install(app)

    @app.task(name="math.add", shared=False)
    def add(x: int) -> int:
        return x

    @app.task(name="math.keyed", shared=False, ojs_idempotency_key=True)
    def keyed(x: int) -> int:
        return x

    return app


@pytest.mark.parametrize("options", [{"ojs_idempotency_key": "k"},
                                     {"ojs_unique": {"keys": ["type"]}}])
def test_without_ojs_dedup_url_a_unique_or_keyed_job_is_refused_at_publish(
        app: Celery, options: dict[str, Any]) -> None:
    with pytest.raises(DedupNotConfigured, match="ojs_dedup_url"):
        app.tasks["math.add"].apply_async((1,), **options)


def test_a_task_option_key_is_refused_without_a_store_too(app: Celery) -> None:
    with pytest.raises(DedupNotConfigured, match="ojs_dedup_url"):
        app.tasks["math.keyed"].delay(1)
    with pytest.raises(DedupNotConfigured):
        ojs_kombu.enqueue_many(app, [app.tasks["math.keyed"].s(1)])


def test_a_batch_refuses_unique_jobs(app: Celery) -> None:
    app.conf.ojs_dedup_url = "redis://127.0.0.1:1/0"
    with pytest.raises(JobEncodeError, match="apply_async"):
        ojs_kombu.enqueue_many(app, [("math.add", (1,), {}, {"ojs_unique": {}})])


def test_send_task_by_name_is_refused_without_a_store_too(app: Celery) -> None:
    with pytest.raises(DedupNotConfigured, match="ojs_dedup_url"):
        app.send_task("math.add", (1,), ojs_idempotency_key="k")


@pytest.mark.parametrize("when_down", ["run", "retry"])
def test_with_the_store_down_a_keyed_job_is_never_a_duplicate(
        when_down: str, caplog: pytest.LogCaptureFixture) -> None:
    from types import SimpleNamespace

    from celery.exceptions import Retry
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from ojs_kombu.celery.dedup import guard

    reader = InMemoryMetricReader()
    app = Celery("down", broker="ojs://guest:guest@127.0.0.1:1//", set_as_current=False)
    ojs_kombu.install(app)
    app.conf.update(ojs_dedup_url="redis://127.0.0.1:1/0", ojs_dedup_when_down=when_down,
                    ojs_meter_provider=MeterProvider(metric_readers=[reader]))

    @app.task(name="math.add", shared=False)
    def add(x: int) -> int:
        return x

    request = SimpleNamespace(id=new_job_id(), delivery_info={"routing_key": "default"},
                              ignore_result=True, **{"x-ojs-idempotency-key": "k",
                                                     "x-ojs-attempt": 1})
    ran: list[int] = []
    with caplog.at_level("WARNING"):
        if when_down == "run":
            assert guard(add, request, lambda: ran.append(1) or 7) == 7
        else:
            with pytest.raises(Retry):
                guard(add, request, lambda: ran.append(1))
    assert ran == ([1] if when_down == "run" else [])
    assert "dedup degraded" in caplog.text and request.id in caplog.text
    points = {m.name: m.data.data_points for rm in reader.get_metrics_data().resource_metrics
              for sm in rm.scope_metrics for m in sm.metrics}
    assert [p.value for p in points["ojs.dedup.degraded"]] == [1]
