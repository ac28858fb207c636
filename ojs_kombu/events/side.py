"""Events outside the OJS event catalog (``backpressure.*``, ``connection.*``).

``event.schema.json`` enumerates the event types, so these are never handed
to the OJS sinks: they are built in the same envelope shape, as plain dicts,
for the subscribers whose filter names their type (``event_types=
["backpressure.*"]``; see docs/conformance.rst).  Pure code: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ..spec.times import format_time
from .models import new_event_id

#: Every out-of-catalog event type ojs_kombu emits.
SIDE_EVENT_TYPES: tuple[str, ...] = (
    "backpressure.warning", "backpressure.rejected", "backpressure.cleared",
    "backpressure.dropped", "connection.reconnected", "consumer.cancelled",
)


def side_event(event_type: str, source: str, subject: str | None,
               data: Mapping[str, Any]) -> dict[str, Any]:
    """One out-of-catalog event as an OJS-envelope dict (specversion, id, type, source,
    time, subject, data); ``None`` values of ``data`` are left out."""
    event: dict[str, Any] = {
        "specversion": "1.0", "id": new_event_id(), "type": event_type, "source": source,
        "time": format_time(datetime.now(UTC), precision="milliseconds"),
    }
    if subject is not None:
        event["subject"] = subject
    event["data"] = {k: v for k, v in data.items() if v is not None}
    return event
