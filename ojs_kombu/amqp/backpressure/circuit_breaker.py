"""The producer's circuit breaker of ``ojs-backpressure.md`` section 8.2, one per queue.

After repeated rejections a producer stops sending to a full queue for a while
instead of knocking again and again; the clock is passed in so every state
change is unit-tested without waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal


class CircuitBreaker:
    """Section 8.2 for one queue: closed -> open after ``threshold`` consecutive
    rejections -> half-open (one trial publish) after ``cooldown`` -> closed on success."""

    def __init__(self, threshold: int, cooldown: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold = threshold
        self.cooldown = cooldown
        self.clock = clock
        self.failures = 0
        self.opened_at: float | None = None
        self._trial = False

    @property
    def state(self) -> Literal["closed", "open", "half-open"]:
        if self.opened_at is None:
            return "closed"
        return "open" if self.clock() - self.opened_at < self.cooldown else "half-open"

    def allow(self) -> float:
        """0.0 when a publish may go ahead, else the seconds until the circuit half-opens."""
        state = self.state
        if state == "closed":
            return 0.0
        if state == "half-open" and not self._trial:
            self._trial = True
            return 0.0
        assert self.opened_at is not None
        return max(self.cooldown - (self.clock() - self.opened_at), self.cooldown / 10)

    def failure(self) -> None:
        self.failures += 1
        if self._trial or self.failures >= self.threshold:
            self.opened_at = self.clock()
        self._trial = False

    def success(self) -> None:
        self.failures = 0
        self.opened_at = None
        self._trial = False

    def release(self) -> None:
        """The trial ended without a verdict (e.g. the connection was lost): the next
        publish may try again."""
        self._trial = False


