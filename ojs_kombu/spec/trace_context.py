"""W3C trace context as an OJS job carries it (``traceparent``, AMQP-023).

A producer's ``traceparent`` travels whole in ``x-ojs-trace-id`` and
``meta.traceparent``; jobs and events also state its trace id alone
(``meta.trace_id``, the events' ``trace_id``, section 8.3), read here.
"""

from __future__ import annotations

import re
from typing import Any

_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")


def trace_id_of(traceparent: Any) -> str | None:
    """The trace id of a W3C ``traceparent``, or ``None`` for anything else."""
    match = _TRACEPARENT.match(traceparent) if isinstance(traceparent, str) else None
    return match.group(1) if match else None
