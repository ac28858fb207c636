"""RabbitMQ's 406 replies to a declaration that differs from the entity it holds.

Re-declaring an existing queue or exchange with other properties is refused
(406 PRECONDITION_FAILED), the reply naming the first property that differs and
its current value: ``inequivalent arg 'x-max-length' for queue 'q' in vhost 'v':
received none but current is the value '5' of type 'signedint'``.  The command
line converges on a queue's arguments with these replies
(:mod:`ojs_kombu.cli.broker`), and a job queue an earlier version declared with
``x-max-priority`` keeps it (:func:`kept_max_priority`).
"""

from __future__ import annotations

import re
from contextlib import suppress
from typing import Any

_INEQUIVALENT = re.compile(
    r"inequivalent arg '(?P<key>[^']+)' for (?P<kind>queue|exchange) '[^']*' in vhost '[^']*': "
    r"received (?P<received>none|the value '.*?' of type '\w+'|'.*?') "
    r"but current is (?P<current>none|the value '(?P<value>.*?)' of type '(?P<type>\w+)'|"
    r"'(?P<plain>.*?)')$")
_INTEGER_TYPES = ("signedint", "long", "short", "byte", "unsignedbyte", "unsignedshort",
                  "unsignedint", "timestamp")


def _parse_value(value: str, kind: str) -> Any:
    if kind in _INTEGER_TYPES:
        with suppress(ValueError):
            return int(value)
    if kind == "bool":
        return value == "true"
    if kind in ("double", "float"):
        with suppress(ValueError):
            return float(value)
    return value


def _match(reply: str) -> re.Match[str] | None:
    return _INEQUIVALENT.search(reply.split(" - ", 1)[-1].strip())


def parse_inequivalent(reply: str) -> tuple[str, Any] | None:
    """``(name, current value)`` from a 406 reply; the value is ``None`` for "none"."""
    match = _match(reply)
    if match is None:
        return None
    if match["current"] == "none":
        return match["key"], None
    if match["plain"] is not None:
        plain = match["plain"]
        return match["key"], (plain == "true") if plain in ("true", "false") else plain
    return match["key"], _parse_value(match["value"], match["type"])


def kept_max_priority(reply: str) -> int | None:
    """The ``x-max-priority`` of an existing queue that refused a declaration made
    without one (``received none but current is the value '10'``), else ``None``:
    the queue is a priority queue the app no longer asks for, as was every classic
    job queue earlier versions of ojs_kombu declared (``x-max-priority=10``).  A
    declaration that asked for another priority is a real conflict: ``None``."""
    match = _match(reply)
    if match is None or match["key"] != "x-max-priority" or match["received"] != "none":
        return None
    current = parse_inequivalent(reply)
    value = current[1] if current is not None else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None
