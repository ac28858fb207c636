"""Retry policies, backoff and error matching against the spec's numbers."""

from __future__ import annotations

import pytest

from ojs_kombu.spec.envelope import RetryPolicy
from ojs_kombu.spec.errors import RetryPolicyError
from ojs_kombu.spec.retry import Backoff, matches, merge, policy_from


def test_default_delays_follow_the_formula_without_jitter() -> None:
    backoff = Backoff.of(RetryPolicy(jitter=False))
    # min(1 s * 2^(n-1), 5 min)
    assert [backoff.delay(n) for n in range(1, 11)] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]


def test_jitter_multiplies_by_half_to_one_and_a_half_then_caps() -> None:
    backoff = Backoff.of(RetryPolicy(max_interval="PT10S"))
    assert backoff.delay(2, draw=lambda: 0.0) == 1.0  # 2 s * 0.5
    assert backoff.delay(2, draw=lambda: 0.999999) == pytest.approx(2.999998)
    assert backoff.delay(4, draw=lambda: 0.999999) == 10.0  # 8 s * 1.5 = 12, capped again


def test_coefficient_one_is_a_constant_delay() -> None:
    backoff = Backoff.of(RetryPolicy(initial_interval="PT0.5S", backoff_coefficient=1.0,
                                     jitter=False))
    assert {backoff.delay(n) for n in range(1, 6)} == {0.5}


@pytest.mark.parametrize("max_attempts, retried_after", [
    (0, []), (1, []), (3, [1, 2]), (5, [1, 2, 3, 4])])
def test_max_attempts_counts_every_attempt(max_attempts: int, retried_after: list[int]) -> None:
    backoff = Backoff.of(RetryPolicy(max_attempts=max_attempts))
    assert [a for a in range(1, 7) if backoff.allows_retry_after(a)] == retried_after


def test_partial_policy_merges_with_defaults() -> None:
    merged = merge(RetryPolicy(), policy_from({"max_attempts": 5}, source="t"))
    assert merged.max_attempts == 5 and merged.initial_interval == "PT1S"
    assert merged.backoff_coefficient == 2.0 and merged.max_interval == "PT5M"
    task = policy_from({"initial_interval": "PT10S", "max_attempts": 2}, source="t")
    job = policy_from({"max_attempts": 7}, source="t")
    assert merge(task, job).model_dump(include={"max_attempts", "initial_interval"}) == {
        "max_attempts": 7, "initial_interval": "PT10S"}


@pytest.mark.parametrize("policy, problem", [
    ({"backoff_coefficient": 0.5}, "backoff_coefficient"),
    ({"initial_interval": "1s"}, "initial_interval"),
    ({"on_exhaustion": "retry_forever"}, "on_exhaustion"),
    ({"max_attempts": -1}, "max_attempts"),
    ({"unknown": 1}, "unknown"),
])
def test_invalid_policies_are_named(policy: dict[str, object], problem: str) -> None:
    with pytest.raises(RetryPolicyError, match=problem) as info:
        policy_from(policy, source="task 'x'")
    assert "task 'x'" in str(info.value)


@pytest.mark.parametrize("policy, problem", [
    ({"initial_interval": "PT1M", "max_interval": "PT1S"}, "max_interval"),
    ({"initial_interval": "PT0S"}, "greater than zero"),
])
def test_intervals_the_spec_forbids_are_refused(policy: dict[str, str], problem: str) -> None:
    with pytest.raises(RetryPolicyError, match=problem):
        policy_from(policy, source="t")


def test_non_retryable_errors_match_exactly_or_by_prefix() -> None:
    patterns = ["ValidationError", "auth.*"]
    assert matches("ValidationError", patterns)
    assert not matches("ValidationErrorX", patterns)
    assert matches("auth.expired", patterns) and matches("auth.token.bad", patterns)
    assert not matches("authz.denied", patterns) and not matches("auth", patterns)
