"""Broker-side delays with a bounded number of queues (pure arithmetic).

Retries (binding section 8) use the spec's per-delay queues
``ojs.queue.retry.{q}.{delay_ms}``.  Jittered delays would make one queue per
random millisecond, so a retry waits in the longest rung not longer than its
delay, on a ladder with two rungs per octave (1, 1.5, 2, 3, 4, 6, 8, 12 ... ms):
the default policy (0.5 s to 7.5 min with jitter) touches at most 20 retry
queues per OJS queue.  A retry never starts early: its envelope carries the
exact ``scheduled_at``, and the worker that receives it from the shorter rung
sends it through the scheduling ladder for the rest (at most a third of the
delay), as it does with any job that arrives before its ``scheduled_at``.

Scheduled jobs (section 9) need any delay from 1 ms to 49 days, exactly.  They
go through a binary ladder: level ``k`` is a queue whose messages all wait
``2**k`` ms, so head-of-queue expiry never blocks a shorter message behind a
longer one.  A delay of ``d`` ms visits the levels of the bits set in ``d``;
the routing key spells those bits (``"0.1.1....email"``) and topic bindings
send the message down the ladder and finally to its job queue.  32 levels
cover 2**32 - 1 ms (49.7 days) for every queue of a prefix.
"""

from __future__ import annotations

import math

#: Levels of the scheduling ladder: level ``k`` waits ``2**k`` ms.
SCHEDULE_LEVELS = 32
MAX_SCHEDULE_DELAY_MS = 2**SCHEDULE_LEVELS - 1
#: Retry delays are at least this long (RabbitMQ TTLs are whole milliseconds).
MIN_RETRY_DELAY_MS = 1


def retry_delay_rung(delay_ms: float) -> int:
    """The longest ladder rung (``2**e`` or ``3 * 2**(e-1)`` ms) not longer than
    ``delay_ms`` (1 ms at least): a job never leaves its retry queue early."""
    if delay_ms < 2:
        return MIN_RETRY_DELAY_MS
    octave = 2 ** math.floor(math.log2(delay_ms))
    half_step = octave * 3 // 2
    return half_step if octave >= 2 and half_step <= delay_ms else octave


def retry_delay_ms(delay_s: float) -> int:
    """The delay queue (ms) a retry after ``delay_s`` seconds waits in (the rest of the
    delay it waits through the scheduling ladder)."""
    return retry_delay_rung(min(max(delay_s, 0.001) * 1000, MAX_SCHEDULE_DELAY_MS))


def schedule_levels(delay_ms: int) -> list[int]:
    """Levels a ``delay_ms`` scheduling visits, highest first."""
    check_schedule_delay(delay_ms)
    return [k for k in range(SCHEDULE_LEVELS - 1, -1, -1) if delay_ms >> k & 1]


def check_schedule_delay(delay_ms: int) -> None:
    if not 0 < delay_ms <= MAX_SCHEDULE_DELAY_MS:
        raise ValueError(
            f"a broker-side delay must be between 1 ms and {MAX_SCHEDULE_DELAY_MS} ms "
            f"(49.7 days), not {delay_ms} ms"
        )


def schedule_routing_key(delay_ms: int, queue: str) -> str:
    """``b31.b30....b0.{queue}``: the bits of ``delay_ms``, most significant first."""
    check_schedule_delay(delay_ms)
    bits = ".".join("1" if delay_ms >> k & 1 else "0" for k in range(SCHEDULE_LEVELS - 1, -1, -1))
    return f"{bits}.{queue}"


def level_binding_keys(level: int) -> tuple[str, str]:
    """Topic patterns of level ``level``: (bit set -> wait here, bit clear -> go on)."""
    skip = "*." * (SCHEDULE_LEVELS - 1 - level)
    return f"{skip}1.#", f"{skip}0.#"


def delivery_binding_key(queue: str) -> str:
    """Topic pattern that hands a fully waited message to ``queue``."""
    return "*." * SCHEDULE_LEVELS + queue
