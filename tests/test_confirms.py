"""Publisher-confirm bookkeeping: acks, nacks, multiple, returns, untracked publishes."""

from __future__ import annotations

from ojs_kombu.amqp.confirms import ConfirmTracker


def test_single_acks_settle_their_own_publish() -> None:
    tracker = ConfirmTracker()
    (_, p1), (t2, p2) = tracker.track("a", "q"), tracker.track("b", "q")
    tracker.settle(t2, multiple=False, nacked=False)
    assert (p1.settled, p2.settled) == (False, True)


def test_multiple_ack_settles_everything_up_to_the_tag() -> None:
    tracker = ConfirmTracker()
    handles = [tracker.track(str(i), "q") for i in range(4)]
    tracker.settle(handles[2][0], multiple=True, nacked=False)
    assert [p.settled for _, p in handles] == [True, True, True, False]


def test_nack_marks_the_publish_refused() -> None:
    tracker = ConfirmTracker()
    tag, pending = tracker.track("a", "q")
    tracker.settle(tag, multiple=False, nacked=True)
    assert pending.settled and pending.nacked


def test_untracked_publishes_keep_the_numbering_right() -> None:
    tracker = ConfirmTracker()
    tracker.skip()  # e.g. a Celery event published on the same channel
    tag, pending = tracker.track("a", "q")
    assert tag == 2
    tracker.settle(1, multiple=False, nacked=False)
    assert not pending.settled
    tracker.settle(2, multiple=False, nacked=False)
    assert pending.settled


def test_returns_are_matched_by_message_id() -> None:
    tracker = ConfirmTracker()
    _, pending = tracker.track("job-1", "q")
    assert tracker.returned("job-1", "NO_ROUTE")
    assert not tracker.returned("other", "NO_ROUTE") and not tracker.returned(None, "x")
    assert pending.returned == "NO_ROUTE"


def test_forgotten_publishes_are_no_longer_settled() -> None:
    tracker = ConfirmTracker()
    tag, pending = tracker.track("a", "q")
    tracker.forget(tag, pending)
    tracker.settle(tag, multiple=True, nacked=True)
    assert not pending.settled
    assert not tracker.returned("a", "NO_ROUTE")
