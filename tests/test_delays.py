"""Bounded delay queues: the retry ladder and the scheduling ladder."""

from __future__ import annotations

import math
import random

import pytest

from ojs_kombu.spec.delays import (
    MAX_SCHEDULE_DELAY_MS,
    delivery_binding_key,
    level_binding_keys,
    retry_delay_ms,
    retry_delay_rung,
    schedule_levels,
    schedule_routing_key,
)
from ojs_kombu.spec.envelope import RetryPolicy
from ojs_kombu.spec.retry import Backoff


def test_rungs_are_two_per_octave_and_never_longer_than_the_delay() -> None:
    assert [retry_delay_rung(x) for x in (1, 2, 3, 4, 5, 6, 8, 1000, 1400, 2000)] == [
        1, 2, 3, 4, 4, 6, 8, 768, 1024, 1536]


def _delays_across_the_ladder() -> list[float]:
    """Seconds from 1 ms to past the longest delay: every rung, its neighbours, random."""
    rng = random.Random(11)
    rungs = [r for e in range(33) for r in (2**e, 3 * 2**e // 2) if r <= MAX_SCHEDULE_DELAY_MS]
    exact = [ms / 1000 + nudge for ms in rungs for nudge in (-0.0005, 0.0, 0.0005)]
    return [0.0, 0.001, 0.0015, 1.5, 3.0, 13.0, 40.0, 180.0, 600.0, 10**7,
            *(d for d in exact if d > 0), *(rng.uniform(0.001, 4.2e6) for _ in range(5000))]


def test_a_retry_waits_its_whole_delay_never_less() -> None:
    """Retry queue rung plus scheduling-ladder remainder is the delay, rounded up to the
    millisecond: the next attempt never starts before it (the worker holds back a job
    that arrives before its ``scheduled_at``, sending it down the ladder for the rest)."""
    for delay_s in _delays_across_the_ladder():
        whole_ms = min(math.ceil(max(delay_s, 0.001) * 1000), MAX_SCHEDULE_DELAY_MS)
        rung = retry_delay_ms(delay_s)
        assert 1 <= rung <= whole_ms, delay_s
        remainder = whole_ms - rung
        if remainder:
            assert sum(2**k for k in schedule_levels(remainder)) == remainder
        # the shorter rung leaves at most a third of the delay to the ladder
        assert remainder <= whole_ms / 3 + 1, delay_s


def test_a_rung_delay_needs_no_ladder() -> None:
    assert [retry_delay_ms(s) for s in (0.001, 0.512, 0.768, 12.288)] == [1, 512, 768, 12288]


def test_the_longest_rung_is_within_the_ladder() -> None:
    assert retry_delay_ms(10**9) == 3 * 2**30 <= MAX_SCHEDULE_DELAY_MS


def test_jittered_default_policy_uses_at_most_20_queues_for_1000_failing_jobs() -> None:
    backoff, rng = Backoff.of(RetryPolicy(max_attempts=10)), random.Random(3)
    rungs = {retry_delay_rung(backoff.delay(attempt, rng.random) * 1000)
             for _ in range(1000) for attempt in range(1, 10)}
    assert len(rungs) <= 20


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
