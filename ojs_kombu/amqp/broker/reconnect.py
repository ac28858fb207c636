"""The reconnection schedule of the AMQP binding (section 11.3, AMQP-025).

Pure code, no I/O.  What happens on a reconnection reaches the binding's
hook (``connection_failed``, ``connection_reconnected``, ``consumer_cancelled``).

Attempt ``n`` (1-based) waits ``min(2**(n-1), 60)`` seconds, scaled by a
random factor in ``[0.75, 1.25]`` so that workers reconnecting after a
broker restart do not all knock at once; a delay never exceeds the cap
(60 s), so at the cap the spread is ``[45, 60]`` seconds.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from time import monotonic

from ...spec.backoff import backoff

logger = logging.getLogger(__name__)

#: Spec values (section 11.3).
INITIAL_DELAY_S = 1.0
MAX_DELAY_S = 60.0
JITTER = 0.25


@dataclass(frozen=True)
class ReconnectPolicy:
    """Exponential backoff with jitter: 1, 2, 4, 8, ... capped at ``max_delay`` seconds."""

    initial: float = INITIAL_DELAY_S
    max_delay: float = MAX_DELAY_S
    jitter: float = JITTER
    #: ``() -> float`` in ``[0, 1)``; injectable so the schedule is testable.
    random: Callable[[], float] = field(default=random.random, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.initial <= 0 or self.max_delay < self.initial:
            raise ValueError(f"reconnect delays need 0 < initial <= max_delay, got "
                             f"initial={self.initial}, max_delay={self.max_delay}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"reconnect jitter is a fraction in [0, 1), got {self.jitter}")

    def delay(self, attempt: int) -> float:
        """The jittered delay before retry ``attempt``: base * [1-jitter, 1+jitter), <= cap."""
        if attempt < 1:
            raise ValueError(f"reconnect attempts count from 1, got {attempt}")
        return backoff(self.initial, self.max_delay, attempt, jitter=self.jitter,
                       draw=self.random)

    def delays(self) -> Iterator[float]:
        """The endless jittered schedule, attempt 1 first."""
        attempt = 1
        while True:
            yield self.delay(attempt)
            attempt += 1


#: The binding's schedule, used by every ojs_kombu connection.
DEFAULT_POLICY = ReconnectPolicy()


class ConnectBackoff:
    """When a connection opened on demand may try its broker again.

    Such a connection (queue-depth gauges, the AMQP event sink, control, dead
    letters) makes one attempt per use; without memory of past failures every
    use during an outage would knock at once.  After the ``n``-th failure in a
    row the next attempt waits ``policy.delay(n)`` (1, 2, 4 ... s, jittered,
    capped); a success starts over.
    """

    def __init__(self, policy: ReconnectPolicy = DEFAULT_POLICY,
                 clock: Callable[[], float] = monotonic) -> None:
        self.policy = policy
        self.clock = clock
        self.failures = 0
        self._next_attempt = 0.0
        self._lock = threading.Lock()

    def wait(self) -> float:
        """Seconds left before the next attempt may be made (0: now)."""
        return max(0.0, self._next_attempt - self.clock())

    def failed(self) -> float:
        """Record a failed attempt; returns the wait before the next one."""
        with self._lock:
            self.failures += 1
            delay = self.policy.delay(self.failures)
            self._next_attempt = self.clock() + delay
            return delay

    def succeeded(self) -> None:
        with self._lock:
            self.failures = 0
            self._next_attempt = 0.0


_backoffs: dict[str, ConnectBackoff] = {}
_backoffs_lock = threading.Lock()


def connect_backoff(broker: str) -> ConnectBackoff:
    """The one :class:`ConnectBackoff` of this process for ``broker`` (a URL): every
    on-demand connection to a broker shares its schedule."""
    with _backoffs_lock:
        backoff = _backoffs.get(broker)
        if backoff is None:
            backoff = _backoffs[broker] = ConnectBackoff()
        return backoff
