"""OJS retry policies: merging, backoff and error classification (pure).

The spec's numbers: ``max_attempts`` counts every attempt including the
first (0 or 1: never retried); ``delay(n) = min(initial * coefficient**(n-1),
max)``, then jitter (multiply by a uniform draw in ``[0.5, 1.5)``), then the cap
again; ``non_retryable_errors`` match exactly, or by prefix for ``"auth.*"``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from .backoff import backoff
from .envelope import RetryPolicy, parse_duration
from .errors import RetryPolicyError

DEFAULT_POLICY = RetryPolicy()
#: The spec's jitter: the delay times a uniform draw in ``[0.5, 1.5)``.
JITTER = 0.5


def policy_from(value: RetryPolicy | Mapping[str, Any] | None, *, source: str) -> RetryPolicy:
    """Validate a policy given as a model or a mapping; ``source`` names it in errors."""
    if value is None or isinstance(value, RetryPolicy):
        return value or RetryPolicy()
    try:
        return RetryPolicy.model_validate(dict(value))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
            for e in exc.errors(include_url=False)
        )
        raise RetryPolicyError(f"invalid retry policy in {source}: {problems}") from None


def merge(base: RetryPolicy, override: RetryPolicy | None) -> RetryPolicy:
    """``base`` with every field ``override`` sets explicitly (a partial policy merges)."""
    if override is None:
        return base
    given = override.model_dump(include=override.model_fields_set)
    return base.model_copy(update=given)


@dataclass(frozen=True, slots=True)
class Backoff:
    """A policy's numbers in seconds, parsed once."""

    max_attempts: int
    initial: float
    coefficient: float
    maximum: float
    jitter: bool
    non_retryable: tuple[str, ...]
    on_exhaustion: str

    @classmethod
    def of(cls, policy: RetryPolicy) -> Backoff:
        initial = parse_duration(policy.initial_interval).total_seconds()
        maximum = parse_duration(policy.max_interval).total_seconds()
        if initial <= 0:
            raise RetryPolicyError("retry.initial_interval must be greater than zero")
        if maximum < initial:
            raise RetryPolicyError(
                f"retry.max_interval ({policy.max_interval}) must be >= initial_interval "
                f"({policy.initial_interval})"
            )
        return cls(policy.max_attempts, initial, policy.backoff_coefficient, maximum,
                   policy.jitter, tuple(policy.non_retryable_errors), policy.on_exhaustion)

    def delay(self, attempt: int, draw: Callable[[], float] = random.random) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based) before the next one."""
        return backoff(self.initial, self.maximum, attempt, coefficient=self.coefficient,
                       jitter=JITTER if self.jitter else 0.0, draw=draw)

    def allows_retry_after(self, attempt: int) -> bool:
        """Whether failed attempt ``attempt`` may be followed by another."""
        return attempt < self.max_attempts


def matches(error_type: str, patterns: Iterable[str]) -> bool:
    """``non_retryable_errors`` matching: exact, or prefix for ``"prefix.*"``."""
    for pattern in patterns:
        if pattern.endswith(".*"):
            if error_type.startswith(pattern[:-1]):
                return True
        elif error_type == pattern:
            return True
    return False
