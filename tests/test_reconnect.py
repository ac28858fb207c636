"""The reconnection schedule (AMQP-025) and how kombu connections follow it."""

from __future__ import annotations

import socket

import pytest
from kombu.exceptions import OperationalError

from ojs_kombu.amqp.broker.connection import (
    BrokerConnection,
    PooledBrokerConnection,
    connect_on_demand,
)
from ojs_kombu.amqp.broker.reconnect import (
    DEFAULT_POLICY,
    ConnectBackoff,
    ReconnectPolicy,
)
from ojs_kombu.spec.errors import BrokerBackingOff


def fixed(value: float) -> ReconnectPolicy:
    """The default schedule with the random draw pinned to ``value``."""
    return ReconnectPolicy(random=lambda: value)


def test_schedule_doubles_from_one_second_and_caps_at_sixty() -> None:
    policy = fixed(0.5)  # factor exactly 1
    assert [policy.delay(n) for n in range(1, 10)] == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert policy.delay(10_000) == 60  # no overflow for a worker retrying for days


def test_jitter_spans_plus_minus_25_percent_and_never_exceeds_the_cap() -> None:
    low, high = fixed(0.0), fixed(0.999999)
    assert low.delay(1) == pytest.approx(0.75)
    assert high.delay(1) == pytest.approx(1.25, rel=1e-5)
    assert low.delay(4) == pytest.approx(6.0)
    assert high.delay(4) == pytest.approx(10.0, rel=1e-5)
    assert low.delay(7) == pytest.approx(45.0)
    assert high.delay(7) == 60.0  # 75 s would exceed the cap


def test_real_jitter_varies_and_stays_in_range() -> None:
    delays = [DEFAULT_POLICY.delay(3) for _ in range(200)]
    assert all(3.0 <= d <= 5.0 for d in delays)
    assert len(set(delays)) > 1  # not every worker waits the same


def test_schedule_iterator_follows_attempts() -> None:
    schedule = fixed(0.5).delays()
    assert [next(schedule) for _ in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]


@pytest.mark.parametrize("kwargs", [{"initial": 0}, {"initial": 5, "max_delay": 1},
                                    {"jitter": 1.0}, {"jitter": -0.1}])
def test_invalid_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ReconnectPolicy(**kwargs)


def test_attempts_count_from_one() -> None:
    with pytest.raises(ValueError, match="count from 1"):
        DEFAULT_POLICY.delay(0)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_connection_retries_wait_on_the_schedule_not_kombus_intervals() -> None:
    """kombu would wait 2, 4, 6, 8 s (interval_start/step); the binding says 1, 2, 4, 8."""
    port = _closed_port()
    connection = BrokerConnection(f"ojs://guest:guest@127.0.0.1:{port}//", connect_timeout=1)
    # the default schedule scaled down 1000x so the test takes milliseconds
    connection.reconnect_policy = ReconnectPolicy(initial=0.001, max_delay=0.004,
                                                  random=lambda: 0.5)
    waits: list[float] = []
    with pytest.raises(OperationalError):
        connection.ensure_connection(errback=lambda exc, interval: waits.append(interval),
                                     max_retries=5, interval_start=2, interval_step=2)
    assert waits == [0.001, 0.002, 0.004, 0.004, 0.004]


def test_failover_tries_the_next_url_at_once_and_waits_per_cycle() -> None:
    first, second = _closed_port(), _closed_port()
    connection = BrokerConnection(
        f"ojs://guest:guest@127.0.0.1:{first}//;ojs://guest:guest@127.0.0.1:{second}//",
        connect_timeout=1)
    connection.reconnect_policy = ReconnectPolicy(initial=0.001, max_delay=0.004,
                                                  random=lambda: 0.5)
    tried: list[tuple[int, float]] = []
    with pytest.raises(OperationalError):
        connection.ensure_connection(
            errback=lambda exc, interval: tried.append((connection.port, interval)),
            max_retries=5)
    assert tried == [(first, 0), (second, 0.001), (first, 0), (second, 0.002), (first, 0)]


def test_no_wait_runs_past_the_timeout() -> None:
    """``default_channel`` (a publish without retries) reconnects with
    ``timeout=connect_timeout``: kombu would sleep a whole wait past it and try again."""
    connection = BrokerConnection(f"ojs://guest:guest@127.0.0.1:{_closed_port()}//",
                                  connect_timeout=1)
    connection.reconnect_policy = ReconnectPolicy(initial=0.2, random=lambda: 0.5)
    waits: list[float] = []
    with pytest.raises(OperationalError):
        connection.ensure_connection(errback=lambda exc, interval: waits.append(interval),
                                     timeout=0.5)
    assert waits[0] == 0.2  # the schedule: 0.2, then 0.4, which would end at 0.6
    assert len(waits) >= 2 and sum(waits) <= 0.5, waits


