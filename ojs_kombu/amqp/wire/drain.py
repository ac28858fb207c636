"""Reading a connection's incoming frames until something happened, or a deadline.

A confirm, an INFO answer, a retry's settlement or the next event all arrive as
frames that only ``drain_events`` reads; every wait for one of them is the same
loop, so it is written once here.
"""

from __future__ import annotations

from collections.abc import Callable
from time import monotonic
from typing import Any, Protocol


class Drainable(Protocol):
    """A py-amqp connection, or anything that reads its frames the same way."""

    def drain_events(self, timeout: float | None = None) -> Any: ...


def drain_until(connection: Drainable, done: Callable[[], bool], timeout: float | None, *,
                poll: float | None = None) -> bool:
    """Read ``connection``'s frames until ``done()``; ``False`` when ``timeout`` seconds
    passed first (``None``: no deadline).

    Each read waits at most ``poll`` seconds (``None``: until the deadline), so that a
    condition set from elsewhere (a signal, another thread) is seen in time.
    """
    deadline = None if timeout is None else monotonic() + timeout
    while not done():
        wait = poll
        if deadline is not None:
            remaining = deadline - monotonic()
            if remaining <= 0:
                return False
            wait = remaining if poll is None else min(poll, remaining)
        try:
            connection.drain_events(timeout=wait)
        except TimeoutError:
            continue
    return True
