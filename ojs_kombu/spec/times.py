"""RFC 3339 timestamps: the one way ojs_kombu writes and reads an OJS time.

OJS jobs, control messages and events carry times as RFC 3339 strings in UTC
with ``Z`` (:func:`format_time`); whatever a producer sends is read back by
:func:`parse_time`.  Celery's own ``eta``/``expires`` headers keep Celery's
protocol v2 format, ``isoformat()`` with an offset (:func:`celery_time`).

Both run for every job published and consumed, so they use ``datetime``'s C
``isoformat``/``fromisoformat`` and skip the time zone conversion when the
value is in UTC already.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Literal

#: ``"auto"``: milliseconds, or microseconds when they are not zero (job timestamps).
#: ``"milliseconds"``: always milliseconds, the rest dropped (event timestamps).
Precision = Literal["auto", "milliseconds"]

# RFC 3339 section 5.6 date-time (``T``/``Z`` may be lowercase); the offset is mandatory.
_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[Zz]|[+-]\d{2}:\d{2})$"
)


def format_time(value: datetime, *, precision: Precision = "auto") -> str:
    """RFC 3339 in UTC with ``Z``, e.g. ``2026-11-21T10:00:00.000Z``.

    A naive ``value`` is taken as local time, as :meth:`datetime.astimezone` does.
    """
    if value.tzinfo is not UTC:
        value = value.astimezone(UTC)
    # ``isoformat()`` without ``timespec`` is the fastest: "YYYY-MM-DDTHH:MM:SS" (19
    # characters), then ".ffffff" unless the microseconds are zero, then the offset.
    text = value.isoformat()
    micro = value.microsecond
    if not micro:
        return text[:19] + ".000Z"
    if precision == "milliseconds" or not micro % 1000:
        return text[:23] + "Z"
    return text[:26] + "Z"


#: ``(second, "YYYY-MM-DDTHH:MM:SS")`` of the last second :func:`format_milliseconds`
#: formatted.
_last_second: tuple[int, str] = (-1, "")


def format_milliseconds(milliseconds: int) -> str:
    """:func:`format_time` (``precision="milliseconds"``) of a time given in milliseconds
    since the epoch, as an event draft holds it.

    An event sink writes thousands of events per second, nearly all within the second
    before, so that second's text is formatted once and only the milliseconds change.
    """
    global _last_second
    second, millis = divmod(milliseconds, 1000)
    cached = _last_second
    if cached[0] != second:
        cached = _last_second = (second, format_time(datetime.fromtimestamp(second, UTC))[:19])
    return f"{cached[1]}.{millis:03d}Z"


def parse_time(value: str | datetime, *, offset_required: bool = False) -> datetime:
    """An aware datetime of an ISO 8601 string or of a datetime; :class:`ValueError`
    (or :class:`TypeError` for another type) otherwise.

    A naive value means UTC: Celery writes a naive ``eta`` for a naive datetime, and
    another producer's header may lack the offset.  ``offset_required`` takes only
    RFC 3339 date-times with an offset and aware datetimes: what an event's
    timestamps must be (``event.schema.json``'s ``date-time``).
    """
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            return value
        if offset_required:
            raise ValueError("naive datetime: events need an aware (UTC) timestamp")
        return value.replace(tzinfo=UTC)
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not a timestamp string")
    text = value
    if offset_required:
        if _RFC3339.match(value) is None:
            raise ValueError(f"{value!r} is not an RFC 3339 timestamp with a UTC offset")
        text = value.upper()
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(f"{value!r} is not a valid timestamp ({exc})") from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def celery_time(value: datetime | None) -> str | None:
    """Celery protocol v2's ``eta``/``expires`` header: ``isoformat()``, offset included."""
    return value.isoformat() if value is not None else None
