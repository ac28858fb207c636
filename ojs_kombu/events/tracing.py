"""W3C trace context on OJS jobs (AMQP-023, events spec section 8).

The producer's context travels in ``x-ojs-trace-id`` (``traceparent``),
``x-ojs-trace-state`` and ``meta.traceparent``/``meta.trace_id``; the consumer
hands it back to Celery as the ``traceparent`` header, where
``opentelemetry-instrumentation-celery`` continues the trace.  Spans are the
instrumentation's (``apply_async/{task}`` PRODUCER, ``run/{task}`` CONSUMER).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import propagate, trace


def with_current_trace(headers: Mapping[str, Any]) -> Mapping[str, Any]:
    """``headers`` plus the active span's ``traceparent``/``tracestate``, if there is one."""
    if not trace.get_current_span().get_span_context().is_valid:
        return headers
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    if "traceparent" not in carrier:
        return headers
    return {**headers, **{k: v for k, v in carrier.items() if k in ("traceparent", "tracestate")}}
