"""Events outside the OJS event catalog (``backpressure.*``, ``connection.*``).

``event.schema.json`` enumerates the event types, so these are never handed
to the OJS sinks: they are built in the same envelope shape, as plain dicts,
and delivered to the callbacks subscribed here (see docs/conformance.rst).
Pure code: no I/O.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from ..spec.times import format_time
from .models import new_event_id

logger = logging.getLogger("ojs_kombu.events")

SideEventCallback = Callable[[dict[str, Any]], Any]


class SideEvents:
    """Subscribers of one family of out-of-catalog events, and their delivery."""

    def __init__(self, family: str) -> None:
        self.family = family
        self._lock = threading.Lock()
        self._subscribers: tuple[SideEventCallback, ...] = ()

    def subscribe(self, callback: SideEventCallback) -> Callable[[], None]:
        """Call ``callback(event)`` with every event of this family (an OJS-envelope dict:
        specversion, id, type, source, time, subject, data); returns a function that
        unsubscribes."""
        with self._lock:
            self._subscribers = (*self._subscribers, callback)

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers = tuple(s for s in self._subscribers if s is not callback)
        return unsubscribe

    def emit(self, event_type: str, source: str, subject: str | None,
             data: Mapping[str, Any]) -> dict[str, Any]:
        """Hand one event to every subscriber (one that raises is logged, never fatal)."""
        now = datetime.now(UTC)
        event: dict[str, Any] = {
            "specversion": "1.0", "id": new_event_id(), "type": event_type, "source": source,
            "time": format_time(now, precision="milliseconds"),
        }
        if subject is not None:
            event["subject"] = subject
        event["data"] = dict(data)
        for callback in self._subscribers:
            try:
                callback(event)
            except Exception:
                logger.exception("%s subscriber %r failed on %s", self.family, callback,
                                 event_type)
        return event
