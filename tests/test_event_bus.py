"""In-process event delivery and the section 6.1 filter model."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from pydantic import ValidationError

from ojs_kombu.events import Event, EventBus, EventFilter, make_event

BILLING = "ojs://billing-api/workers/worker-1"
ORDERS = "ojs://order-service/workers/worker-2"


def job_event(event_type: str = "job.completed", *, queue: str = "email",
              job_type: str = "email.send", source: str = BILLING) -> Event:
    data: dict[str, Any] = {"job_type": job_type, "queue": queue}
    if event_type == "job.completed":
        data |= {"duration_ms": 10, "attempt": 1}
    elif event_type == "job.failed":
        data |= {"attempt": 1, "error": {"code": "handler_error", "message": "boom",
                                         "retryable": True}}
    return make_event(event_type, data, source=source)


def worker_event() -> Event:
    return make_event("worker.started", {"worker_id": "w1", "queues": ["email"],
                                         "concurrency": 4}, source=BILLING)


# -- EventFilter ------------------------------------------------------------------------------


@pytest.mark.parametrize("filter", [EventFilter(), EventFilter(event_types=[], queues=[],
                                                                job_types=[], sources=[])])
def test_empty_filter_matches_everything(filter: EventFilter) -> None:
    assert filter.matches(job_event())
    assert filter.matches(worker_event())


def test_exact_event_types_or_within_the_field() -> None:
    f = EventFilter(event_types=["job.completed", "job.failed"])
    assert f.matches(job_event("job.completed"))
    assert f.matches(job_event("job.failed"))
    assert not f.matches(job_event("job.enqueued"))
    assert not f.matches(worker_event())


def test_prefix_event_types() -> None:
    f = EventFilter(event_types=["job.*"])
    assert f.matches(job_event("job.enqueued")) and f.matches(job_event("job.failed"))
    assert not f.matches(worker_event())
    everything = EventFilter(event_types=["*"])
    assert everything.matches(job_event()) and everything.matches(worker_event())
    mixed = EventFilter(event_types=["worker.*", "job.failed"])
    assert mixed.matches(worker_event()) and mixed.matches(job_event("job.failed"))
    assert not mixed.matches(job_event("job.completed"))


def test_queues_and_job_types_are_exact_and_need_the_field() -> None:
    f = EventFilter(queues=["email", "reports"])
    assert f.matches(job_event(queue="email")) and f.matches(job_event(queue="reports"))
    assert not f.matches(job_event(queue="emails"))
    assert not f.matches(worker_event())  # no data.queue (its data.queues is a list)
    t = EventFilter(job_types=["email.send"])
    assert t.matches(job_event()) and not t.matches(job_event(job_type="email.send.bulk"))
    assert not t.matches(worker_event())
    queue_event = make_event("queue.paused", {"queue": "email"}, source=BILLING)
    assert f.matches(queue_event) and not t.matches(queue_event)


def test_sources_take_a_prefix_like_the_section_6_1_example() -> None:
    f = EventFilter(sources=["ojs://billing-api/*"])
    assert f.matches(job_event(source=BILLING))
    assert not f.matches(job_event(source=ORDERS))
    assert EventFilter(sources=[ORDERS]).matches(job_event(source=ORDERS))
    assert not EventFilter(sources=[ORDERS + "0"]).matches(job_event(source=ORDERS))


def test_dimensions_combine_with_and() -> None:
    f = EventFilter(event_types=["job.*"], queues=["email"], job_types=["email.send"],
                    sources=["ojs://billing-api/*"])
    assert f.matches(job_event())
    assert not f.matches(job_event(queue="reports"))
    assert not f.matches(job_event(job_type="sms.send"))
    assert not f.matches(job_event(source=ORDERS))
    assert not f.matches(make_event("queue.paused", {"queue": "email"}, source=BILLING))


@pytest.mark.parametrize(
    "fields",
    [{"event_types": ["*.completed"]}, {"event_types": ["job.complete"]},
     {"event_types": ["jobs.*"]}, {"event_types": [""]}, {"sources": ["ojs://*/workers"]},
     {"queues": "email"}, {"priorities": [1]}],
)
def test_bad_filters_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        EventFilter(**fields)


def test_filter_parses_the_websocket_subscribe_message() -> None:
    message = {"event_types": ["job.completed", "job.failed"], "queues": ["email"]}
    f = EventFilter.model_validate(message)
    assert f.matches(job_event("job.failed")) and not f.matches(job_event(queue="x"))


# -- EventBus ---------------------------------------------------------------------------------


def test_delivery_in_subscription_order_to_matching_subscribers() -> None:
    bus, calls = EventBus(), []
    bus.subscribe(lambda e: calls.append(("a", e.type)))
    bus.subscribe(lambda e: calls.append(("b", e.type)), EventFilter(event_types=["worker.*"]))
    bus.subscribe(lambda e: calls.append(("c", e.type)), EventFilter(queues=["email"]))
    event = job_event()
    assert bus.publish(event) == 2
    assert bus.publish(worker_event()) == 2
    assert calls == [("a", "job.completed"), ("c", "job.completed"),
                     ("a", "worker.started"), ("b", "worker.started")]


def test_subscribers_receive_the_event_itself() -> None:
    bus, seen = EventBus(), []
    bus.subscribe(seen.append)
    event = job_event()
    bus.publish(event)
    assert seen == [event] and seen[0] is event


def test_cancel_stops_delivery_and_is_idempotent() -> None:
    bus, calls = EventBus(), []
    first = bus.subscribe(lambda e: calls.append(1))
    bus.subscribe(lambda e: calls.append(2))
    first.cancel()
    first.cancel()
    assert not first.active and len(bus) == 1
    bus.publish(job_event())
    assert calls == [2]


def test_cancel_during_publish_skips_a_later_subscriber() -> None:
    bus, calls = EventBus(), []
    later: list[Any] = []
    bus.subscribe(lambda e: later[0].cancel())
    later.append(bus.subscribe(lambda e: calls.append("later")))
    bus.publish(job_event())
    assert calls == []


def test_subscribe_during_publish_starts_with_the_next_event() -> None:
    bus, calls = EventBus(), []

    def subscriber(event: Event) -> None:
        calls.append("first")
        if len(bus) == 1:
            bus.subscribe(lambda e: calls.append("new"))

    bus.subscribe(subscriber)
    bus.publish(job_event())
    assert calls == ["first"]
    bus.publish(job_event())
    assert calls == ["first", "first", "new"]


def test_failing_subscriber_is_logged_counted_and_isolated(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bus, calls = EventBus(), []

    def broken(event: Event) -> None:
        raise RuntimeError("dashboard down")

    bus.subscribe(lambda e: calls.append("before"))
    bus.subscribe(broken)
    bus.subscribe(lambda e: calls.append("after"))
    event = job_event()
    with caplog.at_level(logging.ERROR, logger="ojs_kombu.events"):
        assert bus.publish(event) == 3
        bus.publish(event)
    assert calls == ["before", "after", "before", "after"]
    assert bus.failures == 2
    records = [r for r in caplog.records if r.name == "ojs_kombu.events"]
    assert len(records) == 2
    assert event.id in records[0].getMessage() and "job.completed" in records[0].getMessage()
    assert records[0].exc_info is not None and records[0].exc_info[0] is RuntimeError


def test_base_exceptions_are_not_swallowed() -> None:
    bus = EventBus()

    def interrupted(event: Event) -> None:
        raise KeyboardInterrupt

    bus.subscribe(interrupted)
    with pytest.raises(KeyboardInterrupt):
        bus.publish(job_event())


def test_subscribe_needs_a_callable() -> None:
    with pytest.raises(TypeError):
        EventBus().subscribe("print")  # type: ignore[arg-type]


def test_publish_without_subscribers() -> None:
    assert EventBus().publish(job_event()) == 0


def test_concurrent_subscribe_cancel_and_publish() -> None:
    bus = EventBus()
    received = []
    lock = threading.Lock()

    def count(event: Event) -> None:
        with lock:
            received.append(event.id)

    def churn() -> None:
        for _ in range(200):
            bus.subscribe(count).cancel()
            bus.subscribe(count)

    event = job_event()
    threads = [threading.Thread(target=churn) for _ in range(8)]
    publisher = threading.Thread(target=lambda: [bus.publish(event) for _ in range(200)])
    for thread in [*threads, publisher]:
        thread.start()
    for thread in [*threads, publisher]:
        thread.join()
    assert len(bus) == 8 * 200
    assert len({s.id for s in bus.subscriptions}) == len(bus)
    assert all(s.active for s in bus.subscriptions)
    assert bus.publish(event) == 8 * 200


def test_concurrent_failures_are_all_counted() -> None:
    bus = EventBus()
    logging.getLogger("ojs_kombu.events").disabled = True
    try:
        bus.subscribe(lambda e: 1 / 0)
        event = job_event()
        threads = [threading.Thread(target=lambda: [bus.publish(event) for _ in range(250)])
                   for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        logging.getLogger("ojs_kombu.events").disabled = False
    assert bus.failures == 1000


class DraftTaker:
    """A subscriber that takes drafts, as the background sinks do."""

    takes_drafts = True

    def __init__(self, calls: list[Any], fail: bool = False,
                 cancel: list[Any] | None = None) -> None:
        self.calls, self.fail, self.cancel = calls, fail, cancel

    def __call__(self, event: Any) -> None:
        self.calls.append(event)
        if self.cancel:
            self.cancel[0].cancel()
        if self.fail:
            raise RuntimeError("sink down")


def test_draft_takers_alone_get_each_draft_isolated_and_cancellable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Only sinks subscribed (a worker's usual set-up): each gets the draft itself, in
    subscription order; one that raises is counted and the next still gets it; a
    cancellation during delivery reaches a later one at once."""
    from ojs_kombu.events.models import EventDraft

    bus, first, second, third = EventBus(), [], [], []
    later: list[Any] = []
    bus.subscribe(DraftTaker(first, fail=True, cancel=later))
    bus.subscribe(DraftTaker(second))
    later.append(bus.subscribe(DraftTaker(third)))
    draft = EventDraft("job.started", {"job_type": "email.send", "queue": "email",
                                       "worker_id": "w1", "attempt": 1},
                       source=BILLING, subject="job-1")
    with caplog.at_level(logging.ERROR, logger="ojs_kombu.events"):
        assert bus.publish_draft(draft) == 2
    assert first == [draft] and second == [draft] and third == []
    assert bus.failures == 1 and draft.id in caplog.records[-1].getMessage()


