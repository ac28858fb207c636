"""Acks collected in one event-loop iteration: which frames go out, and their bytes."""

from __future__ import annotations

from amqp import spec
from amqp.serialization import dumps

from ojs_kombu.amqp.wire.acks import PendingAcks, ack_frames

from .py_amqp_wire import py_amqp_bytes


def pending(*delivered: int) -> PendingAcks:
    acks = PendingAcks()
    for tag in delivered:
        acks.delivered(tag)
    return acks


def collect(acks: PendingAcks, *tags: int, multiple: bool = True) -> list[tuple[int, bool]]:
    for tag in tags:
        acks.ack(tag)
    return acks.take(multiple)


def test_by_default_every_ack_is_its_own_frame_with_multiple_false() -> None:
    # The binding's section 5.3: Basic.Ack with the delivery's tag and multiple=false.
    acks = pending(1, 2, 3, 4, 5)
    assert collect(acks, 3, 1, 2, multiple=False) == [(1, False), (2, False), (3, False)]
    assert acks.open == 2


def test_the_oldest_open_deliveries_all_acked_go_as_one_multiple_ack() -> None:
    acks = pending(1, 2, 3, 4, 5)
    assert collect(acks, 3, 1, 2) == [(3, True)]
    assert acks.open == 2


def test_an_open_delivery_below_an_ack_is_never_covered_by_a_multiple_ack() -> None:
    # Job 1 still runs: acking 2 and 3 with multiple=true would ack it too.
    acks = pending(1, 2, 3, 4)
    assert collect(acks, 3, 2) == [(2, False), (3, False)]
    assert acks.open == 2
    # Once job 1 ends, what is open from the oldest on goes as one frame.
    assert collect(acks, 1, 4) == [(4, True)]
    assert acks.open == 0


def test_acks_past_the_first_open_delivery_go_one_by_one() -> None:
    acks = pending(1, 2, 3, 4, 5)
    assert collect(acks, 1, 2, 5) == [(2, True), (5, False)]
    assert acks.open == 2  # 3 and 4


def test_a_single_ack_is_not_sent_as_multiple() -> None:
    acks = pending(7, 8)
    assert collect(acks, 7) == [(7, False)]
    assert acks.open == 1  # 8: a later multiple ack of 9 may cover it, never 7 again
    acks.delivered(9)
    assert collect(acks, 8, 9) == [(9, True)]


def test_a_nacked_delivery_does_not_stop_a_multiple_ack_over_it() -> None:
    # The broker settled 2 with the nack already; a multiple ack of 3 covers 1 and 3.
    acks = pending(1, 2, 3)
    acks.settled(2)
    assert collect(acks, 1, 3) == [(3, True)]


def test_settling_a_multiple_ack_or_nack_forgets_every_tag_up_to_it() -> None:
    acks = pending(1, 2, 3, 4)
    acks.settled(3, multiple=True)
    assert acks.open == 1
    assert collect(acks, 4) == [(4, False)]


def test_an_ack_twice_in_one_iteration_is_sent_once() -> None:
    # A second Basic.Ack of one tag would close the channel (PRECONDITION_FAILED).
    acks = pending(1, 2, 3)
    assert collect(acks, 2, 2) == [(2, False)]
    assert collect(acks, 3, 3, multiple=False) == [(3, False)]


def test_take_is_empty_without_acks_and_ack_reports_the_first_of_a_batch() -> None:
    acks = pending(1, 2)
    assert acks.take() == []
    assert acks.ack(1) is True
    assert acks.ack(2) is False
    assert len(acks) == 2
    acks.take()
    assert len(acks) == 0
    assert acks.ack(5) is True


def test_ack_frames_are_the_bytes_py_amqp_writes_for_basic_ack() -> None:
    expected = py_amqp_bytes([(1, 9, spec.Basic.Ack, dumps("Lb", (tag, multiple)), None)
                              for tag, multiple in ((1, False), (2**40 + 3, True))])
    assert ack_frames(9, [(1, False), (2**40 + 3, True)]) == expected
