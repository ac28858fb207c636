"""The one backoff of ojs_kombu: exponential, capped, optionally jittered (pure).

Every wait that grows with failures uses it: job retries (the OJS retry
policy), reconnects and outcome republishes (AMQP binding section 11.3),
producer retries under backpressure (``ojs-backpressure.md`` section 8.1)
and event-sink retries.  Each caller keeps its own numbers; the formula is here
once::

    delay(n) = min(initial * coefficient**(n-1), maximum)
    delay(n) = min(delay(n) * uniform[1-jitter, 1+jitter), maximum)   # with jitter

so that the cap holds after the jitter too.  The random draw is injectable so a
schedule can be pinned in tests.
"""

from __future__ import annotations

import random
from collections.abc import Callable


def backoff(initial: float, maximum: float, attempt: int, *, coefficient: float = 2.0,
            jitter: float = 0.0, draw: Callable[[], float] = random.random) -> float:
    """Seconds to wait before retry ``attempt`` (1-based; below 1 counts as 1).

    ``jitter`` is the spread of the random factor (0.25: ``[0.75, 1.25)``, the
    retry policy's 0.5: ``[0.5, 1.5)``); 0 draws nothing.
    """
    try:
        delay = min(initial * float(coefficient) ** (max(attempt, 1) - 1), maximum)
    except OverflowError:  # a worker retrying for days is long past the cap
        delay = maximum
    if jitter:
        delay = min(delay * (1 - jitter + 2 * jitter * draw()), maximum)
    return delay
