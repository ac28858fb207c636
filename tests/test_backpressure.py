"""Backpressure policy (no broker): configuration, queue arguments, strategies, retries,
circuit breaker, pressure events."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from ojs_kombu.amqp.backpressure.circuit_breaker import CircuitBreaker
from ojs_kombu.amqp.backpressure.monitor import BackpressureMonitor
from ojs_kombu.amqp.binding import Binding
from ojs_kombu.amqp.broker.topology import (
    dead_letter_queue_arguments,
    declare_queue_topology,
    retry_queue_arguments,
)
from ojs_kombu.events.bus import EventBus, EventFilter
from ojs_kombu.events.emitter import JobEvents
from ojs_kombu.events.hook import Hook
from ojs_kombu.events.metric_observer import MetricsObserver
from ojs_kombu.events.metrics import OJSMetrics
from ojs_kombu.spec.backoff import backoff
from ojs_kombu.spec.backpressure import Bounds, ProducerBackpressure, drops_head, maxlen_death
from ojs_kombu.spec.errors import (
    BatchPublishError,
    BatchQueueFullError,
    JobNackedError,
    OJSConfigurationError,
    QueueFullError,
)
from ojs_kombu.spec.naming import TopologyNames
from ojs_kombu.spec.settings import OJSSettings


def settings(**options: Any) -> OJSSettings:
    return OJSSettings.from_options({f"ojs_{k}": v for k, v in options.items()}, source="test")


def arguments(queue: str = "email", **options: Any) -> dict[str, Any]:
    return Binding.from_settings(settings(**options)).declare_arguments(queue)


# -- configuration -> Queue.Declare arguments -------------------------------------------


def test_bounds_and_strategies_become_queue_arguments() -> None:
    assert arguments(queues={"email": {"max_depth": 10000, "max_size_bytes": 1 << 20}}) == {
        "x-max-length": 10000, "x-max-length-bytes": 1 << 20, "x-overflow": "reject-publish"}
    assert arguments(queues={"email": {"max_depth": 5, "strategy": "block"}})[
        "x-overflow"] == "reject-publish"
    assert arguments(queues={"email": {"max_depth": 5, "strategy": "drop_oldest"}})[
        "x-overflow"] == "drop-head"


def test_unconfigured_queue_is_unbounded_and_keeps_default_priority() -> None:
    assert arguments(queues={"other": {"max_depth": 5}}) == {}
    assert arguments(max_priority=10, queues={"other": {"max_depth": 5}}) == {
        "x-max-priority": 10}


def test_drop_oldest_is_never_a_default_for_raw_bounds() -> None:
    # RabbitMQ's default overflow is drop-head: a raw bound must not silently drop jobs
    assert arguments(queue_arguments={"email": {"x-max-length": 3}})["x-overflow"] == \
        "reject-publish"
    explicit = arguments(queue_arguments={"email": {"x-max-length": 3,
                                                    "x-overflow": "drop-head"}})
    assert explicit["x-overflow"] == "drop-head"


def test_priority_per_queue() -> None:
    assert "x-max-priority" not in arguments(queues={"email": {"priority": False}})
    assert arguments(queues={"email": {"priority": 5}})["x-max-priority"] == 5
    assert arguments(max_priority=None, queues={"email": {"priority": True}})[
        "x-max-priority"] == 10
    assert "x-max-priority" not in arguments(max_priority=None)


def test_quorum_queues_with_at_least_once_dead_lettering() -> None:
    # at-least-once is a quorum queue's default; drop_oldest (drop-head) and an
    # explicit at-most-once leave it out
    assert arguments(queues={"email": {"type": "quorum"}}) == {
        "x-queue-type": "quorum", "x-overflow": "reject-publish",
        "x-dead-letter-strategy": "at-least-once"}
    assert arguments(queues={"email": {"type": "quorum",
                                       "dead_letter_strategy": "at-most-once"}}) == {
        "x-queue-type": "quorum"}
    assert arguments(queues={"email": {"type": "quorum", "max_depth": 5,
                                       "strategy": "drop_oldest"}}) == {
        "x-queue-type": "quorum", "x-max-length": 5, "x-overflow": "drop-head"}
    assert arguments(queues={"email": {"type": "quorum", "max_depth": 100,
                                       "dead_letter_strategy": "at-least-once"}}) == {
        "x-queue-type": "quorum", "x-max-length": 100, "x-overflow": "reject-publish",
        "x-dead-letter-strategy": "at-least-once"}
    # at-least-once needs reject-publish even without a bound
    assert arguments(queue_defaults={"type": "quorum",
                                     "dead_letter_strategy": "at-least-once"})[
        "x-overflow"] == "reject-publish"


def test_defaults_apply_to_every_queue_and_entries_override_them() -> None:
    binding = Binding.from_settings(settings(
        max_priority=10, queue_defaults={"type": "quorum", "max_depth": 1000},
        queues={"email": {"max_depth": 10}, "legacy": {"type": "classic"}}))
    assert binding.declare_arguments("email")["x-max-length"] == 10
    assert binding.declare_arguments("email")["x-queue-type"] == "quorum"
    assert binding.declare_arguments("reports")["x-max-length"] == 1000
    legacy = binding.declare_arguments("legacy")
    assert "x-queue-type" not in legacy and legacy["x-max-priority"] == 10


@pytest.mark.parametrize(("options", "names"), [
    ({"queues": {"email": {"max_depth": 10000, "strategy": "reject", "warn_at": 0.8,
                           "priority": True, "type": "quorum"}}},
     ["ojs_queues['email']", "priority", "quorum"]),
    ({"queues": {"email": {"strategy": "drop_oldest"}}},
     ["ojs_queues['email']", "drop_oldest", "max_depth"]),
    ({"queues": {"email": {"type": "quorum", "max_depth": 5, "strategy": "drop_oldest",
                           "dead_letter_strategy": "at-least-once"}}},
     ["ojs_queues['email']", "drop_oldest", "at-least-once"]),
    ({"queues": {"email": {"dead_letter_strategy": "at-least-once"}}},
     ["ojs_queues['email']", "quorum"]),
    ({"queue_defaults": {"type": "quorum"}, "queues": {"email": {"priority": 10}}},
     ["ojs_queues['email']", "priority"]),
    ({"queue_defaults": {"strategy": "drop_oldest"}}, ["ojs_queue_defaults", "drop_oldest"]),
    ({"queues": {"email": {"priority": 300}}}, ["ojs_queues['email']", "priority"]),
])
def test_bad_combinations_are_refused_at_configuration_time(
        options: dict[str, Any], names: list[str]) -> None:
    with pytest.raises(OJSConfigurationError) as info:
        settings(**options)
    for name in names:
        assert name in str(info.value)


@pytest.mark.parametrize("bad", [{"max_depth": -1}, {"warn_at": 1.5}, {"strategy": "drop"},
                                 {"type": "stream"}, {"max_dept": 5}])
def test_invalid_values_name_the_setting(bad: dict[str, Any]) -> None:
    with pytest.raises(OJSConfigurationError, match="queues"):
        settings(queues={"email": bad})


def test_raw_arguments_clashing_with_queue_config_are_refused() -> None:
    binding = Binding.from_settings(settings(
        queues={"email": {"max_depth": 10}},
        queue_arguments={"email": {"x-max-length": 20}}))
    with pytest.raises(OJSConfigurationError, match=r"'email'.*x-max-length"):
        binding.declare_arguments("email")


def test_raw_quorum_arguments_with_classic_only_ones_are_refused() -> None:
    with pytest.raises(OJSConfigurationError, match="x-max-priority"):
        arguments(queue_arguments={"email": {"x-queue-type": "quorum", "x-max-priority": 5}})
    with pytest.raises(OJSConfigurationError, match="reject-publish-dlx"):
        arguments(queue_arguments={"email": {"x-queue-type": "quorum", "x-max-length": 1,
                                             "x-overflow": "reject-publish-dlx"}})
    with pytest.raises(OJSConfigurationError, match="at-least-once"):
        arguments(queue_arguments={"email": {"x-queue-type": "quorum",
                                             "x-dead-letter-strategy": "at-least-once"}})
    # a raw quorum type still drops the default priority, as before
    assert arguments(queue_arguments={"email": {"x-queue-type": "quorum"}}) == {
        "x-queue-type": "quorum"}


def test_retry_and_dead_letter_queues_follow_the_job_queue_type() -> None:
    names = TopologyNames()
    classic = retry_queue_arguments(names, "email", 1000, {"x-max-priority": 10})
    assert "x-queue-type" not in classic and "x-expires" in classic
    quorum = retry_queue_arguments(names, "email", 1000, {"x-queue-type": "quorum"})
    assert quorum["x-queue-type"] == "quorum" and "x-expires" in quorum
    alo = retry_queue_arguments(names, "email", 1000, {
        "x-queue-type": "quorum", "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish"})
    assert alo["x-dead-letter-strategy"] == "at-least-once"
    assert alo["x-overflow"] == "reject-publish"
    assert "x-expires" not in alo  # expiry would delete jobs waiting for room
    assert dead_letter_queue_arguments({"x-queue-type": "quorum"}) == {"x-queue-type": "quorum"}
    assert dead_letter_queue_arguments({"x-max-length": 5}) == {}


def test_unbounded_queues_are_reported_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    binding = Binding.from_settings(settings(queues={"email": {"max_depth": 5},
                                                     "firehose": {"max_depth": 0}}))
    assert binding.warn_unbounded(["email", "reports", "default", "firehose"]) == [
        "default", "reports"]
    assert len(caplog.records) == 1
    line = caplog.records[0].getMessage()
    assert "'default', 'reports' have no bound" in line and "max_depth=0" in line
    assert "'email'" not in line and "'firehose'" not in line  # bounded, unbounded on purpose


def test_unbounded_on_purpose_by_default_reports_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    binding = Binding.from_settings(settings(queue_defaults={"max_depth": 0}))
    assert binding.warn_unbounded(["email", "default"]) == []
    assert caplog.records == []


# -- the monitor ----------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class Broker:
    """A queue of ``bound`` that nacks publishes while full; ``drain`` frees room."""

    def __init__(self, monitor: BackpressureMonitor, queue: str, bound: int) -> None:
        self.monitor, self.queue, self.bound = monitor, queue, bound
        self.depth = 0
        self.sent = 0
        self.on_sleep: Any = None

    def send(self, job_id: str = "j1") -> None:
        self.sent += 1
        if self.depth >= self.bound:
            raise self.monitor.nack_error(self.queue, job_id, lambda _q: self.depth)
        self.depth += 1

    def read(self, _queue: str) -> int:
        return self.depth


def observed(*observers: Any) -> tuple[Hook, list[dict[str, Any]]]:
    """A hook with the OJS events (and ``observers``), and the ``backpressure.*`` events a
    subscriber that asks for them receives."""
    bus, events = EventBus(), []
    bus.subscribe(events.append, EventFilter(event_types=["backpressure.*"]))
    return Hook(JobEvents(bus, "ojs://ojs-kombu"), *observers), events


def monitor_for(bounds: Bounds, clock: Clock, **settings: Any
                ) -> tuple[BackpressureMonitor, list[dict[str, Any]]]:
    hook, events = observed()
    monitor = BackpressureMonitor(ProducerBackpressure(**settings), lambda _q: bounds,
                                  hook=hook, clock=clock, sleep=clock.sleep)
    return monitor, events


REJECT = Bounds(max_depth=2, overflow="reject-publish")


def test_reject_raises_queue_full_with_depth_bound_and_retry_after() -> None:
    clock = Clock()
    monitor, events = monitor_for(REJECT, clock)
    broker = Broker(monitor, "email", 2)
    for _ in range(2):
        monitor.publish("email", "j1", "email.send", broker.send, broker.read)
    with pytest.raises(QueueFullError) as info:
        monitor.publish("email", "j3", "email.send", lambda: broker.send("j3"), broker.read)
    error = info.value
    assert isinstance(error, JobNackedError)  # existing handlers keep working
    assert (error.queue, error.depth, error.bound, error.retry_after) == ("email", 2, 2, 1.0)
    assert error.job_id == "j3" and error.rejected == ("j3",)
    assert "'email'" in str(error) and "depth bound (2 jobs)" in str(error)
    assert error.to_dict()["code"] == "QUEUE_FULL"
    assert broker.sent == 3 and clock.sleeps == []  # reject: immediately, no retry
    rejected = [e for e in events if e["type"] == "backpressure.rejected"]
    assert len(rejected) == 1 and rejected[0]["subject"] == "email"
    assert rejected[0]["data"] == {"queue": "email", "depth": 2, "bound": 2,
                                   "job_type": "email.send", "job_id": "j3",
                                   "strategy": "reject", "retry_after": 1.0}
    assert rejected[0]["specversion"] == "1.0" and rejected[0]["id"].startswith("evt_")


def test_retry_after_doubles_per_consecutive_rejection_up_to_the_cap() -> None:
    assert [backoff(1.0, 5.0, n) for n in range(1, 6)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    clock = Clock()
    monitor, _ = monitor_for(REJECT, clock, retry_delay=0.5, max_retry_delay=1.5)
    hints = [monitor.nack_error("email", f"j{i}").retry_after for i in range(4)]
    assert hints == [0.5, 1.0, 1.5, 1.5]


def test_unbounded_nack_stays_a_plain_job_nacked_error() -> None:
    monitor, _ = monitor_for(Bounds(), Clock())
    error = monitor.nack_error("email", "j1")
    assert type(error) is JobNackedError
    drop_head = BackpressureMonitor(ProducerBackpressure(),
                                    lambda _q: Bounds(max_depth=1, overflow="drop-head"))
    assert type(drop_head.nack_error("email", "j1")) is JobNackedError


def test_producer_retries_with_backoff_then_succeeds() -> None:
    clock = Clock()
    monitor, events = monitor_for(REJECT, clock, retries=3, retry_delay=1.0)
    broker = Broker(monitor, "email", 0)

    def drain_on_second_sleep(seconds: float) -> None:
        Clock.sleep(clock, seconds)
        if len(clock.sleeps) == 2:
            broker.bound = 1
    monitor.sleep = drain_on_second_sleep
    monitor.publish("email", "j1", "email.send", broker.send, broker.read)
    assert clock.sleeps == [1.0, 2.0] and broker.sent == 3 and broker.depth == 1
    assert not [e for e in events if e["type"] == "backpressure.rejected"]


def test_producer_retries_give_up_after_the_configured_count() -> None:
    clock = Clock()
    monitor, events = monitor_for(REJECT, clock, retries=2, retry_delay=1.0)
    broker = Broker(monitor, "email", 0)
    with pytest.raises(QueueFullError) as info:
        monitor.publish("email", "j1", "email.send", broker.send, broker.read)
    assert broker.sent == 3 and clock.sleeps == [1.0, 2.0]
    assert info.value.retry_after == 4.0
    assert [e["type"] for e in events] == ["backpressure.rejected"]


def test_block_waits_until_room_then_publishes() -> None:
    clock = Clock()
    bounds = Bounds(max_depth=1, overflow="reject-publish", strategy="block", block_timeout=10)
    monitor, _ = monitor_for(bounds, clock, block_poll=0.5)
    broker = Broker(monitor, "email", 1)
    broker.depth = 1

    def consume_after_two_seconds(seconds: float) -> None:
        Clock.sleep(clock, seconds)
        if clock.now >= 2.0:
            broker.depth = 0
    monitor.sleep = consume_after_two_seconds
    monitor.publish("email", "j1", "email.send", broker.send, broker.read)
    assert broker.depth == 1 and 2.0 <= clock.now < 10


def test_block_raises_after_its_timeout() -> None:
    clock = Clock()
    bounds = Bounds(max_depth=1, overflow="reject-publish", strategy="block", block_timeout=3)
    monitor, events = monitor_for(bounds, clock, block_poll=0.5, max_retry_delay=1.0)
    broker = Broker(monitor, "email", 0)
    with pytest.raises(QueueFullError) as info:
        monitor.publish("email", "j1", "email.send", broker.send, broker.read)
    assert clock.now == pytest.approx(3.0) and info.value.strategy == "block"
    assert max(clock.sleeps) <= 1.0
    assert [e["type"] for e in events] == ["backpressure.rejected"]


def test_circuit_breaker_opens_fails_fast_half_opens_and_closes() -> None:
    clock = Clock()
    monitor, _ = monitor_for(REJECT, clock, circuit_breaker=True, breaker_threshold=2,
                             breaker_cooldown=10.0)
    broker = Broker(monitor, "email", 0)
    for _ in range(2):
        with pytest.raises(QueueFullError):
            monitor.publish("email", "j1", "email.send", broker.send)
    assert broker.sent == 2
    with pytest.raises(QueueFullError) as info:  # open: refused without sending
        monitor.publish("email", "j2", "email.send", broker.send)
    assert info.value.circuit_open and broker.sent == 2
    assert info.value.retry_after == pytest.approx(10.0)
    assert "circuit breaker is open" in str(info.value)
    clock.now = 10.0  # half-open: one trial, which fails -> open again
    with pytest.raises(QueueFullError) as trial:
        monitor.publish("email", "j3", "email.send", broker.send)
    assert not trial.value.circuit_open and broker.sent == 3
    with pytest.raises(QueueFullError, match="circuit"):
        monitor.publish("email", "j4", "email.send", broker.send)
    clock.now = 20.0
    broker.bound = 5
    monitor.publish("email", "j5", "email.send", broker.send)  # trial succeeds: closed
    monitor.publish("email", "j6", "email.send", broker.send)
    assert broker.sent == 5


def test_circuit_breaker_states() -> None:
    clock = Clock()
    breaker = CircuitBreaker(threshold=1, cooldown=5, clock=clock)
    assert breaker.state == "closed" and breaker.allow() == 0.0
    breaker.failure()
    assert breaker.state == "open" and breaker.allow() == 5
    clock.now = 5
    assert breaker.state == "half-open" and breaker.allow() == 0.0
    assert breaker.allow() > 0  # only one trial at a time
    breaker.success()
    assert breaker.state == "closed"


def test_warning_and_cleared_events_on_crossing_the_threshold() -> None:
    clock = Clock()
    bounds = Bounds(max_depth=10, overflow="reject-publish", warn_at=0.8)
    monitor, events = monitor_for(bounds, clock, sample_interval=0)
    depth = 0

    def send() -> None:
        nonlocal depth
        depth += 1
    for _ in range(9):
        monitor.publish("email", "j", "email.send", send, lambda _q: depth)
    assert [e["type"] for e in events] == ["backpressure.warning"]
    assert events[0]["data"] == {"queue": "email", "depth": 8, "bound": 10, "pressure": 0.8}
    depth = 2
    monitor.observe("email", depth)
    assert [e["type"] for e in events] == ["backpressure.warning", "backpressure.cleared"]
    assert monitor.pressures() == [("email", 0.2)]


def test_depth_is_sampled_at_most_once_per_interval() -> None:
    clock = Clock()
    monitor, _ = monitor_for(REJECT, clock, sample_interval=1.0)
    reads: list[str] = []
    for _ in range(5):
        monitor.publish("email", "j", "email.send", lambda: None,
                        lambda q: reads.append(q) or 0)
    clock.now = 1.0
    monitor.publish("email", "j", "email.send", lambda: None, lambda q: reads.append(q) or 0)
    assert reads == ["email", "email"]


def test_unbounded_queue_publishes_straight_through() -> None:
    monitor, events = monitor_for(Bounds(), Clock())
    sent: list[int] = []
    monitor.publish("email", "j", "email.send", lambda: sent.append(1),
                    lambda _q: pytest.fail("no depth reads for unbounded queues"))
    assert sent == [1] and events == []


@dataclass(frozen=True)
class Job:
    job_id: str
    queue: str = "email"
    job_type: str = "email.send"
    delay_ms: int = 0


def batch_monitor(bounds: Bounds, clock: Clock, *observers: Any, **settings: Any
                  ) -> tuple[BackpressureMonitor, list[dict[str, Any]]]:
    """``email`` has ``bounds``; every other queue is unbounded."""
    hook, events = observed(*observers)
    monitor = BackpressureMonitor(ProducerBackpressure(**settings),
                                  lambda q: bounds if q == "email" else Bounds(),
                                  hook=hook, clock=clock, sleep=clock.sleep)
    return monitor, events


BOUND_10 = Bounds(max_depth=10, overflow="reject-publish")


def test_a_batch_that_does_not_fit_is_refused_whole_before_sending() -> None:
    reader = InMemoryMetricReader()
    metrics = OJSMetrics(MeterProvider(metric_readers=[reader]))
    monitor, events = batch_monitor(BOUND_10, Clock(), MetricsObserver(metrics))
    # scheduled jobs and jobs of other queues do not count against email's bound
    jobs = [Job("a"), Job("b", queue="reports"), Job("c"), Job("d", delay_ms=5000), Job("e"),
            Job("f")]
    reads: list[str] = []
    monitor.admit_batch(jobs, lambda q: reads.append(q) or 6).settle(set())
    assert reads == ["email"]  # only the bounded queue's depth is read
    with pytest.raises(QueueFullError) as info:
        monitor.admit_batch(jobs, lambda _q: 7)
    error = info.value
    assert isinstance(error, BatchQueueFullError) and isinstance(error, BatchPublishError)
    assert list(error.rejected) == ["a", "b", "c", "d", "e", "f"]  # nothing was sent
    assert "cannot take the batch's 4 job(s)" in error.rejected["a"]
    assert "the batch was refused" in error.rejected["b"]
    assert error.accepted == () and error.unconfirmed == ()
    assert (error.queue, error.depth, error.bound, error.strategy) == ("email", 7, 10, "reject")
    assert error.retry_after == 1.0 and error.to_dict()["code"] == "QUEUE_FULL"
    assert "nothing was sent" in str(error)
    assert [e["data"] for e in events if e["type"] == "backpressure.rejected"] == [{
        "queue": "email", "depth": 7, "bound": 10, "job_type": "email.send", "count": 4,
        "strategy": "reject", "retry_after": 1.0}]
    points = {m.name: m.data.data_points for rm in reader.get_metrics_data().resource_metrics
              for sm in rm.scope_metrics for m in sm.metrics}
    assert [p.value for p in points["ojs.backpressure.rejected_total"]] == [4]


def test_a_batch_for_unbounded_or_drop_oldest_queues_reads_no_depth() -> None:
    for bounds in (Bounds(), Bounds(max_depth=1, overflow="drop-head",
                                    strategy="drop_oldest")):
        monitor, _ = batch_monitor(bounds, Clock())
        monitor.admit_batch([Job("a"), Job("b")],
                            lambda _q: pytest.fail("no depth read")).settle(set())


def test_a_block_queue_waits_for_room_for_the_whole_batch_then_gives_up() -> None:
    clock = Clock()
    bounds = Bounds(max_depth=3, overflow="reject-publish", strategy="block", block_timeout=5)
    monitor, _ = batch_monitor(bounds, clock, block_poll=0.5, max_retry_delay=1.0)
    depth = 3

    def drain(seconds: float) -> None:
        nonlocal depth
        Clock.sleep(clock, seconds)
        depth = 1 if clock.now >= 2 else depth
    monitor.sleep = drain
    monitor.admit_batch([Job("a"), Job("b")], lambda _q: depth).settle(set())
    assert 2 <= clock.now < 5 and clock.sleeps
    clock.sleeps.clear()
    monitor.sleep = clock.sleep
    start = clock.now
    with pytest.raises(BatchQueueFullError) as info:
        monitor.admit_batch([Job("c"), Job("d"), Job("e")], lambda _q: 1)
    assert clock.now - start == pytest.approx(5.0) and info.value.strategy == "block"
    clock.sleeps.clear()
    with pytest.raises(BatchQueueFullError, match="exceed its depth bound"):  # never fits
        monitor.admit_batch([Job(str(i)) for i in range(4)], lambda _q: 0)
    assert clock.sleeps == []


def test_an_open_circuit_refuses_a_batch_and_a_half_open_one_takes_it_as_its_trial() -> None:
    clock = Clock()
    monitor, _ = batch_monitor(BOUND_10, clock, circuit_breaker=True, breaker_threshold=1,
                               breaker_cooldown=10.0)
    with pytest.raises(BatchQueueFullError):
        monitor.admit_batch([Job(str(i)) for i in range(11)], lambda _q: 0)
    with pytest.raises(BatchQueueFullError) as info:  # open: no depth read, nothing sent
        monitor.admit_batch([Job("a")], lambda _q: pytest.fail("no depth read"))
    assert info.value.circuit_open and info.value.retry_after == pytest.approx(10.0)
    clock.now = 10.0
    trial = monitor.admit_batch([Job("a")], lambda _q: 0)  # half-open: this batch is the trial
    with pytest.raises(BatchQueueFullError, match="circuit breaker"):
        monitor.admit_batch([Job("b")], lambda _q: 0)
    trial.settle({"a"})  # nacked: open again
    with pytest.raises(BatchQueueFullError, match="circuit breaker"):
        monitor.admit_batch([Job("b")], lambda _q: 0)
    clock.now = 20.0
    lost = monitor.admit_batch([Job("b")], lambda _q: 0)
    lost.release()  # e.g. the connection was lost: no verdict, the next batch may try
    monitor.admit_batch([Job("c")], lambda _q: 0).settle(set())  # accepted: closed
    monitor.admit_batch([Job("d")], lambda _q: 0).settle(set())


def test_broker_nacks_of_a_full_queue_become_a_batch_queue_full_error() -> None:
    monitor, events = batch_monitor(BOUND_10, Clock())
    jobs = [Job("a"), Job("b"), Job("c"), Job("d"), Job("x", queue="reports")]
    base = BatchPublishError("3 of 5 jobs were not accepted", rejected={
        "c": "refused by the broker (Basic.Nack), queue 'email'",
        "d": "refused by the broker (Basic.Nack), queue 'email'",
        "x": "returned by the broker (NO_ROUTE)"}, unconfirmed=(), accepted=("a", "b"))
    error = monitor.batch_error(jobs, base, {"c", "d"}, lambda _q: 10)
    assert isinstance(error, BatchQueueFullError) and isinstance(error, QueueFullError)
    assert list(error.rejected) == ["c", "d", "x"] and error.accepted == ("a", "b")
    assert "at its bound (10)" in error.rejected["c"] and "NO_ROUTE" in error.rejected["x"]
    assert (error.queue, error.depth, error.bound) == ("email", 10, 10)
    assert str(base) in str(error)
    assert [e["data"]["count"] for e in events if e["type"] == "backpressure.rejected"] == [2]
    # nacks of a queue without a rejecting bound stay a plain BatchPublishError
    assert monitor.batch_error([Job("x", queue="reports")], base, {"x"}) is base


def test_a_publish_that_ends_without_a_verdict_frees_the_half_open_trial() -> None:
    clock = Clock()
    monitor, _ = monitor_for(REJECT, clock, circuit_breaker=True, breaker_threshold=1,
                             breaker_cooldown=10.0)
    broker = Broker(monitor, "email", 0)
    with pytest.raises(QueueFullError):
        monitor.publish("email", "j1", "email.send", broker.send)
    clock.now = 10.0

    def connection_lost() -> None:
        raise ConnectionError("gone")
    with pytest.raises(ConnectionError):
        monitor.publish("email", "j2", "email.send", connection_lost)
    broker.bound = 1
    monitor.publish("email", "j3", "email.send", broker.send)  # the next trial goes out
    assert broker.depth == 1


def test_subscriber_failure_does_not_stop_publishing(caplog: pytest.LogCaptureFixture) -> None:
    bus = EventBus()
    bus.subscribe(lambda _e: 1 / 0, EventFilter(event_types=["backpressure.*"]))
    monitor = BackpressureMonitor(ProducerBackpressure(), lambda _q: REJECT,
                                  hook=Hook(JobEvents(bus, "ojs://ojs-kombu")))
    with pytest.raises(QueueFullError):
        monitor.publish("email", "j", "email.send",
                        lambda: (_ for _ in ()).throw(monitor.nack_error("email", "j")))
    assert "event subscriber" in caplog.text and bus.failures == 1


def test_metrics_count_rejections_and_export_pressure() -> None:
    reader = InMemoryMetricReader()
    metrics = OJSMetrics(MeterProvider(metric_readers=[reader]))
    monitor = BackpressureMonitor(ProducerBackpressure(), lambda _q: REJECT,
                                  hook=Hook(MetricsObserver(metrics)), metrics=metrics)
    monitor.nack_error("email", "j1", lambda _q: 2)
    monitor.nack_error("email", "j2", lambda _q: 2)
    data = reader.get_metrics_data()
    points = {m.name: m.data.data_points for rm in data.resource_metrics
              for sm in rm.scope_metrics for m in sm.metrics}
    rejected = points["ojs.backpressure.rejected_total"]
    assert [(p.value, dict(p.attributes)) for p in rejected] == [(2, {"queue": "email"})]
    pressure = points["ojs.backpressure.pressure"]
    assert [(p.value, dict(p.attributes)) for p in pressure] == [(1.0, {"queue": "email"})]


def test_binding_bounds_follow_celery_queue_definitions() -> None:
    binding = Binding.from_settings(settings())
    assert not binding.bounds("email").bounded
    binding.add_queue_arguments("email", {"x-max-length": 3})
    bounds = binding.bounds("email")
    assert bounds.rejects and bounds.max_depth == 3


# -- Celery wiring ----------------------------------------------------------------------------


def celery_app(**conf: Any) -> Any:
    from celery import Celery

    import ojs_kombu

    app = Celery("bp", broker="ojs://guest:guest@127.0.0.1:5672//", set_as_current=False)
    ojs_kombu.install(app)
    app.conf.update(conf)
    return app


def test_worker_start_warns_once_about_the_unbounded_queues_it_consumes(
        caplog: pytest.LogCaptureFixture) -> None:
    from types import SimpleNamespace

    from kombu import Queue

    import ojs_kombu
    from ojs_kombu.celery.preflight import OJSPreflight

    app = celery_app(task_queues=[Queue("email"), Queue("reports"), Queue("audit")],
                     ojs_queues={"email": {"max_depth": 100}})
    ojs_kombu.check_app(app)
    assert "no bound" not in caplog.text  # checking an app is not starting a worker
    app.amqp.queues.select(["email", "reports"])  # celery worker -Q email,reports
    OJSPreflight(SimpleNamespace(app=app))
    warnings = [r.getMessage() for r in caplog.records if "no bound" in r.getMessage()]
    assert len(warnings) == 1 and "'reports' have no bound" in warnings[0]
    assert "'audit'" not in warnings[0] and "'default'" not in warnings[0]


def test_worker_start_refuses_a_quorum_celery_queue_with_priorities() -> None:
    from kombu import Queue

    import ojs_kombu

    app = celery_app(task_queues=[Queue("email", queue_arguments={"x-queue-type": "quorum"})],
                     ojs_queues={"email": {"priority": True}})
    with pytest.raises(OJSConfigurationError, match=r"'email'.*x-max-priority"):
        ojs_kombu.check_app(app)


def test_celery_does_not_see_quorum_queues_configured_through_ojs_queues() -> None:
    from celery.utils.quorum_queues import detect_quorum_queues

    app = celery_app(ojs_queue_defaults={"type": "quorum"})
    queue = app.amqp.queues["email"]
    assert "x-queue-type" not in queue.queue_arguments  # Celery's native delays stay off
    assert not detect_quorum_queues(app, "pyamqp")[0]
    assert app.amqp.binding.declare_arguments("email")["x-queue-type"] == "quorum"


# -- drop_oldest: the dropped-job tap --------------------------------------------------------


class RecordingChannel:
    """Records what a topology declaration does (no broker)."""

    def __init__(self) -> None:
        self.queues: dict[str, dict[str, Any]] = {}
        self.bindings: list[tuple[str, str, str]] = []

    def exchange_declare(self, exchange: str, type: str, *args: Any, **kwargs: Any) -> None:
        pass

    def exchange_bind(self, *args: Any, **kwargs: Any) -> None:
        pass

    def queue_declare(self, queue: str = "", *args: Any, **kwargs: Any) -> None:
        self.queues[queue] = kwargs["arguments"]

    def queue_bind(self, queue: str, exchange: str = "", *args: Any,
                   routing_key: str = "", **kwargs: Any) -> None:
        self.bindings.append((queue, exchange, routing_key))

    def queue_unbind(self, queue: str, exchange: str = "", *args: Any,
                     routing_key: str = "", **kwargs: Any) -> None:
        self.bindings = [b for b in self.bindings if b != (queue, exchange, routing_key)]


@pytest.mark.parametrize("config", [{"max_depth": 2}, {"max_size_bytes": 1024, "strategy": "block"},
                                    {"type": "quorum", "max_depth": 2,
                                     "dead_letter_strategy": "at-least-once"}])
def test_a_rejecting_queue_takes_its_waited_jobs_back_through_its_ready_queue(
        config: dict[str, Any]) -> None:
    """RabbitMQ drops a dead-lettered job a full ``reject-publish`` queue refuses: retries
    and scheduled jobs of such a queue come back through ``ojs.queue.ready.{q}``, an
    unbounded quorum queue that dead-letters at least once into the job queue."""
    from ojs_kombu.amqp.broker.topology import bind_scheduled_delivery, declare_delayed_exchange
    from ojs_kombu.spec.delays import delivery_binding_key

    binding = Binding.from_settings(settings(queues={"email": config}))
    names, job_args = binding.names, binding.declare_arguments("email")
    channel = RecordingChannel()
    declare_queue_topology(channel, names, "email", job_args)
    assert channel.queues["ojs.queue.ready.email"] == {
        "x-queue-type": "quorum", "x-message-ttl": 0,
        "x-dead-letter-exchange": "ojs.exchange.direct", "x-dead-letter-routing-key": "email",
        "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}
    assert ("ojs.queue.ready.email", "ojs.exchange.direct",
            "ojs.queue.ready.email") in channel.bindings
    retry = retry_queue_arguments(names, "email", 1000, job_args)
    assert retry["x-dead-letter-exchange"] == "ojs.exchange.direct"
    assert retry["x-dead-letter-routing-key"] == "ojs.queue.ready.email"
    key = delivery_binding_key("email")
    channel.bindings.append(("ojs.queue.email", "ojs.exchange.schedule.ready", key))  # older
    bind_scheduled_delivery(channel, names, "email", job_args)
    ladder_exits = [b for b in channel.bindings if b[1] == "ojs.exchange.schedule.ready"]
    assert ladder_exits == [("ojs.queue.ready.email", "ojs.exchange.schedule.ready", key)]
    declare_delayed_exchange(channel, names, "email", job_args)
    assert ("ojs.queue.ready.email", "ojs.exchange.delayed", "email") in channel.bindings


@pytest.mark.parametrize("config", [{}, {"max_depth": 2, "strategy": "drop_oldest"},
                                    {"type": "quorum", "dead_letter_strategy": "at-least-once"}])
def test_other_queues_take_their_waited_jobs_straight_back(config: dict[str, Any]) -> None:
    """Unbounded queues refuse nothing; a ``drop_oldest`` queue dead-letters its oldest job
    into the DLQ (nothing is lost either way)."""
    from ojs_kombu.amqp.broker.topology import bind_scheduled_delivery

    binding = Binding.from_settings(settings(queues={"email": config}))
    names, job_args = binding.names, binding.declare_arguments("email")
    channel = RecordingChannel()
    declare_queue_topology(channel, names, "email", job_args)
    bind_scheduled_delivery(channel, names, "email", job_args)
    assert "ojs.queue.ready.email" not in channel.queues
    assert retry_queue_arguments(names, "email", 1000, job_args)[
        "x-dead-letter-routing-key"] == "email"
    assert [b[0] for b in channel.bindings if b[1] == "ojs.exchange.schedule.ready"] == [
        "ojs.queue.email"]


def test_only_drop_oldest_queues_get_a_bounded_dropped_job_tap_on_the_dlx() -> None:
    binding = Binding.from_settings(settings(prefix="t1", queues={
        "news": {"max_depth": 2, "strategy": "drop_oldest"}, "email": {"max_depth": 2}}))
    assert binding.bounds("news").drops and not binding.bounds("email").drops
    assert not binding.bounds("other").drops
    for queue, tapped in (("news", True), ("email", False), ("other", False)):
        channel = RecordingChannel()
        declare_queue_topology(channel, binding.names, queue, binding.declare_arguments(queue))
        tap = f"t1.ojs.queue.dropped.{queue}"
        assert (tap in channel.queues) is tapped
        assert ((tap, "t1.ojs.exchange.dlx", queue) in channel.bindings) is tapped
    channel = RecordingChannel()
    declare_queue_topology(channel, binding.names, "news", binding.declare_arguments("news"))
    arguments = channel.queues["t1.ojs.queue.dropped.news"]
    assert arguments["x-max-length"] > 0 and arguments["x-message-ttl"] > 0
    assert "x-dead-letter-exchange" not in arguments  # a dropped tap message goes nowhere
    # ``ojs-kombu topology show/declare`` lists it as declared
    from ojs_kombu.cli.topology import expected_topology

    shown = expected_topology(binding, "news")
    assert {"name": "t1.ojs.queue.dropped.news", "role": "dropped jobs",
            "arguments": arguments} in shown["queues"]
    assert "t1.ojs.queue.dropped.email" not in str(expected_topology(binding, "email"))
    assert drops_head({"x-max-length-bytes": 10, "x-overflow": "drop-head"})
    assert not drops_head({"x-overflow": "drop-head"})


def death(reason: str, queue: str) -> dict[str, Any]:
    return {"reason": reason, "queue": queue, "count": 1, "exchange": "",
            "routing-keys": ["news"], "time": datetime(2026, 3, 1, 12, 0, 5)}


def test_the_latest_death_tells_whether_the_bound_dropped_the_job() -> None:
    queue = "ojs.queue.news"
    assert maxlen_death({"x-death": [death("maxlen", queue)]}, queue) is not None
    # a scheduled (or retried) job came through TTL queues: its first death is "expired"
    scheduled = {"x-first-death-reason": "expired",
                 "x-death": [death("maxlen", queue),
                             death("expired", "ojs.queue.schedule.3")]}
    assert maxlen_death(scheduled, queue) is not None
    for headers in ({}, {"x-death": []}, {"x-death": [death("rejected", queue)]},
                    {"x-death": [death("maxlen", "ojs.queue.other")]},
                    {"x-death": [death("expired", "ojs.queue.retry.news.500"),
                                 death("maxlen", queue)]}):
        assert maxlen_death(headers, queue) is None


def test_a_dropped_job_becomes_a_dropped_event_and_a_count() -> None:
    import amqp

    from ojs_kombu.celery.dropped import report_dropped

    reader = InMemoryMetricReader()
    bus, events = EventBus(), []
    bus.subscribe(events.append, EventFilter(event_types=["backpressure.*"]))
    binding = replace(
        Binding.from_settings(settings(queues={"news": {"max_depth": 2,
                                                        "strategy": "drop_oldest"}})),
        events=JobEvents(bus, "ojs://test"),
        metrics=OJSMetrics(MeterProvider(metric_readers=[reader])))

    def message(reason: str, job_id: str) -> amqp.Message:
        return amqp.Message(b"{}", message_id=job_id, type="news.push",
                            application_headers={"x-death": [death(reason, "ojs.queue.news")]})
    assert report_dropped(binding, "news", message("maxlen", "j1"))
    assert not report_dropped(binding, "news", message("rejected", "j2"))
    assert [(e["type"], e["subject"], e["data"]) for e in events] == [
        ("backpressure.dropped", "news", {"queue": "news", "job_id": "j1",
                                          "job_type": "news.push",
                                          "dropped_at": "2026-03-01T12:00:05.000Z"})]
    points = {m.name: m.data.data_points for rm in reader.get_metrics_data().resource_metrics
              for sm in rm.scope_metrics for m in sm.metrics}
    assert [(p.value, dict(p.attributes)) for p in points["ojs.backpressure.dropped_total"]] \
        == [(1, {"queue": "news"})]


@pytest.mark.parametrize("config", [{}, {"type": "quorum"}, {"max_depth": 3,
                                                            "strategy": "drop_oldest"}])
def test_topology_show_lists_the_arguments_ojs_kombu_declares(config: dict[str, Any]) -> None:
    """``ojs-kombu topology show/declare`` lists every queue with the arguments
    ``declare_queue_topology`` really gives it (a quorum DLQ is quorum too)."""
    from ojs_kombu.cli.topology import expected_topology

    binding = Binding.from_settings(settings(prefix="t2", queues={"jobs": config}))
    channel = RecordingChannel()
    declare_queue_topology(channel, binding.names, "jobs", binding.declare_arguments("jobs"))
    shown = {q["name"]: q["arguments"] for q in expected_topology(binding, "jobs")["queues"]}
    assert shown == channel.queues
