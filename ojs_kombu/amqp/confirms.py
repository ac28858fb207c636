"""Publisher-confirm bookkeeping for one channel (pure).

In confirm mode the broker numbers every publish of a channel 1, 2, 3 ...
and answers with ``Basic.Ack``/``Basic.Nack`` carrying that number, possibly
for many publishes at once (``multiple``).  A mandatory publish that cannot be
routed is first returned (``Basic.Return``, matched here by ``message_id``),
then acked.  The tracker counts every publish, also those nobody waits for,
so that numbers never drift.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable


class PendingPublish:
    """One publish whose outcome a caller waits for."""

    __slots__ = ("job_id", "nacked", "on_settled", "queue", "returned", "settled")

    def __init__(self, job_id: str, queue: str) -> None:
        self.job_id = job_id
        self.queue = queue
        self.settled = False
        self.nacked = False
        self.returned: str | None = None
        #: Called once settled (publishes nobody waits for: :mod:`.deferred`).
        self.on_settled: Callable[[PendingPublish], None] | None = None


class ConfirmTracker:
    """Matches broker confirms and returns to the publishes of one channel."""

    def __init__(self) -> None:
        self.sequence = 0
        #: In publish order, so that a ``multiple`` confirm settles from the front.
        self._pending: OrderedDict[int, PendingPublish] = OrderedDict()
        self._by_id: dict[str, PendingPublish] = {}

    def skip(self) -> None:
        """Count a publish nobody waits for."""
        self.sequence += 1

    def track(self, job_id: str, queue: str) -> tuple[int, PendingPublish]:
        """Count a publish and return its number and the handle to wait on."""
        self.sequence += 1
        pending = self._pending[self.sequence] = PendingPublish(job_id, queue)
        if job_id:
            self._by_id[job_id] = pending
        return self.sequence, pending

    def forget(self, tag: int, pending: PendingPublish) -> None:
        self._pending.pop(tag, None)
        if self._by_id.get(pending.job_id) is pending:
            del self._by_id[pending.job_id]

    def settle(self, delivery_tag: int, multiple: bool, nacked: bool) -> None:
        """A ``Basic.Ack`` (``nacked=False``) or ``Basic.Nack`` from the broker."""
        pending_by_tag = self._pending
        if multiple:
            # Pipelined publishes get one confirm for many: settle in O(settled).
            while pending_by_tag:
                tag = next(iter(pending_by_tag))
                if tag > delivery_tag:
                    break
                self._settle(pending_by_tag.popitem(last=False)[1], nacked)
        else:
            one = pending_by_tag.pop(delivery_tag, None)
            if one is not None:
                self._settle(one, nacked)

    def _settle(self, pending: PendingPublish, nacked: bool) -> None:
        pending.settled = True
        pending.nacked = pending.nacked or nacked
        if pending.job_id and self._by_id.get(pending.job_id) is pending:
            # A return always precedes its confirm: none can match after it.
            del self._by_id[pending.job_id]
        if pending.on_settled is not None:
            pending.on_settled(pending)

    @property
    def outstanding(self) -> int:
        """Tracked publishes the broker has not confirmed yet."""
        return len(self._pending)

    def returned(self, message_id: str | None, reason: str) -> bool:
        """A ``Basic.Return``; ``False`` when no tracked publish has that id."""
        pending = self._by_id.get(message_id) if message_id else None
        if pending is None:
            return False
        pending.returned = reason
        return True
