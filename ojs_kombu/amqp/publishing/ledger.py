"""The confirm ledger: where a confirm-mode publish is numbered, and a delivery acked.

In confirm mode the broker numbers a channel's publishes 1, 2, 3 ... in the
order it reads them, and answers with ``Basic.Ack``/``Basic.Nack`` carrying
that number, possibly for many at once (``multiple``).  A mandatory publish it
cannot route is first returned (``Basic.Return``), then acked.  A channel or
connection that closes takes every unconfirmed publish with it: the broker may
or may not have it.

One :class:`ConfirmLedger` per confirm channel keeps that account, whatever
publishes on it (a waiting ``apply_async``, deferred confirms, ``enqueue_many``,
``dlq replay``, a worker's retries, dead letters and reschedules) and whatever
thread or greenlet does:

* a publish is numbered and its frames written under one lock, after the
  frames held for a later write (a loop's or a batch's), so that the ledger's
  number N is the broker's delivery tag N;
* each confirm settles exactly the publishes it names; a return is matched by
  what the publish carried (exchange, routing key, message id and body), to
  the earliest unreturned publish that carried it, since the broker returns
  and confirms a channel's publishes in the order it read them;
* a copy that replaces a delivery (a retry, a dead letter, a reschedule)
  names it (:class:`Replaced`): the delivery is acked here, once the broker
  confirmed every copy that replaces it, and nowhere else.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Protocol


class DeliveryChannel(Protocol):
    """The channel a job was delivered on (:class:`ojs_kombu.amqp.channel.Channel`)."""

    generation: int
    is_open: bool

    def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None: ...


class Replaced:
    """A delivery that copies replace: acked once the broker confirmed ``copies`` of them.

    Its channel may have been reset meanwhile (a new generation numbers its
    deliveries anew): then it is not acked, and the broker delivers it again.
    """

    __slots__ = ("channel", "copies", "delivery_tag", "generation")

    def __init__(self, channel: DeliveryChannel, delivery_tag: int, copies: int = 1) -> None:
        self.channel = channel
        self.delivery_tag = delivery_tag
        self.generation = channel.generation
        self.copies = copies

    @property
    def current(self) -> bool:
        """Whether the delivery can still be settled on its channel."""
        channel = self.channel
        return channel.is_open and channel.generation == self.generation

    def _copy_confirmed(self) -> None:
        self.copies -= 1
        if self.copies == 0 and self.current:
            self.channel.basic_ack(self.delivery_tag)


class Publish:
    """One numbered publish and what the broker said of it.

    ``confirmed``: acked and not returned; ``nacked``; ``returned`` (the reason);
    ``lost``: its channel closed first (it may or may not be enqueued).
    """

    __slots__ = (
        "_body",
        "_message_id",
        "exchange",
        "item",
        "job_id",
        "lost",
        "mandatory",
        "nacked",
        "on_settled",
        "queue",
        "replaces",
        "returned",
        "routing_key",
        "sequence",
        "settled",
    )

    def __init__(self, sequence: int, job_id: str, queue: str, exchange: str, routing_key: str,
                 mandatory: bool, body: bytes, message_id: str | None, item: Any,
                 on_settled: Callable[[Publish], None] | None,
                 replaces: Replaced | None) -> None:
        self.sequence = sequence
        self.job_id = job_id
        self.queue = queue
        self.exchange = exchange
        self.routing_key = routing_key
        self.mandatory = mandatory
        self._body = body if mandatory else b""
        self._message_id = message_id
        #: what the publisher keeps with it (to publish it again, or report it)
        self.item = item
        self.on_settled = on_settled
        self.replaces = replaces
        self.settled = False
        self.nacked = False
        self.returned: str | None = None
        self.lost = False

    @property
    def done(self) -> bool:
        """The broker answered, or never will (its channel closed)."""
        return self.settled or self.lost

    @property
    def confirmed(self) -> bool:
        return self.settled and not self.nacked and self.returned is None

    def _carries(self, exchange: str, routing_key: str, message_id: str | None,
                 body: bytes) -> bool:
        return (self.mandatory and self.returned is None and self.exchange == exchange
                and self.routing_key == routing_key and self._message_id == message_id
                and self._body == body)


def _bytes(body: bytes | str, properties: Mapping[str, Any]) -> bytes:
    if isinstance(body, str):
        return body.encode(properties.get("content_encoding") or "utf-8")
    return bytes(body)


class ConfirmLedger:
    """The confirm-mode publishes of one channel, numbered in wire order.

    ``write`` sends bytes on the connection; ``lock`` is the connection's write
    lock, which every other write of it takes as well (reentrant).
    """

    def __init__(self, write: Callable[[bytes], None], lock: Any = None) -> None:
        self._write = write
        self._lock = lock if lock is not None else threading.RLock()
        self._sequence = 0
        #: sequence -> publish, in wire order (a ``multiple`` confirm settles the front)
        self._pending: OrderedDict[int, Publish] = OrderedDict()
        #: frames numbered and not yet written (:meth:`publish` with ``hold``)
        self._held: list[bytes] = []

    @property
    def outstanding(self) -> int:
        """Publishes the broker has not answered yet."""
        return len(self._pending)

    @property
    def sequence(self) -> int:
        """The number of the channel's last publish."""
        return self._sequence

    def start(self) -> None:
        """Confirm mode was selected on a new channel: its publishes count from 1.
        Whatever the last channel left is dropped (:meth:`close` first to know it)."""
        with self._lock:
            self._sequence = 0
            self._pending.clear()
            self._held.clear()

    def publish(self, data: bytes, *, job_id: str, queue: str, exchange: str,
                routing_key: str, mandatory: bool, body: bytes | str,
                properties: Mapping[str, Any], hold: bool = False, item: Any = None,
                on_settled: Callable[[Publish], None] | None = None,
                replaces: Replaced | None = None) -> Publish:
        """Number the publish whose frames are ``data`` and write them, after the frames
        held so far; ``hold``: keep them for the next :meth:`flush` (or unheld publish).
        ``on_settled`` is called once the broker answered."""
        body_bytes = _bytes(body, properties) if mandatory else b""
        message_id = properties.get("message_id")
        with self._lock:
            self._sequence += 1
            entry = Publish(self._sequence, job_id, queue, exchange, routing_key, mandatory,
                            body_bytes, message_id, item, on_settled, replaces)
            self._pending[entry.sequence] = entry
            held = self._held
            held.append(data)
            if not hold:
                try:
                    self._write(held[0] if len(held) == 1 else b"".join(held))
                except BaseException:
                    self._pending.pop(entry.sequence, None)
                    raise
                finally:
                    held.clear()
        return entry

    def skip(self) -> None:
        """Count a publish written by another path (py-amqp's own), under :attr:`lock`."""
        with self._lock:
            self.flush()
            self._sequence += 1

    @property
    def lock(self) -> Any:
        return self._lock

    def flush(self) -> None:
        """Write the held frames, in one write.  Called every loop iteration: with nothing
        held (frames are held only from the loop's own thread) it returns before the lock."""
        if not self._held:
            return
        with self._lock:
            held = self._held
            if held:
                data = held[0] if len(held) == 1 else b"".join(held)
                held.clear()
                self._write(data)

    def forget(self, entry: Publish) -> None:
        """Nobody waits for ``entry`` any more: its confirm, when it comes, settles nothing."""
        with self._lock:
            if self._pending.get(entry.sequence) is entry:
                del self._pending[entry.sequence]

    # -- the broker's answers ------------------------------------------------------

    def ack(self, delivery_tag: int, multiple: bool) -> None:
        """``Basic.Ack``."""
        self._answered(self._take(delivery_tag, multiple), nacked=False)

    def nack(self, delivery_tag: int, multiple: bool) -> None:
        """``Basic.Nack``: the broker refused the publish (a full ``reject-publish`` queue)."""
        self._answered(self._take(delivery_tag, multiple), nacked=True)

    def returned(self, exchange: str, routing_key: str, message: Any,
                 reason: str) -> Publish | None:
        """``Basic.Return`` of ``message``: the earliest unreturned publish that carried it
        (``None``: none did); its confirm follows."""
        properties = message.properties
        body = _bytes(message.body, properties)
        message_id = properties.get("message_id")
        with self._lock:
            for entry in self._pending.values():
                if entry._carries(exchange, routing_key, message_id, body):
                    entry.returned = reason
                    return entry
        return None

    def close(self) -> list[Publish]:
        """The channel (or connection) closed: every unanswered publish is lost, in wire
        order, and held frames are dropped.  Their ``on_settled`` is not called: the
        caller decides what to do with them (the next channel numbers anew)."""
        with self._lock:
            lost = list(self._pending.values())
            self._pending.clear()
            self._held.clear()
        for entry in lost:
            entry.lost = True
        return lost

    def _take(self, delivery_tag: int, multiple: bool) -> list[Publish]:
        with self._lock:
            pending = self._pending
            if not multiple:
                one = pending.pop(delivery_tag, None)
                return [one] if one is not None else []
            done = []
            while pending:
                tag = next(iter(pending))
                if tag > delivery_tag:
                    break
                done.append(pending.popitem(last=False)[1])
            return done

    @staticmethod
    def _answered(entries: list[Publish], nacked: bool) -> None:
        for entry in entries:
            entry.settled = True
            entry.nacked = nacked
            if entry.replaces is not None and entry.confirmed:
                # The one place a delivery replaced by copies is acked.
                entry.replaces._copy_confirmed()
            if entry.on_settled is not None:
                entry.on_settled(entry)
