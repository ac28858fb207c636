"""Dramatiq's RabbitMQ broker as a publisher, for ``run.py``'s throughput table.

One :class:`DramatiqPublisher` per delivery mode (``confirm_delivery`` off or
on): a no-op actor on the run's own queue, sent to with ``actor.send`` exactly
as a Dramatiq user would, with Dramatiq's default middleware.  Nothing consumes
the queue; ``run.py`` purges it around every measurement and deletes it, with
the ``.DQ`` (delay) and ``.XQ`` (dead letter) queues Dramatiq declares next to
it, at the end.
"""

from __future__ import annotations

import time
from contextlib import suppress
from typing import Any

import dramatiq
import pika
from dramatiq.brokers.rabbitmq import RabbitmqBroker, dq_name, xq_name
from kombu.utils.url import parse_url

ACTOR_NAME = "bench_noop"


def queues_of(queue: str) -> list[str]:
    """Every queue Dramatiq declares for ``queue``."""
    return [queue, dq_name(queue), xq_name(queue)]


def _noop(*_args: Any) -> None:
    """Never runs: the benchmark only publishes."""


class DramatiqPublisher:
    """``actor.send`` on a ``RabbitmqBroker`` of its own (one connection, this thread's)."""

    def __init__(self, url: str, queue: str, *, confirm: bool) -> None:
        """``url``: the run's ``amqp://`` URL, read the way kombu reads it (pika takes
        ``amqp://host//`` as the empty vhost, kombu as ``/``)."""
        parts = parse_url(url)
        self.broker = RabbitmqBroker(
            host=parts.get("hostname") or "127.0.0.1", port=parts.get("port") or 5672,
            virtual_host=parts.get("virtual_host") or "/",
            credentials=pika.PlainCredentials(parts.get("userid") or "guest",
                                              parts.get("password") or "guest"),
            # No heartbeats: a BlockingConnection only answers them while it is in
            # use, and the broker dropped it (pika "Connection reset by peer", then a
            # reconnect inside a timed block) when the drains kept it idle for minutes.
            heartbeat=0, confirm_delivery=confirm)
        self.actor = dramatiq.actor(_noop, actor_name=ACTOR_NAME, queue_name=queue,
                                    broker=self.broker)

    def send(self, n: int, args: tuple[Any, ...]) -> list[float]:
        """``n`` sequential sends; each call's latency in seconds."""
        send, clock = self.actor.send, time.perf_counter
        latencies: list[float] = []
        for _ in range(n):
            started = clock()
            send(*args)
            latencies.append(clock() - started)
        return latencies

    def close(self) -> None:
        with suppress(Exception):
            self.broker.close()
