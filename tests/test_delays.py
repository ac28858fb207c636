"""Bounded delay queues: the retry ladder and the scheduling ladder."""

from __future__ import annotations

import random

import pytest

from ojs_kombu.spec.delays import (
    MAX_SCHEDULE_DELAY_MS,
    delivery_binding_key,
    level_binding_keys,
    retry_delay_rung,
    schedule_levels,
    schedule_routing_key,
)
from ojs_kombu.spec.envelope import RetryPolicy
from ojs_kombu.spec.retry import Backoff


def test_rungs_are_two_per_octave() -> None:
    assert [retry_delay_rung(x) for x in (1, 2, 3, 4, 5, 6, 8, 1000, 1400, 2000)] == [
        1, 2, 3, 4, 4, 6, 8, 1024, 1536, 2048]


def test_rounding_error_is_at_most_20_percent() -> None:
    rng = random.Random(7)
    for _ in range(20000):
        delay = rng.uniform(1, 10**9)
        assert abs(retry_delay_rung(delay) - delay) / delay <= 0.2


def test_jittered_default_policy_uses_at_most_19_queues_for_1000_failing_jobs() -> None:
    backoff, rng = Backoff.of(RetryPolicy(max_attempts=10)), random.Random(3)
    rungs = {retry_delay_rung(backoff.delay(attempt, rng.random) * 1000)
             for _ in range(1000) for attempt in range(1, 10)}
    assert len(rungs) <= 19


@pytest.mark.parametrize("delay", [1, 2, 3, 1000, 1001, 30_000, 2**31, MAX_SCHEDULE_DELAY_MS])
def test_schedule_levels_add_up_to_the_delay(delay: int) -> None:
    levels = schedule_levels(delay)
    assert sum(2**k for k in levels) == delay
    assert levels == sorted(levels, reverse=True)


@pytest.mark.parametrize("delay", [0, -5, MAX_SCHEDULE_DELAY_MS + 1])
def test_out_of_range_delays_are_refused(delay: int) -> None:
    with pytest.raises(ValueError, match="49.7 days"):
        schedule_routing_key(delay, "email")


def _topic_match(pattern: str, key: str) -> bool:
    """AMQP topic matching: ``*`` one word, ``#`` zero or more words."""
    def go(p: list[str], k: list[str]) -> bool:
        if not p:
            return not k
        if p[0] == "#":
            return any(go(p[1:], k[i:]) for i in range(len(k) + 1))
        return bool(k) and (p[0] in ("*", k[0])) and go(p[1:], k[1:])
    return go(pattern.split("."), key.split("."))


@pytest.mark.parametrize("delay", [1, 5, 1000, 123_456_789])
def test_a_key_waits_exactly_at_the_levels_of_its_bits(delay: int) -> None:
    key = schedule_routing_key(delay, "reports.eu")
    waits = [level for level in range(32) if _topic_match(level_binding_keys(level)[0], key)]
    skips = [level for level in range(32) if _topic_match(level_binding_keys(level)[1], key)]
    assert sorted(waits, reverse=True) == schedule_levels(delay)
    assert set(waits) | set(skips) == set(range(32)) and not set(waits) & set(skips)
    assert _topic_match(delivery_binding_key("reports.eu"), key)
    assert not _topic_match(delivery_binding_key("reports"), key)
