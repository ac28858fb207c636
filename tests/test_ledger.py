"""The confirm ledger against a broker that reads what it wrote (no socket).

The broker here numbers publishes in the order it reads their frames, as
RabbitMQ does, and answers with confirms, returns and closes: what each
publish is said to be (confirmed, refused, returned, lost) and which
delivery is acked must follow from the bytes on the wire alone.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import amqp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ojs_kombu.amqp.publishing.ledger import ConfirmLedger, Publish, Replaced
from ojs_kombu.amqp.wire.publish_frames import PublishFrames
from tests.publish_wire import (
    Deliveries,
    WirePublish,
    at_each_line,
    read_publishes,
    run_traced,
)

FRAMES = PublishFrames(1, 131072)


class Broker:
    """One channel's side of the broker: what it read, in order, is its numbering."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.data += data
        self.writes += 1

    @property
    def read(self) -> list[WirePublish]:
        return read_publishes(bytes(self.data))

    def ids(self) -> list[str | None]:
        return [p.properties.get("correlation_id") for p in self.read]


def publish(ledger: ConfirmLedger, name: str, *, hold: bool = False, key: str = "email",
            message_id: str | None = None, body: bytes | None = None,
            replaces: Replaced | None = None,
            on_settled: Callable[[Publish], None] | None = None) -> Publish:
    """A mandatory publish to ``ojs.exchange.direct`` named ``name`` (its correlation id)."""
    properties: dict[str, Any] = {"correlation_id": name}
    if message_id is not None:
        properties["message_id"] = message_id
    body = name.encode() if body is None else body
    data = FRAMES.encode("ojs.exchange.direct", key, True, body, properties)
    return ledger.publish(data, job_id=message_id or "", queue="email",
                          exchange="ojs.exchange.direct", routing_key=key, mandatory=True,
                          body=body, properties=properties, hold=hold, replaces=replaces,
                          on_settled=on_settled)


def returned(ledger: ConfirmLedger, wire: WirePublish) -> Publish | None:
    """The broker returns ``wire`` (it routed it nowhere)."""
    return ledger.returned(wire.exchange, wire.routing_key,
                           amqp.Message(wire.body, **wire.properties), "312 NO_ROUTE")


def test_loop_and_pool_thread_publishes_are_numbered_in_wire_order() -> None:
    broker = Broker()
    ledger = ConfirmLedger(broker.write)
    first = publish(ledger, "loop-1", hold=True)  # the loop's, written at its tick
    second = publish(ledger, "loop-2", hold=True)
    pool = ThreadPoolExecutor(1)
    third = pool.submit(publish, ledger, "pool-3").result()  # written at once
    fourth = publish(ledger, "loop-4", hold=True)
    ledger.flush()
    pool.shutdown()
    assert broker.ids() == ["loop-1", "loop-2", "pool-3", "loop-4"]
    assert [p.sequence for p in (first, second, third, fourth)] == [1, 2, 3, 4]
    ledger.ack(3, multiple=False)
    assert [p.confirmed for p in (first, second, third, fourth)] == [False, False, True, False]


@pytest.mark.parametrize("step", range(1, 7))
def test_a_flush_racing_a_publish_writes_everything_once_in_order(step: int) -> None:
    """Another thread publishes at each point of a flush in turn."""
    broker = Broker()
    ledger = ConfirmLedger(broker.write)
    publish(ledger, "held-1", hold=True)
    pool = ThreadPoolExecutor(1)
    racing = []

    def pause(line: int) -> None:
        if line == step:
            racing.append(pool.submit(publish, ledger, "held-2", hold=True))
            wait(racing, timeout=0.05)

    run_traced(ledger.flush, at_each_line("ojs_kombu", pause))
    assert racing, "the flush ran fewer lines than the step"
    entry = racing[0].result()
    pool.shutdown()
    ledger.flush()
    assert broker.ids() == ["held-1", "held-2"] and entry.sequence == 2


def test_multiple_acks_and_nacks_settle_up_to_their_tag() -> None:
    ledger = ConfirmLedger(Broker().write)
    entries = [publish(ledger, f"job-{n}") for n in range(1, 6)]
    ledger.ack(2, multiple=True)
    ledger.nack(4, multiple=True)
    ledger.ack(5, multiple=False)
    ledger.ack(5, multiple=True)  # a repeated confirm settles nothing more
    assert [(p.confirmed, p.nacked) for p in entries] == [
        (True, False), (True, False), (False, True), (False, True), (True, False)]
    assert ledger.outstanding == 0