def test_connection_errors_name_the_broker_without_its_password() -> None:
    """What a producer's failed ``apply_async`` raises (Celery publishes inside
    ``_reraise_as_library_errors``), and a failed connect."""
    port = _closed_port()
    connection = BrokerConnection(f"ojs://guest:secret@127.0.0.1:{port}//", connect_timeout=1)
    with pytest.raises(OperationalError) as lost, connection._reraise_as_library_errors():
        raise ConnectionResetError(104, "Connection reset by peer")
    assert str(lost.value) == (f"[Errno 104] Connection reset by peer "
                               f"(broker ojs://guest:**@127.0.0.1:{port}//)")
    assert isinstance(lost.value.__cause__, ConnectionResetError)
    with pytest.raises(OperationalError, match=rf"refused \(broker ojs://guest:\*\*@"
                                               rf"127\.0\.0\.1:{port}//\)") as refused:
        connection.ensure_connection(max_retries=0)
    assert "secret" not in str(refused.value)


@pytest.mark.parametrize("lost", [True, False])
def test_a_connection_the_pool_replaced_after_a_failed_publish(
        lost: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """kombu's ``Producer.__exit__`` closes its pooled connection on any error; opened
    again, it is a reconnection when the broker had dropped it, not when it was alive."""
    from kombu import Producer

    from ojs_kombu.amqp.binding import Binding, register_binding
    from ojs_kombu.events.bus import EventFilter
    from ojs_kombu.spec.settings import BINDING_OPTION, OJSSettings

    binding = Binding.from_settings(OJSSettings())
    seen: list[dict[str, object]] = []
    binding.events.bus.subscribe(seen.append, EventFilter(event_types=["connection.*"]))
    pool = BrokerConnection("memory://", transport_options={
        BINDING_OPTION: register_binding(binding)}).Pool(limit=1)
    member = pool.acquire()
    member.ensure_connection()
    if lost:
        monkeypatch.setattr(member.transport, "verify_connection", lambda connection: False)
    try:
        with pytest.raises(OperationalError), Producer(member):
            raise OperationalError("the publish failed")
        member.ensure_connection()  # the producer's next publish
    finally:
        member.release()
    reconnected = [e for e in seen if e["type"] == "connection.reconnected"]
    assert len(reconnected) == (1 if lost else 0), seen
    if lost:
        assert reconnected[0]["data"]["role"] == "client"  # type: ignore[index]


def test_pooled_connections_reconnect_on_the_schedule_too() -> None:
    """Celery's producers publish through a pool: its members must be ours."""
    connection = BrokerConnection("ojs://guest:guest@127.0.0.1:1//")
    policy = ReconnectPolicy(initial=0.5, random=lambda: 0.5)
    connection.reconnect_policy = policy
    pool = connection.Pool(limit=2)
    member = pool.acquire()
    try:
        assert isinstance(member, PooledBrokerConnection)
        assert member.reconnect_policy is policy
    finally:
        member.release()


def test_connection_events_reach_subscribers_that_name_them() -> None:
    """``connection.reconnected`` and ``consumer.cancelled`` are out of the OJS catalog:
    a subscriber gets them when its filter names them, never through ``*`` alone."""
    from ojs_kombu.events.bus import EventBus, EventFilter
    from ojs_kombu.events.emitter import JobEvents
    from ojs_kombu.events.hook import Hook

    bus, seen, everything = EventBus(), [], []
    subscription = bus.subscribe(seen.append, EventFilter(event_types=["connection.*"]))
    bus.subscribe(everything.append, EventFilter(event_types=["*"]))
    hook = Hook(JobEvents(bus, "ojs://app/workers/w1"))
    hook.connection_reconnected("worker", {"worker_id": "w1@host", "attempts": 2,
                                           "queues": None})
    subscription.cancel()
    hook.connection_reconnected("client", {"broker": "ojs://h//"})
    assert len(seen) == 1 and everything == []
    event = seen[0]
    assert event["type"] == "connection.reconnected"
    assert event["subject"] == "w1@host" and event["source"] == "ojs://app/workers/w1"
    assert event["data"] == {"role": "worker", "worker_id": "w1@host", "attempts": 2}
    assert str(event["id"]).startswith("evt_") and str(event["time"]).endswith("Z")


def test_an_on_demand_connection_backs_off_between_failed_attempts() -> None:
    """Gauges, the event sink and control connect when used: during an outage their
    attempts follow 1, 2, 4 ... s, not one per use."""
    now = [100.0]
    backoff = ConnectBackoff(fixed(0.5), clock=lambda: now[0])
    assert backoff.wait() == 0
    assert [backoff.failed() for _ in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert backoff.wait() == 60
    now[0] += 59.5
    assert backoff.wait() == pytest.approx(0.5)
    backoff.succeeded()
    assert backoff.wait() == 0 and backoff.failed() == 1


def test_on_demand_connections_to_a_dead_broker_share_one_schedule() -> None:
    url = f"ojs://guest:guest@127.0.0.1:{_closed_port()}//"
    tries = 0

    class Counting(BrokerConnection):
        def _connection_factory(self) -> object:
            nonlocal tries
            tries += 1
            return super()._connection_factory()

    with pytest.raises(OperationalError):
        connect_on_demand(Counting(url, connect_timeout=1), "queue-depth gauges")
    for purpose in ("queue-depth gauges", "the AMQP event sink", "control"):
        with pytest.raises(BrokerBackingOff) as refused:
            connect_on_demand(Counting(url, connect_timeout=1), purpose)
        assert 0.5 < refused.value.retry_in <= 1.25 and purpose in str(refused.value)
    assert tries == 1
