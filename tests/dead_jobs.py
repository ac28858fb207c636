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


def put_task_id_dead_letters(broker: Broker) -> dict[int, str]:
    """Jobs 1 and 2, dead, whose callers chose their Celery task ids (``x_celery.id``):
    ``{n: task id}``."""
    task_ids = {1: "order-999-validate", 2: "6f1d2c6e-1b7e-4a43-9f0e-0d7a54f1c2b1"}
    broker.declare(DLQ)
    for n, task_id in task_ids.items():
        envelope = {"specversion": "1.0", "id": job_id(n), "type": "shop.validate",
                    "args": [], "x_celery": {"id": task_id}}
        broker.put(DLQ, json.dumps(envelope), message_id=job_id(n),
                   content_type="application/openjobspec+json")
    return task_ids


def ids_in(broker: Broker, queue: str) -> list[str]:
    return [m.properties.get("message_id") for m in broker.messages(queue)]


def hostile_dead_letters() -> dict[str, tuple[bytes, dict[str, Any]]]:
    """Dead letters no OJS worker wrote, by name: body and properties, as another
    producer or an attacker can leave them in a DLQ."""
    deep = b"[" * 100_000 + b"]" * 100_000
    envelope = {"specversion": "1.0", "id": job_id(60), "type": "email.send",
                "queue": "email", "args": []}
    nested_300 = {**envelope, "id": job_id(61), "args": [json.loads("[" * 300 + "]" * 300)]}
    huge = {**envelope, "id": job_id(62), "args": ["x" * 8_000_000]}
    ojs = "application/openjobspec+json"
    return {
        "deep, no id": (deep, {"content_type": ojs}),
        "deep, with id": (deep, {"content_type": ojs, "message_id": job_id(63)}),
        "nested 300 deep": (json.dumps(nested_300).encode(),
                            {"content_type": ojs, "message_id": job_id(61)}),
        "huge": (json.dumps(huge).encode(), {"content_type": ojs, "message_id": job_id(62)}),
        "no message_id": (json.dumps({k: v for k, v in envelope.items() if k != "id"})
                          .encode(), {"content_type": ojs}),
        "not UTF-8": (b"\xff\xfe\x00garbage", {"content_type": ojs}),
        "not JSON": (b"{this is not json", {"content_type": ojs, "message_id": "m-1"}),
        "empty": (b"", {}),
        "JSON array": (b"[1, 2, 3]", {"content_type": ojs}),
        "wrong content type": (json.dumps({**envelope, "id": job_id(64)}).encode(),
                               {"content_type": "application/x-python-serialize",
                                "message_id": job_id(64)}),
        "odd headers": (b"<xml/>", {"content_type": "text/xml", "application_headers": {
            "x-death": "not a list", "x-ojs-attempt": "three", "x-ojs-error-code": b"BYTES",
            "x-ojs-queue": 42}}),
        "unprintable message_id": (b"{}", {"content_type": ojs, "message_id": "a\x00b"}),
    }