def test_a_plain_subscriber_beside_sinks_gets_the_built_event() -> None:
    """A filter or a plain callback next to the sinks: each gets what it asked for."""
    from ojs_kombu.events.models import EventDraft

    bus, drafts, events, filtered = EventBus(), [], [], []
    bus.subscribe(DraftTaker(drafts))
    bus.subscribe(events.append)
    bus.subscribe(DraftTaker(filtered), EventFilter(queues=["other"]))
    draft = EventDraft("job.started", {"job_type": "email.send", "queue": "email",
                                       "worker_id": "w1", "attempt": 1},
                       source=BILLING, subject="job-1")
    assert bus.publish_draft(draft) == 2
    assert drafts == [draft] and filtered == []
    assert isinstance(events[0], Event) and events[0].id == draft.id


def test_the_sinks_lane_follows_subscribing_and_cancelling() -> None:
    """A bus of sinks alone that gains a filtered sink honours its filter from the next
    draft on, and one that loses its plain subscriber hands the sinks drafts again."""
    from ojs_kombu.events.models import EventDraft

    def draft(queue: str) -> EventDraft:
        return EventDraft("job.started", {"job_type": "email.send", "queue": queue,
                                          "worker_id": "w1", "attempt": 1},
                          source=BILLING, subject="job-1")

    bus, sink, filtered, plain = EventBus(), [], [], []
    bus.subscribe(DraftTaker(sink))
    assert bus.publish_draft(draft("email")) == 1
    bus.subscribe(DraftTaker(filtered), EventFilter(queues=["other"]))
    assert bus.publish_draft(draft("email")) == 1 and filtered == []
    other = draft("other")
    assert bus.publish_draft(other) == 2 and filtered == [other]

    listener = bus.subscribe(plain.append)
    bus.publish_draft(draft("email"))
    assert isinstance(plain[-1], Event)
    listener.cancel()
    last = draft("email")
    assert bus.publish_draft(last) == 1 and sink[-1] is last and len(plain) == 1
