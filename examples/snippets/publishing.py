"""docs/mapping.rst: batch enqueue."""

from __future__ import annotations

from typing import Any

from celery import Celery, group

import ojs_kombu


def batch(app: Celery, send_email: Any, resize: Any, images: list[str]) -> list[Any]:
    # [batch]
    results = ojs_kombu.enqueue_many(app, [
        send_email.s("a@example.com", "welcome"),
        send_email.s("b@example.com", "reset").set(priority=9, countdown=60),
        group(resize.s(image) for image in images),          # flattened
        ("reports.build", ["2026-11"], {"fmt": "pdf"}, {"queue": "reports"}),
    ])
    # [/batch]
    return results


def batch_refused(app: Celery, jobs: list[Any]) -> list[str]:
    resend: list[str] = []
    # [batch-refused]
    try:
        ojs_kombu.enqueue_many(app, jobs)
    except ojs_kombu.BatchPublishError as exc:  # BatchQueueFullError included
        resend = list(exc.rejected)             # ids, in batch order
    # [/batch-refused]
    return resend


def queue_full(send_email: Any, args: tuple[Any, ...], http_429: Any) -> Any:
    # [queue-full]
    try:
        send_email.apply_async(args, queue="email")
    except ojs_kombu.QueueFullError as full:
        return http_429(retry_after=full.retry_after, depth=full.depth, bound=full.bound)
    # [/queue-full]
    return None
