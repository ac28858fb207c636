"""The one backoff formula every growing wait of ojs_kombu uses."""

from __future__ import annotations

import pytest

from ojs_kombu.spec.backoff import backoff


def test_grows_by_the_coefficient_up_to_the_cap() -> None:
    assert [backoff(2.0, 50.0, n, coefficient=3.0) for n in range(1, 6)] == [2, 6, 18, 50, 50]


def test_attempts_below_one_wait_the_initial_delay() -> None:
    assert backoff(1.0, 5.0, 0) == backoff(1.0, 5.0, -3) == 1.0


def test_a_huge_attempt_waits_the_cap_instead_of_overflowing() -> None:
    assert backoff(1.0, 60.0, 10**9) == 60.0
    assert backoff(1.0, 60.0, 10**6, coefficient=1.5) == 60.0


def test_jitter_scales_within_its_spread_and_is_capped_again() -> None:
    assert backoff(4.0, 100.0, 1, jitter=0.25, draw=lambda: 0.0) == 3.0
    assert backoff(4.0, 100.0, 1, jitter=0.25, draw=lambda: 0.999999) == pytest.approx(5.0)
    assert backoff(8.0, 10.0, 1, jitter=0.5, draw=lambda: 0.999999) == 10.0


def test_without_jitter_nothing_is_drawn() -> None:
    def draw() -> float:
        raise AssertionError("drew a random number")

    assert backoff(0.5, 30.0, 4, draw=draw) == 4.0