def test_a_return_before_its_ack_makes_the_publish_returned_not_confirmed() -> None:
    broker, deliveries = Broker(), Deliveries()
    ledger = ConfirmLedger(broker.write)
    settled: list[Publish] = []
    entry = publish(ledger, "job-1", message_id="job-1", replaces=Replaced(deliveries, 7),
                    on_settled=settled.append)
    assert returned(ledger, broker.read[0]) is entry
    assert settled == []  # the confirm follows the return
    ledger.ack(1, multiple=False)
    assert settled == [entry] and entry.returned == "312 NO_ROUTE" and not entry.confirmed
    assert deliveries.acked == []  # routed nowhere: the delivery is not acked


@pytest.mark.parametrize("message_ids", [(None, None), ("dup", "dup")])
def test_returns_of_jobs_without_or_with_a_shared_message_id(
        message_ids: tuple[str | None, str | None]) -> None:
    broker, deliveries = Broker(), Deliveries()
    ledger = ConfirmLedger(broker.write)
    routed = publish(ledger, "a", message_id=message_ids[0], key="email",
                     replaces=Replaced(deliveries, 1))
    lost = publish(ledger, "b", message_id=message_ids[1], key="gone",
                   replaces=Replaced(deliveries, 2))
    assert returned(ledger, broker.read[1]) is lost
    ledger.ack(2, multiple=True)
    assert (routed.confirmed, lost.confirmed) == (True, False)
    assert deliveries.acked == [1]


def test_identical_publishes_are_returned_in_the_order_they_were_written() -> None:
    broker = Broker()
    ledger = ConfirmLedger(broker.write)
    first = publish(ledger, "same", key="gone", body=b"{}")
    second = publish(ledger, "same", key="gone", body=b"{}")
    assert returned(ledger, broker.read[0]) is first
    assert returned(ledger, broker.read[1]) is second
    assert returned(ledger, broker.read[1]) is None  # both are returned already


def test_a_close_loses_what_is_in_flight_and_drops_held_frames() -> None:
    broker, deliveries = Broker(), Deliveries()
    ledger = ConfirmLedger(broker.write)
    written = publish(ledger, "written", replaces=Replaced(deliveries, 1))
    held = publish(ledger, "held", hold=True, replaces=Replaced(deliveries, 2))
    assert ledger.close() == [written, held]
    assert written.lost and held.lost and written.done
    ledger.flush()
    assert broker.ids() == ["written"]  # the held frames were for the closed channel
    ledger.ack(2, multiple=True)  # too late: nothing is settled, nothing acked
    assert deliveries.acked == [] and not written.settled


def test_after_a_reconnection_numbers_start_again_and_old_confirms_settle_nothing() -> None:
    broker, deliveries = Broker(), Deliveries()
    ledger = ConfirmLedger(broker.write)
    old = publish(ledger, "old", replaces=Replaced(deliveries, 1))
    ledger.close()
    ledger.start()  # a new channel in confirm mode
    new = publish(ledger, "new", replaces=Replaced(deliveries, 2))
    assert (old.sequence, new.sequence) == (1, 1)
    ledger.ack(1, multiple=False)
    assert new.confirmed and not old.settled and deliveries.acked == [2]


def test_a_delivery_is_acked_once_every_copy_replacing_it_is_confirmed() -> None:
    deliveries = Deliveries()
    ledger = ConfirmLedger(Broker().write)
    replaced = Replaced(deliveries, 9, copies=2)
    publish(ledger, "copy-1", replaces=replaced)
    publish(ledger, "copy-2", replaces=replaced)
    ledger.ack(1, multiple=False)
    assert deliveries.acked == []
    ledger.ack(2, multiple=False)
    assert deliveries.acked == [9]


def test_a_delivery_of_a_reset_channel_is_not_acked() -> None:
    deliveries = Deliveries()
    ledger = ConfirmLedger(Broker().write)
    publish(ledger, "copy", replaces=Replaced(deliveries, 3))
    deliveries.generation += 1  # its tag 3 now names another delivery
    ledger.ack(1, multiple=False)
    assert deliveries.acked == []


def test_a_failed_write_leaves_no_publish_behind() -> None:
    def broken(data: bytes) -> None:
        raise ConnectionError("socket closed")

    ledger = ConfirmLedger(broken)
    with pytest.raises(ConnectionError):
        publish(ledger, "job")
    assert ledger.outstanding == 0


# -- random interleavings -------------------------------------------------------------

OPS = st.one_of(
    st.tuples(st.just("publish"), st.booleans(), st.sampled_from(["email", "gone"]),
              st.sampled_from([None, "shared", "own"])),
    st.tuples(st.just("flush")),
    st.tuples(st.just("read")),
    st.tuples(st.sampled_from(["ack", "nack"]), st.integers(0, 20), st.booleans()),
    st.tuples(st.just("close")),
    st.tuples(st.just("again")),
    st.tuples(st.just("route")),
)


