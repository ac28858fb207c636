"""Dead letters as RabbitMQ holds them in ``ojs.queue.dlx.email``, for the DLQ tests."""

from __future__ import annotations

import json
from typing import Any

from .in_memory_broker import Broker

JOB_QUEUE = "ojs.queue.email"
DLQ = "ojs.queue.dlx.email"
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def job_id(n: int) -> str:
    """A UUIDv7 job id, the ``n``-th of a test."""
    return f"0190b5a8-1234-7abc-8def-{n:012x}"


def failed_attempts(count: int) -> list[dict[str, Any]]:
    return [{"code": "HANDLER_ERROR", "message": f"SMTP timeout {n}", "type": "TimeoutError",
             "attempt": n, "occurred_at": f"2024-07-01T10:0{n}:00Z"}
            for n in range(1, count + 1)]


def put_dead_job(broker: Broker, n: int, *, job_type: str = "email.send", attempt: int = 3,
                 reason: str | None = "rejected", **headers: Any) -> str:
    """Job ``n`` dead-lettered after ``attempt`` attempts: nacked by its worker
    (``reason`` in ``x-death``) or, with ``reason=None``, republished with its error."""
    jid = job_id(n)
    envelope = {"specversion": "1.0", "id": jid, "type": job_type, "queue": "email",
                "args": [f"user{n}@example.com"], "attempt": attempt, "state": "discarded",
                "errors": failed_attempts(attempt - 1),
                "error": {"type": "TimeoutError", "message": f"SMTP timeout {attempt}"}}
    application_headers: dict[str, Any] = {
        "x-ojs-attempt": attempt, "x-ojs-error-code": "HANDLER_ERROR",
        "x-ojs-error-message": f"SMTP timeout {attempt - 1}", "x-ojs-trace-id": TRACE,
        **headers}
    if reason is not None:
        application_headers["x-death"] = [{"reason": reason, "queue": JOB_QUEUE, "count": 1,
                                           "exchange": "ojs.exchange.direct",
                                           "routing-keys": ["email"]}]
        application_headers["x-first-death-reason"] = reason
        application_headers["x-first-death-queue"] = JOB_QUEUE
    broker.declare(DLQ)
    broker.put(DLQ, json.dumps(envelope), message_id=jid, type=job_type,
               content_type="application/openjobspec+json", delivery_mode=2,
               application_headers=application_headers)
    return jid


def ids_in(broker: Broker, queue: str) -> list[str]:
    return [m.properties.get("message_id") for m in broker.messages(queue)]
