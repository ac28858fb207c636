"""``celery -A integration.fallbackapp worker``: an app on a py-amqp whose private hooks
changed, as a new release could change them (integration/test_seam_fallback.py).

Before ojs_kombu is imported, py-amqp's ``TCPTransport._read`` loses a parameter and
``Channel._on_basic_deliver`` renames one: ojs_kombu must then read frames with
py-amqp's own reader and ack each delivery at once, warn once each, and lose nothing.
"""

from __future__ import annotations

import os
from typing import Any

import amqp
import amqp.transport

_read = amqp.transport.TCPTransport._read
_on_basic_deliver = amqp.Channel._on_basic_deliver


def _changed_read(self: Any, n: int, initial: bool = False) -> bytes:
    return _read(self, n, initial)


def _changed_deliver(self: Any, consumer_tag: str, delivery_tag: int, redelivered: bool,
                     exchange: str, routing_key: str, message: Any) -> None:
    _on_basic_deliver(self, consumer_tag, delivery_tag, redelivered, exchange, routing_key,
                      message)


amqp.transport.TCPTransport._read = _changed_read
amqp.Channel._on_basic_deliver = _changed_deliver

import redis  # noqa: E402
from celery import Celery  # noqa: E402

import ojs_kombu  # noqa: E402

app = Celery("fallback", broker=os.environ["OJS_TEST_BROKER_URL"], set_as_current=False)
ojs_kombu.install(app)
app.conf.update(broker_connection_retry_on_startup=False, worker_hijack_root_logger=False,
                task_acks_late=True, worker_prefetch_multiplier=50)
_runs = redis.Redis.from_url(os.environ.get("OJS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"))


@app.task(name="fallback.count")
def count(key: str, n: int) -> int:
    """Each run appends its ``n`` to a Redis list: duplicates and losses both show."""
    return _runs.rpush(key, n)
