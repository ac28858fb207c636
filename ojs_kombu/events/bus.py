"""In-process event delivery with the section 6.1 filter model.

Pure code: no I/O.  :class:`EventBus` hands each published event to every
matching subscriber, synchronously and in subscription order, so a single
publisher's events reach a subscriber in lifecycle order (section 9.2).  A
subscriber that raises is logged and counted, never allowed to stop delivery
to the others or to fail the job whose lifecycle it observes: the bus is
best-effort (section 9.1).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Annotated, Any, cast

from pydantic import BaseModel, ConfigDict, StringConstraints, field_validator

from ..spec.job_ids import new_job_id
from .models import EVENT_TYPES, Event, EventDraft
from .side import SIDE_EVENT_TYPES

logger = logging.getLogger("ojs_kombu.events")

Callback = Callable[[Event], object]
_Item = Annotated[str, StringConstraints(min_length=1)]


def _check_patterns(patterns: list[str] | None, field: str) -> list[str] | None:
    for pattern in patterns or ():
        if "*" in pattern[:-1]:
            raise ValueError(
                f"{field} pattern {pattern!r}: '*' is only allowed at the end (prefix match)"
            )
    return patterns


def _matches_pattern(patterns: Sequence[str] | None, value: str) -> bool:
    if not patterns:
        return True
    return any(
        value.startswith(p[:-1]) if p.endswith("*") else value == p for p in patterns
    )


class EventFilter(BaseModel):
    """Which events a subscriber gets (section 6.1).

    Dimensions combine with AND, the values of one dimension with OR, and an
    empty or absent dimension matches everything.  ``event_types`` and
    ``sources`` take a trailing ``*`` as a prefix match (``job.*``,
    ``ojs://billing-api/*``; ``*`` alone is everything).  ``queues`` and
    ``job_types`` compare exactly with ``data.queue`` / ``data.job_type``; an
    event without that field (``worker.*``, ``workflow.*``) does not match a
    non-empty one.

    Out-of-catalog events (``backpressure.*``, ``connection.reconnected``,
    ``consumer.cancelled``: plain dicts) reach only a filter whose
    ``event_types`` names them (``*`` alone does not), so a sink that expects
    catalog events never gets one.
    """

    model_config = ConfigDict(defer_build=True, strict=True, extra="forbid", frozen=True)

    event_types: list[_Item] | None = None
    queues: list[_Item] | None = None
    job_types: list[_Item] | None = None
    sources: list[_Item] | None = None

    @field_validator("event_types")
    @classmethod
    def _known_event_types(cls, value: list[str] | None) -> list[str] | None:
        # A misspelt type would silently match nothing, so refuse it here.
        for pattern in _check_patterns(value, "event_types") or ():
            if not any(_matches_pattern([pattern], t) for t in EVENT_TYPES + SIDE_EVENT_TYPES):
                raise ValueError(f"event_types {pattern!r} matches no OJS event type")
        return value

    @field_validator("sources")
    @classmethod
    def _source_patterns(cls, value: list[str] | None) -> list[str] | None:
        return _check_patterns(value, "sources")

    def names_side(self, event_type: str) -> bool:
        """Whether out-of-catalog events of ``event_type`` are asked for."""
        return any(p != "*" and _matches_pattern([p], event_type)
                   for p in self.event_types or ())

    def matches_side(self, event: dict[str, Any]) -> bool:
        data = event["data"]
        return (
            self.names_side(event["type"])
            and (not self.queues or data.get("queue") in self.queues)
            and (not self.job_types or data.get("job_type") in self.job_types)
            and _matches_pattern(self.sources, event["source"])
        )

    def matches(self, event: Event | EventDraft) -> bool:
        data = event.data
        return (
            _matches_pattern(self.event_types, event.type)
            and (not self.queues or data.get("queue") in self.queues)
            and (not self.job_types or data.get("job_type") in self.job_types)
            and _matches_pattern(self.sources, event.source)
        )


class Subscription:
    """A subscriber's registration; :meth:`cancel` ends delivery to it."""

    __slots__ = ("_bus", "active", "callback", "filter", "id")

    def __init__(self, bus: EventBus, callback: Callback, filter: EventFilter | None) -> None:
        self._bus = bus
        #: ``sub_`` + UUIDv7, as section 6.2's subscription ids.
        self.id = "sub_" + new_job_id()
        self.callback = callback
        self.filter = filter
        self.active = True

    def cancel(self) -> None:
        """Stop delivery (also of an event being published right now); idempotent."""
        self._bus._remove(self)

    def wants(self, event: Event | EventDraft) -> bool:
        return self.active and (self.filter is None or self.filter.matches(event))

    def __repr__(self) -> str:
        return f"<Subscription {self.id} {self.callback!r} active={self.active}>"


class EventBus:
    """Synchronous in-process publish/subscribe; thread-safe.

    Subscribing and cancelling swap an immutable tuple under a lock, so
    :meth:`publish` reads a snapshot without locking and a callback may itself
    subscribe or cancel.  Only :class:`Exception` is contained: ``KeyboardInterrupt``
    and ``SystemExit`` still propagate.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscriptions: tuple[Subscription, ...] = ()
        #: How many subscriber calls raised, over the bus's lifetime.
        self.failures = 0

    def subscribe(self, callback: Callback, filter: EventFilter | None = None) -> Subscription:
        if not callable(callback):
            raise TypeError(f"event subscriber must be callable, got {callback!r}")
        subscription = Subscription(self, callback, filter)
        with self._lock:
            self._subscriptions = (*self._subscriptions, subscription)
        return subscription

    def _remove(self, subscription: Subscription) -> None:
        with self._lock:
            subscription.active = False
            self._subscriptions = tuple(s for s in self._subscriptions if s is not subscription)

    @property
    def subscriptions(self) -> tuple[Subscription, ...]:
        return self._subscriptions

    def __len__(self) -> int:
        return len(self._subscriptions)

    def publish(self, event: Event) -> int:
        """Call every matching subscriber in subscription order; return how many were called."""
        return self._deliver(event, None)

    def publish_draft(self, draft: EventDraft) -> int:
        """As :meth:`publish`, for an event still in its draft form.

        Subscribers that take drafts (the background sinks, which serialise it
        on their own thread) get the draft; every other subscriber gets the
        :class:`Event`, built once, synchronously as with :meth:`publish`.
        """
        return self._deliver(None, draft)

    def wants_side(self, event_type: str) -> bool:
        """Whether a subscriber asked for out-of-catalog events of ``event_type``."""
        return any(s.filter is not None and s.filter.names_side(event_type)
                   for s in self._subscriptions)

    def publish_side(self, event: dict[str, Any]) -> int:
        """Hand an out-of-catalog event (an OJS-envelope dict) to the subscribers whose
        filter names its type; return how many were called."""
        called = 0
        for subscription in self._subscriptions:
            flt = subscription.filter
            if not subscription.active or flt is None or not flt.matches_side(event):
                continue
            called += 1
            # a side filter is the subscriber's word that it takes envelope dicts
            side_callback = cast(Callable[[dict[str, Any]], object], subscription.callback)
            try:
                side_callback(event)
            except Exception:
                with self._lock:
                    self.failures += 1
                logger.exception("event subscriber %r failed on %s event %s",
                                 subscription.callback, event["type"], event["id"])
        return called

    def _deliver(self, event: Event | None, draft: EventDraft | None) -> int:
        called = 0
        subject: Any = event if draft is None else draft
        for subscription in self._subscriptions:
            if not subscription.wants(subject):
                continue
            called += 1
            callback = subscription.callback
            try:
                if draft is None:  # then the event is given
                    callback(cast(Event, event))
                elif getattr(callback, "takes_drafts", False):  # a sink's word it takes drafts
                    cast(Callable[[EventDraft], object], callback)(draft)
                else:
                    callback(draft.event())
            except Exception:
                self._failed(callback, subject)
        return called

    def _failed(self, callback: Callback, event: Event | EventDraft) -> None:
        with self._lock:
            self.failures += 1
        logger.exception("event subscriber %r failed on %s event %s", callback, event.type,
                         event.id)