class Interleaving:
    """A worker's copies through one ledger, and a broker that reads their bytes:
    ``gone`` is unroutable until routed; a refused, returned or lost copy goes again."""

    def __init__(self) -> None:
        self.deliveries = Deliveries()
        self.channel = Broker()
        self.ledger = ConfirmLedger(self._write)
        self.read = 0  # publishes of the channel the broker has read
        self.unanswered: list[tuple[int, WirePublish]] = []
        self.confirmed: list[bytes] = []  # bodies the broker routed and acked
        self.unroutable = {"gone"}
        #: delivery -> (what it is replaced by, routing key, message id, held)
        self.copies: dict[int, tuple[Replaced, str, str | None, bool]] = {}
        self.again: list[int] = []

    def _write(self, data: bytes) -> None:
        self.channel.write(data)

    def publish(self, delivery: int) -> None:
        replaced, key, message_id, hold = self.copies[delivery]
        publish(self.ledger, f"job-{delivery}", hold=hold, key=key,
                message_id=message_id, body=b"job-%d" % delivery, replaces=replaced,
                on_settled=self._settled)

    def _settled(self, entry: Publish) -> None:
        if not entry.confirmed:
            self.again.append(_delivery_of(entry))

    def broker_reads(self) -> None:
        for wire in self.channel.read[self.read:]:
            self.read += 1
            if wire.routing_key in self.unroutable:
                returned(self.ledger, wire)
                self.answer(self.read, "ack", multiple=False, routed=False)
            else:
                self.unanswered.append((self.read, wire))

    def answer(self, tag: int, kind: str, *, multiple: bool, routed: bool = True) -> None:
        if routed:
            answered = [(t, w) for t, w in self.unanswered if t <= tag] if multiple else [
                (t, w) for t, w in self.unanswered if t == tag]
            for item in answered:
                self.unanswered.remove(item)
                if kind == "ack":
                    self.confirmed.append(item[1].body)
        (self.ledger.ack if kind == "ack" else self.ledger.nack)(tag, multiple)

    def close(self) -> None:
        self.broker_reads()  # what was written may be enqueued: never confirmed now
        self.again += [_delivery_of(entry) for entry in self.ledger.close()]
        self.channel, self.read, self.unanswered = Broker(), 0, []
        self.ledger.start()

    def check(self) -> None:
        acked = self.deliveries.acked
        assert len(acked) == len(set(acked)), "a delivery acked twice"
        assert sorted(acked) == sorted(int(body.split(b"-")[1]) for body in self.confirmed), \
            "acked deliveries are not those whose copy the broker confirmed"

    def run(self, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind == "publish":
            delivery = len(self.copies) + 1
            message_id = {"own": f"id-{delivery}", "shared": "shared", None: None}[op[3]]
            self.copies[delivery] = (Replaced(self.deliveries, delivery), op[2], message_id,
                                     op[1])
            self.publish(delivery)
        elif kind == "flush":
            self.ledger.flush()
        elif kind == "read":
            self.broker_reads()
        elif kind in ("ack", "nack"):
            if self.unanswered:
                tag = self.unanswered[op[1] % len(self.unanswered)][0]
                self.answer(tag, kind, multiple=op[2])
        elif kind == "close":
            self.close()
        elif kind == "again":
            again, self.again = self.again, []
            for delivery in again:
                self.publish(delivery)
        else:
            self.unroutable = set()
        self.check()

    def finish(self) -> None:
        """Everything routable, every answer given, every failed copy sent again."""
        self.unroutable = set()
        for _ in range(len(self.copies) + 2):
            again, self.again = self.again, []
            for delivery in again:
                self.publish(delivery)
            self.ledger.flush()
            self.broker_reads()
            if self.unanswered:
                self.answer(self.unanswered[-1][0], "ack", multiple=True)
            self.check()


def _delivery_of(entry: Publish) -> int:
    assert entry.replaces is not None
    return entry.replaces.delivery_tag


@settings(max_examples=300, deadline=None)
@given(st.lists(OPS, max_size=40))
def test_every_delivery_is_acked_exactly_when_its_copy_is_confirmed(
        ops: list[tuple[Any, ...]]) -> None:
    run = Interleaving()
    for op in ops:
        run.run(op)
    run.finish()
    assert sorted(run.deliveries.acked) == sorted(run.copies), "a delivery was forgotten"
    assert run.ledger.outstanding == 0
