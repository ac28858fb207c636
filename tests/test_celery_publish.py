"""Which ``apply_async`` calls go straight to the OJS channel, and what they send (no broker)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery._state import _task_stack
from celery.app.task import Task
from celery.signals import before_task_publish

import ojs_kombu
from ojs_kombu.celery import publish as celery_publish
from ojs_kombu.celery.publish import SendSettings, direct_refusal
from ojs_kombu.spec.encode import OutgoingJob


@pytest.fixture
def app() -> Celery:
    app = Celery("direct", broker="ojs://guest:guest@127.0.0.1:1//", set_as_current=False)
    ojs_kombu.install(app)

    @app.task(name="math.add", shared=False)
    def add(x: int, y: int = 0) -> int:
        return x + y

    @app.task(name="math.routed", shared=False, routing_key="elsewhere")
    def routed() -> None: ...

    @app.task(name="math.shadowed", shared=False, shadow_name=lambda *a: "other")
    def shadowed() -> None: ...

    @app.task(name="math.limited", shared=False, time_limit=1, soft_time_limit=5)
    def limited() -> None: ...

    return app


@pytest.fixture
def sent(app: Celery, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, Any]]]:
    """Every publish, as ``("direct", OutgoingJob)`` or ``("celery", send_task kwargs)``;
    nothing reaches a broker."""
    log: list[tuple[str, Any]] = []

    def direct(task: Task, args: Any, kwargs: Any, task_id: Any, options: dict) -> Any:
        job = celery_publish.JobEncoder(task._get_app()).encode_call(
            task.name, args, kwargs, {**options, **({"task_id": task_id} if task_id else {})})
        log.append(("direct", job))
        return task.AsyncResult(job.job_id)

    def send_task(name: str, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        log.append(("celery", {"name": name, "args": args, "kwargs": kwargs, **options}))
        return app.AsyncResult(options.get("task_id") or "x")

    monkeypatch.setattr("ojs_kombu.celery.task.apply_async_direct", direct)
    monkeypatch.setattr(app, "send_task", send_task)
    yield log


def test_a_plain_call_is_direct_and_sends_the_ojs_job(app: Celery, sent: list) -> None:
    result = app.tasks["math.add"].apply_async((1,), {"y": 3}, priority=5, expires=60,
                                               ojs_meta={"tenant": "a"})
    (path, job), = sent
    assert path == "direct" and isinstance(job, OutgoingJob)
    body = json.loads(job.body)
    assert result.id == job.job_id == body["id"]
    assert body["type"] == "math.add" and body["args"] == [1]
    assert body["x_celery"]["kwargs"] == {"y": 3}
    assert body["priority"] == 5 and "expires_at" in body and body["meta"] == {"tenant": "a"}
    # Celery's origin header travels as it does on Celery's path.
    assert body["x_celery"]["origin"].startswith("gen")
    assert app.tasks["math.add"].delay(4).id != result.id and sent[-1][0] == "direct"


@pytest.mark.parametrize("call, reason", [
    (lambda t: t.apply_async((1,), link=t.s()), None),
    (lambda t: t.apply_async((1,), link_error=t.s()), None),
    (lambda t: t.apply_async((1,), shadow="other"), None),
    (lambda t: t.apply_async((1,), headers={"x": 1}), "headers"),
    (lambda t: t.apply_async((1,), routing_key="default"), "routing_key"),
    (lambda t: t.apply_async((1,), exchange="ojs.exchange.direct"), "exchange"),
    (lambda t: t.apply_async((1,), retry_policy={"max_retries": 1}), "retry_policy"),
    (lambda t: t.apply_async((1,), serializer="pickle"), "serializer"),
    (lambda t: t.apply_async((1,), task_id="3f2b8c1e-4c4a-4b6e-9a51-2f7b7c1d2e3f"),
     "UUIDv7"),
], ids=["link", "link_error", "shadow", "headers", "routing_key", "exchange", "retry_policy",
        "pickle", "uuid4"])
def test_calls_that_need_celerys_path_take_it(app: Celery, sent: list, call: Any,
                                              reason: str | None) -> None:
    task = app.tasks["math.add"]
    call(task)
    assert [path for path, _ in sent] == ["celery"]
    if reason is not None:
        options = {k: v for k, v in sent[0][1].items()
                   if k in ("headers", "routing_key", "exchange", "retry_policy",
                            "serializer")}
        task_id = sent[0][1].get("task_id")
        assert reason in (direct_refusal(task, app, task_id, options) or "")


def test_task_options_and_app_settings_that_need_celerys_path(app: Celery) -> None:
    add = app.tasks["math.add"]
    assert direct_refusal(add, app, None, {}) is None
    assert "routing_key" in direct_refusal(app.tasks["math.routed"], app, None, {})
    assert direct_refusal(app.tasks["math.shadowed"], app, None, {}) == "shadow_name"
    app.conf.task_send_sent_event = True
    assert direct_refusal(add, app, None, {}) == "task_send_sent_event"
    app.conf.task_send_sent_event = False
    app.conf.task_always_eager = True
    assert direct_refusal(add, app, None, {}) == "task_always_eager"
    app.conf.task_always_eager = False

    def receiver(**_: Any) -> None: ...

    before_task_publish.connect(receiver)
    try:
        assert "receivers" in direct_refusal(add, app, None, {})
    finally:
        before_task_publish.disconnect(receiver)
    assert direct_refusal(add, app, None, {}) is None


def test_task_routes_mappings_stay_direct_functions_do_not() -> None:
    mapped = Celery("mapped", broker="ojs://", set_as_current=False)
    ojs_kombu.install(mapped)
    mapped.conf.task_routes = {"math.*": {"queue": "math"}}
    add = mapped.task(name="math.add", shared=False)(_add)
    assert direct_refusal(add, mapped, None, {}) is None
    assert celery_publish.JobEncoder(mapped).encode_call(add.name, (1,), None, {}).queue \
        == "math"
    routed = Celery("routed", broker="ojs://", set_as_current=False)
    ojs_kombu.install(routed)
    routed.conf.task_routes = [lambda name, args, kwargs, options, **kw: {"queue": "x"}]
    add = routed.task(name="math.add", shared=False)(_add)
    assert "task_routes function" in direct_refusal(add, routed, None, {})


def _add(x: int) -> int:
    return x


def test_settings_read_once_like_celerys_task_sender() -> None:
    conf = Celery("s", set_as_current=False).conf
    conf.task_compression = "gzip"
    assert "gzip" in SendSettings.from_conf(conf).refusal
    conf.task_compression = None
    conf.task_publish_retry_policy = {"max_retries": 7}
    settings = SendSettings.from_conf(conf)
    assert settings.refusal is None and settings.retry is True
    assert settings.retry_policy == {"max_retries": 7}


def test_a_call_from_inside_a_running_task_takes_celerys_path(app: Celery, sent: list) -> None:
    add = app.tasks["math.add"]
    add.push_request(id="01a201bd-4114-7309-9b3f-566019622ed6", called_directly=False)
    _task_stack.push(add)  # what the worker does around a job
    try:
        assert "running task" in direct_refusal(add, app, None, {})
        add.apply_async((1,))
    finally:
        _task_stack.pop()
        add.pop_request()
    assert [path for path, _ in sent] == ["celery"]


def test_the_direct_path_checks_the_call_as_celery_does(app: Celery, sent: list) -> None:
    with pytest.raises(TypeError):
        app.tasks["math.add"].apply_async((1, 2, 3))  # typing: one argument too many
    with pytest.raises(ValueError, match="soft_time_limit"):
        app.tasks["math.limited"].apply_async()
    assert sent == []


def test_non_json_arguments_fall_back_to_celerys_encoder(app: Celery,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """kombu's encoder writes objects with ``__json__``; Celery's path decides."""
    taken: list[str] = []
    monkeypatch.setattr(app, "send_task", lambda *a, **k: taken.append("celery"))

    class Point:
        def __json__(self) -> list[int]:
            return [1, 2]

    assert celery_publish.apply_async_direct(app.tasks["math.add"], (Point(),), None, None,
                                             {}) is None
    app.tasks["math.add"].apply_async((Point(),))
    assert taken == ["celery"]


def test_backends_that_declare_reply_queues_and_other_transports_take_celerys_path() -> None:
    """Neither case connects: both are decided before the first frame."""
    rpc = Celery("rpc", broker="ojs://guest:guest@127.0.0.1:1//", backend="rpc://",
                 set_as_current=False)
    ojs_kombu.install(rpc)

    @rpc.task(name="math.add", shared=False)
    def add(x: int) -> int:
        return x

    assert direct_refusal(add, rpc, None, {}) is None
    assert celery_publish.apply_async_direct(add, (1,), None, None, {}) is None
    plain = Celery("plain", broker="amqp://guest:guest@127.0.0.1:1//", set_as_current=False)
    ojs_kombu.install(plain)

    @plain.task(name="math.add", shared=False)
    def add_plain(x: int) -> int:
        return x

    assert celery_publish.apply_async_direct(add_plain, (1,), None, None, {}) is None
