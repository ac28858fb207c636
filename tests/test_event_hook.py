"""The observation hook: named moments, observers called in order, failures contained."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from celery import Celery

import ojs_kombu
from ojs_kombu.events.hook import Hook
from ojs_kombu.events.job_info import JobInfo
from ojs_kombu.events.observer import MOMENTS, Observer

JOB = JobInfo("019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f", "email.send", "email", 1)


class Recording(Observer):
    def __init__(self, name: str, calls: list[tuple[str, str]]) -> None:
        self.name = name
        self.calls = calls

    def job_started(self, job: JobInfo, worker_id: str) -> None:
        self.calls.append((self.name, f"started {job.job_id} on {worker_id}"))

    def message_acked(self, queue: str) -> None:
        self.calls.append((self.name, f"acked {queue}"))


class Broken(Observer):
    def job_started(self, job: JobInfo, worker_id: str) -> None:
        raise RuntimeError("observer bug")


def test_every_moment_is_a_no_op_on_the_base_class() -> None:
    assert "job_started" in MOMENTS and "backpressure_warning" in MOMENTS
    assert len(MOMENTS) == len(set(MOMENTS)) >= 30
    hook = Hook()
    assert not any(hook.observes(moment) for moment in MOMENTS)
    hook.job_started(JOB, "w1")  # nobody observes: nothing happens, nothing raises


def test_observers_are_called_in_the_order_they_were_added() -> None:
    calls: list[tuple[str, str]] = []
    hook = Hook(Recording("first", calls))
    hook.add(Recording("second", calls))
    hook.job_started(JOB, "w1")
    hook.message_acked("email")
    assert calls == [("first", f"started {JOB.job_id} on w1"),
                     ("second", f"started {JOB.job_id} on w1"),
                     ("first", "acked email"), ("second", "acked email")]


def test_a_moment_no_observer_overrides_is_not_dispatched() -> None:
    calls: list[tuple[str, str]] = []
    hook = Hook(Recording("only", calls))
    assert hook.observes("job_started") and hook.observes("message_acked")
    assert not hook.observes("job_completed") and not hook.observes("message_nacked")
    hook.job_completed(JOB, 0.1, None)
    hook.message_nacked("email")
    assert calls == []


def test_a_failing_observer_is_isolated_from_the_job_and_the_others(
        caplog: pytest.LogCaptureFixture) -> None:
    calls: list[tuple[str, str]] = []
    hook = Hook(Recording("before", calls), Broken(), Recording("after", calls))
    with caplog.at_level(logging.ERROR, logger="ojs_kombu.events"):
        hook.job_started(JOB, "w1")  # does not raise
    assert [name for name, _ in calls] == ["before", "after"]
    assert hook.failures == 1
    assert "failed at job_started" in caplog.text and "observer bug" in caplog.text


def test_a_single_failing_observer_is_contained_too() -> None:
    hook = Hook(Broken())
    hook.job_started(JOB, "w1")
    hook.job_started(JOB, "w2")
    assert hook.failures == 2


def test_keyboard_interrupt_is_not_swallowed() -> None:
    class Interrupted(Observer):
        def message_acked(self, queue: str) -> None:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Hook(Interrupted()).message_acked("email")


def test_removed_observers_are_no_longer_called() -> None:
    calls: list[tuple[str, str]] = []
    first, second = Recording("first", calls), Recording("second", calls)
    hook = Hook(first, second)
    hook.remove(first)
    hook.message_acked("email")
    hook.remove(second)
    hook.remove(second)  # idempotent
    hook.message_acked("email")
    assert calls == [("second", "acked email")]
    assert hook.observers == () and not hook.observes("message_acked")


def test_only_observers_are_accepted() -> None:
    with pytest.raises(TypeError, match="Observer"):
        Hook().add(print)  # type: ignore[arg-type]


def test_an_app_s_observers_follow_its_events_and_metrics() -> None:
    """User middleware registers as the built-in observers do, and runs after them."""
    app = ojs_kombu.install(Celery("hook", broker="ojs://", set_as_current=False))
    seen: list[Any] = []
    ojs_kombu.subscribe(app, lambda event: seen.append(("event", event.type)))
    calls: list[tuple[str, str]] = []

    class Middleware(Recording):
        def job_started(self, job: JobInfo, worker_id: str) -> None:
            seen.append(("middleware", "job_started"))

    middleware = ojs_kombu.add_observer(app, Middleware("mw", calls))
    hook = app.amqp.binding.hook
    hook.job_started(JOB, "w1")
    assert seen == [("event", "job.started"), ("middleware", "job_started")]
    ojs_kombu.remove_observer(app, middleware)
    hook.job_started(JOB, "w1")
    assert seen[2:] == [("event", "job.started")]


class Dozing(Recording):
    """An observer that says when it is idle, as the event emitter and the metrics do."""

    def __init__(self, name: str, calls: list[tuple[str, str]]) -> None:
        super().__init__(name, calls)
        self.up = False

    def awake(self) -> bool:
        return self.up


def test_an_observer_asleep_is_skipped_and_its_moment_not_listened_to() -> None:
    calls: list[tuple[str, str]] = []
    dozing = Dozing("dozing", calls)
    hook = Hook(dozing)
    assert hook.observes("job_started") and not hook.listens("job_started")
    hook.job_started(JOB, "w1")
    assert calls == []
    dozing.up = True  # no re-wiring: the next moment asks again
    assert hook.listens("job_started")
    hook.job_started(JOB, "w1")
    assert calls == [("dozing", f"started {JOB.job_id} on w1")]


def test_an_observer_always_awake_keeps_the_moment_listened_to() -> None:
    calls: list[tuple[str, str]] = []
    hook = Hook(Dozing("dozing", calls), Recording("always", calls))
    assert hook.listens("job_started") and hook.listens("message_acked")
    assert not hook.listens("job_completed")  # nobody observes it
    hook.message_acked("email")
    assert calls == [("always", "acked email")]


def test_a_worker_with_no_subscriber_and_no_metrics_sdk_listens_to_no_job_moment() -> None:
    """The app's own observers: the OJS events wake with a subscriber; a job's moments
    cost nothing until then (``JobRequest`` builds no ``JobInfo`` for them)."""
    app = ojs_kombu.install(Celery("asleep", broker="ojs://", set_as_current=False))
    hook = app.amqp.binding.hook
    if app.amqp.binding.metrics.live():
        pytest.skip("a global OpenTelemetry MeterProvider is set in this process")
    assert not hook.listens("job_started") and not hook.listens("job_completed")
    seen: list[str] = []
    subscription = ojs_kombu.subscribe(app, lambda event: seen.append(event.type))
    assert hook.listens("job_started")
    hook.job_started(JOB, "w1")
    assert seen == ["job.started"]
    subscription.cancel()
    assert not hook.listens("job_started")
