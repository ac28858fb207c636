"""Outcomes are published without waiting; the delivery is acked when the broker confirms.

The broker's answers are fed to the outcome channel as py-amqp would dispatch
them off the wire (``Basic.Ack``/``Nack``/``Return``, ``Channel.Close``).
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from struct import pack
from typing import Any

import amqp
import pytest
from amqp import spec
from amqp.serialization import dumps

from ojs_kombu.amqp.consuming import outcomes as outcomes_module
from ojs_kombu.amqp.consuming.outcomes import DeadLetterLog, OutcomePublisher, PendingOutcome
from ojs_kombu.amqp.publishing.ledger import Replaced
from ojs_kombu.spec.naming import TopologyNames
from tests.publish_wire import Deliveries, at_each_line, read_publishes, run_traced

#: A Basic.Publish method frame's class and method ids (60, 40).
PUBLISH_METHOD = pack(">HH", *spec.Basic.Publish)


class Wire:
    """The connection an outcome channel writes to: what went out, what was declared."""

    confirm_publish = False
    connection_errors = (ConnectionError,)
    #: the event loop's thread (None: no loop, every publish is written at once)
    ojs_loop_thread: int | None = None
    ojs_write_lock = threading.RLock()

    def __init__(self) -> None:
        self.channels: dict[int, Any] = {}
        self._used_channel_ids: list[int] = []
        self.methods: list[tuple[int, Any]] = []
        self.publishes = 0
        self.writes = 0
        self.data = bytearray()
        self.forgotten: list[str] = []
        self.ojs = type("Binding", (), {"names": TopologyNames()})()

    def _get_free_channel_id(self) -> int:
        channel_id = max(self._used_channel_ids, default=0) + 1
        self._used_channel_ids.append(channel_id)
        return channel_id

    def frame_writer(self, _type: int, channel_id: int, sig: Any, _args: Any,
                     _content: Any) -> None:
        self.methods.append((channel_id, sig))

    def write_frames(self, data: bytes) -> None:
        self.writes += 1
        self.publishes += data.count(PUBLISH_METHOD)
        self.data += data

    def forget_topology(self, queue: str) -> None:
        self.forgotten.append(queue)

    def sent(self, sig: Any) -> list[int]:
        return [channel_id for channel_id, s in self.methods if s == sig]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(outcomes_module, "monotonic", lambda: now[0])
    return now


def outcome(channel: Deliveries, tag: int, prepared: list[str] | None = None,
            job_id: str = "") -> PendingOutcome:
    def prepare(via: Any) -> None:
        if prepared is not None:
            prepared.append("declared")

    return PendingOutcome("retry", job_id or f"job-{tag}", "email",
                          amqp.Message(b"{}", message_id=job_id or f"job-{tag}"),
                          "ojs.exchange.retry", "email.1000", True, Replaced(channel, tag),
                          prepare)


def answer(wire: Wire, sig: Any, argsig: str, args: tuple, content: Any = None) -> None:
    channel_id = wire.sent(spec.Confirm.Select)[-1]
    payload = pack(">HH", *sig) + dumps(argsig, args)  # a method frame's payload
    wire.channels[channel_id].dispatch_method(sig, payload, content)


def test_the_delivery_is_acked_only_when_the_broker_confirms_its_copy() -> None:
    wire, delivered = Wire(), Deliveries()
    publisher = OutcomePublisher(wire, lambda: 131072)
    publisher.publish(outcome(delivered, 7))
    publisher.publish(outcome(delivered, 8))
    assert wire.publishes == 2 and delivered.acked == []  # nothing waited for
    assert publisher.in_flight == 2
    answer(wire, spec.Basic.Ack, "Lb", (1, False))
    assert delivered.acked == [7]
    answer(wire, spec.Basic.Ack, "Lb", (2, True))
    assert delivered.acked == [7, 8] and publisher.in_flight == 0


def test_the_channel_opens_and_confirms_without_waiting() -> None:
    wire = Wire()
    OutcomePublisher(wire, lambda: 131072).publish(outcome(Deliveries(), 1))
    assert [sig for _, sig in wire.methods[:2]] == [spec.Channel.Open, spec.Confirm.Select]


def test_a_nacked_copy_is_published_again_after_the_backoff(clock: list[float]) -> None:
    wire, delivered = Wire(), Deliveries()
    publisher = OutcomePublisher(wire, lambda: 131072)
    publisher.publish(outcome(delivered, 3))
    answer(wire, spec.Basic.Nack, "Lbb", (1, False, False))
    assert delivered.acked == [] and publisher.in_flight == 1  # kept, not lost
    publisher.run_due()
    assert wire.publishes == 1  # not before the backoff
    clock[0] += 2.0  # the first delay of section 11.3 is 1 s +- 25 %
    publisher.run_due()
    assert wire.publishes == 2
    answer(wire, spec.Basic.Ack, "Lb", (2, False))
    assert delivered.acked == [3]


def test_a_returned_copy_redeclares_its_topology_and_goes_again(clock: list[float]) -> None:
    wire, delivered, prepared = Wire(), Deliveries(), []
    publisher = OutcomePublisher(wire, lambda: 131072)
    publisher.publish(outcome(delivered, 5, prepared, job_id="job-a"))
    answer(wire, spec.Basic.Return, "Bsss", (312, "NO_ROUTE", "ojs.exchange.retry", "email.1000"),
           amqp.Message(b"{}", message_id="job-a"))
    answer(wire, spec.Basic.Ack, "Lb", (1, False))
    assert delivered.acked == []  # routed nowhere: the job must not be acked
    assert wire.forgotten == ["email"]
    clock[0] += 2.0
    publisher.run_due()
    assert prepared == ["declared", "declared"]
    answer(wire, spec.Basic.Ack, "Lb", (2, False))
    assert delivered.acked == [5]


def test_a_channel_error_is_not_raised_into_the_loop(clock: list[float],
                                                    caplog: pytest.LogCaptureFixture) -> None:
    wire, delivered = Wire(), Deliveries()
    publisher = OutcomePublisher(wire, lambda: 131072)
    publisher.publish(outcome(delivered, 1))
    publisher.publish(outcome(delivered, 2))
    first = wire.sent(spec.Confirm.Select)[-1]
    with caplog.at_level(logging.ERROR):
        answer(wire, spec.Channel.Close, "BsBB", (406, "PRECONDITION_FAILED", 50, 10))
    assert "406 PRECONDITION_FAILED" in caplog.text
    assert wire.sent(spec.Channel.CloseOk) == [first]
    clock[0] += 2.0
    publisher.run_due()  # both again, on a new channel
    assert wire.publishes == 4
    answer(wire, spec.Basic.Ack, "Lb", (2, True))
    assert sorted(delivered.acked) == [1, 2]


def test_a_confirm_for_a_reset_channel_acks_nothing() -> None:
    wire, delivered = Wire(), Deliveries()
    publisher = OutcomePublisher(wire, lambda: 131072)
    publisher.publish(outcome(delivered, 9))
    delivered.generation += 1  # the consumer's channel was reset: tag 9 is not its own
    answer(wire, spec.Basic.Ack, "Lb", (1, False))
    assert delivered.acked == []


def test_reset_drops_what_the_broker_will_deliver_again() -> None:
    wire = Wire()
    publisher = OutcomePublisher(wire, lambda: 131072)
    publisher.publish(outcome(Deliveries(), 1))
    publisher.reset()
    assert publisher.in_flight == 0


def test_dead_letter_lines_are_rate_limited_and_summed(caplog: pytest.LogCaptureFixture
                                                      ) -> None:
    now = [0.0]
    log = DeadLetterLog(rate=10, clock=lambda: now[0])
    with caplog.at_level(logging.ERROR, logger="ojs_kombu.amqp.consuming.outcomes"):
        for n in range(25):
            log(f"job-{n}", "email", "UNKNOWN_JOB_TYPE", "no task")
        now[0] = 1.5
        log.flush()
    lines = [r.getMessage() for r in caplog.records]
    assert sum("dead-lettering job" in line for line in lines) == 10
    assert lines[-1].startswith("... and 15 more jobs dead-lettered")


def test_publishes_from_the_loop_thread_are_written_once_per_tick() -> None:
    """In a storm, a socket read brings many deliveries: their copies go out in one
    write when the loop ticks, not one write each."""
    wire, delivered = Wire(), Deliveries()
    wire.ojs_loop_thread = threading.get_ident()
    publisher = OutcomePublisher(wire, lambda: 131072)
    for tag in range(1, 51):
        publisher.publish(outcome(delivered, tag))
    assert wire.publishes == 0  # collected
    publisher.run_due()  # the loop's tick
    assert (wire.publishes, wire.writes) == (50, 1)
    answer(wire, spec.Basic.Ack, "Lb", (50, True))
    assert delivered.acked == list(range(1, 51))


def copy(channel: Deliveries, tag: int, body: bytes, exchange: str, routing_key: str,
         **properties: Any) -> PendingOutcome:
    return PendingOutcome("dead letter", f"job-{tag}", "email",
                          amqp.Message(body, **properties), exchange, routing_key, True,
                          Replaced(channel, tag))


@pytest.mark.parametrize("step", range(1, 9))
def test_a_copy_the_loop_publishes_while_another_thread_flushes_is_written(step: int) -> None:
    """``wait_until`` flushes from a pool thread; the loop publishes a copy at each point of
    that flush in turn: every copy is written once, and each confirm acks its own."""
    wire, delivered = Wire(), Deliveries()
    loop = ThreadPoolExecutor(1)
    wire.ojs_loop_thread = loop.submit(threading.get_ident).result()
    publisher = OutcomePublisher(wire, lambda: 131072)
    loop.submit(publisher.publish, outcome(delivered, 1)).result()  # held for the tick
    racing = []

    def pause(line: int) -> None:
        if line == step:  # the loop publishes now (or blocks until the flush is over)
            racing.append(loop.submit(publisher.publish, outcome(delivered, 2)))
            wait(racing, timeout=0.05)

    run_traced(publisher.flush, at_each_line("ojs_kombu", pause))
    if not racing:
        racing.append(loop.submit(publisher.publish, outcome(delivered, 2)))
    racing[0].result()
    loop.submit(publisher.run_due).result()  # the loop's tick
    loop.shutdown()
    written = [p.message_id for p in read_publishes(bytes(wire.data))]
    assert sorted(written) == ["job-1", "job-2"]
    answer(wire, spec.Basic.Ack, "Lb", (len(written), True))
    assert sorted(delivered.acked) == [1, 2] and publisher.in_flight == 0


def test_a_copy_from_another_thread_goes_out_after_the_loops_held_ones() -> None:
    """The broker numbers what it reads: confirm N must settle the N-th copy written."""
    wire, delivered = Wire(), Deliveries()
    wire.ojs_loop_thread = threading.get_ident()  # this thread is the loop
    publisher = OutcomePublisher(wire, lambda: 131072)
    publisher.publish(outcome(delivered, 1))  # held for the tick
    other = threading.Thread(target=publisher.publish, args=(outcome(delivered, 2),))
    other.start()
    other.join()
    publisher.run_due()
    read = [p.message_id for p in read_publishes(bytes(wire.data))]
    assert read == ["job-1", "job-2"]  # wire order is the numbering
    answer(wire, spec.Basic.Nack, "Lbb", (1, False, False))  # the first copy it read
    answer(wire, spec.Basic.Ack, "Lb", (2, False))  # the second
    assert delivered.acked == [int(read[1].split("-")[1])]


def test_a_return_picks_its_copy_not_another_with_the_same_message_id(
        clock: list[float]) -> None:
    """Two deliveries of one malformed job id: the routable copy's delivery is acked,
    the returned copy's delivery stays until its copy goes again."""
    wire, delivered = Wire(), Deliveries()
    publisher = OutcomePublisher(wire, lambda: 131072)
    publisher.publish(copy(delivered, 1, b"[1]", "ojs.exchange.retry", "email.1000",
                           message_id="dup"))
    publisher.publish(copy(delivered, 2, b"[2]", "ojs.exchange.dlx", "gone",
                           message_id="dup"))
    answer(wire, spec.Basic.Return, "Bsss", (312, "NO_ROUTE", "ojs.exchange.dlx", "gone"),
           amqp.Message(b"[2]", message_id="dup"))
    answer(wire, spec.Basic.Ack, "Lb", (2, True))
    assert delivered.acked == [1]
    assert publisher.in_flight == 1  # the returned copy, published again after the backoff


def test_a_returned_copy_without_message_id_is_not_taken_for_confirmed(
        clock: list[float]) -> None:
    wire, delivered = Wire(), Deliveries()
    publisher = OutcomePublisher(wire, lambda: 131072)
    publisher.publish(copy(delivered, 4, b"not json", "ojs.exchange.dlx", "gone"))
    answer(wire, spec.Basic.Return, "Bsss", (312, "NO_ROUTE", "ojs.exchange.dlx", "gone"),
           amqp.Message(b"not json"))
    answer(wire, spec.Basic.Ack, "Lb", (1, False))
    assert delivered.acked == [] and publisher.in_flight == 1
