"""The acks of one channel, collected while the worker's event loop runs its callbacks.

A worker acks every job on its own (``acks_late``: after the job ran).  Sent
one by one, each ack is one ``sendall`` for the worker and one settle for the
broker.  Celery hands the acks of finished jobs to its event loop, which runs
all that are ready in one go; the transport collects them here and writes them
together before the loop polls again.  Where the oldest deliveries still open on
the channel are all among them, one ``Basic.Ack(multiple=true)`` settles those
(AMQP 0-9-1: "up to and including" the tag); the others go as single acks.

That is only safe while every delivery that needs an ack is known:
:meth:`PendingAcks.delivered` must see each one (the transport calls it for
every ``Basic.Deliver`` to a consumer with manual acks and every
``Basic.Get-Ok`` without ``no_ack``), and :meth:`PendingAcks.settled` every
ack or nack sent outside a batch.  Pure bookkeeping, no I/O.
"""

from __future__ import annotations

from struct import Struct

#: A ``Basic.Ack`` method frame: type 1, channel, size 13, class 60, method 80,
#: delivery tag, multiple, frame end.
_ACK_FRAME = Struct(">BHIHHQBB")


def ack_frames(channel_id: int, acks: list[tuple[int, bool]]) -> bytes:
    """The wire bytes of ``Basic.Ack`` frames for ``(delivery tag, multiple)`` pairs."""
    pack = _ACK_FRAME.pack
    return b"".join(pack(1, channel_id, 13, 60, 80, tag, multiple, 0xCE)
                    for tag, multiple in acks)


class PendingAcks:
    """Deliveries of one channel that still need an ack or nack, and the acks not yet sent."""

    __slots__ = ("_acks", "_open")

    def __init__(self) -> None:
        #: delivery tag -> None, in delivery (so ascending tag) order
        self._open: dict[int, None] = {}
        self._acks: list[int] = []

    def __len__(self) -> int:
        """Acks collected and not yet taken."""
        return len(self._acks)

    @property
    def open(self) -> int:
        """Deliveries neither acked nor nacked, collected acks included."""
        return len(self._open)

    def delivered(self, delivery_tag: int) -> None:
        self._open[delivery_tag] = None

    def settled(self, delivery_tag: int, multiple: bool = False) -> None:
        """An ack or nack for ``delivery_tag`` went out on its own."""
        if not multiple:
            self._open.pop(delivery_tag, None)
            return
        for tag in [t for t in self._open if t <= delivery_tag]:
            del self._open[tag]

    def ack(self, delivery_tag: int) -> bool:
        """Collect an ack; ``True`` if it is the first one since the last :meth:`take`."""
        self._acks.append(delivery_tag)
        return len(self._acks) == 1

    def take(self, multiple: bool = False) -> list[tuple[int, bool]]:
        """The collected acks as ``(delivery tag, multiple)`` frames, in tag order.

        Without ``multiple`` every ack is its own frame (``multiple=false``, as the
        binding's section 5.3 asks).
        """
        acks = self._acks
        if not acks:
            return []
        self._acks = []
        if len(acks) == 1:  # the most common flush: one job finished in the iteration
            (tag,) = acks
            self._open.pop(tag, None)
            return [(tag, False)]
        acked = set(acks)
        last = self._end_of_finished_run(acked) if multiple else 0
        for tag in acked:
            self._open.pop(tag, None)
        singles = [(tag, False) for tag in sorted(acked) if tag > last]
        return [(last, True), *singles] if last else singles

    def _end_of_finished_run(self, acked: set[int]) -> int:
        """The last tag of the run of oldest open deliveries that are all in ``acked``, if
        the run holds two or more (one frame then settles it); else 0."""
        run, last = 0, 0
        for tag in self._open:  # ascending: tags grow with every delivery on a channel
            if tag not in acked:
                break
            run, last = run + 1, tag
        return last if run >= 2 else 0
