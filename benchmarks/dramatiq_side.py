"""Dramatiq's RabbitMQ broker as a publisher, for the throughput table (``throughput.py``)
and the latency and publish phase parts; and the one place a Dramatiq broker is built
(:func:`dramatiq_broker`, also for the worker module ``dramatiq_worker_app.py``).

One :class:`DramatiqPublisher` per delivery mode (``confirm_delivery`` off or
on): a no-op actor on the run's own queue, sent to with ``actor.send`` exactly
as a Dramatiq user would, with Dramatiq's default middleware.  Nothing consumes
the queue; the part purges it around every measurement and deletes it, with
the ``.DQ`` (delay) and ``.XQ`` (dead letter) queues Dramatiq declares next to
it, at the end.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

import dramatiq
import pika
from dramatiq.brokers.rabbitmq import RabbitmqBroker, dq_name, xq_name
from kombu.utils.url import parse_url

if TYPE_CHECKING:
    from admin import Broker

ACTOR_NAME = "bench_noop"


def dramatiq_broker(url: str, *, confirm: bool = False,
                    publisher: bool = False) -> RabbitmqBroker:
    """Dramatiq's ``RabbitmqBroker`` on ``url``, read the way kombu reads it (pika takes
    ``amqp://host//`` as the empty vhost, kombu as ``/``); ``confirm``:
    ``confirm_delivery``.

    A ``publisher`` has no heartbeats: a BlockingConnection only answers them while
    it is in use, and the broker dropped it (pika "Connection reset by peer", then a
    reconnect inside a timed block) when the drains kept it idle for minutes.
    """
    parts = parse_url(url)
    options: dict[str, Any] = {"heartbeat": 0} if publisher else {}
    return RabbitmqBroker(
        host=parts.get("hostname") or "127.0.0.1", port=parts.get("port") or 5672,
        virtual_host=parts.get("virtual_host") or "/",
        credentials=pika.PlainCredentials(parts.get("userid") or "guest",
                                          parts.get("password") or "guest"),
        confirm_delivery=confirm, **options)


def queues_of(queue: str) -> list[str]:
    """Every queue Dramatiq declares for ``queue``."""
    return [queue, dq_name(queue), xq_name(queue)]


def _noop(*_args: Any) -> None:
    """Never runs: the benchmark only publishes."""


class DramatiqPublisher:
    """``actor.send`` on a ``RabbitmqBroker`` of its own (one connection, this thread's)."""

    def __init__(self, url: str, queue: str, *, confirm: bool) -> None:
        """``url``: the run's ``amqp://`` URL (:func:`dramatiq_broker`)."""
        self.broker = dramatiq_broker(url, confirm=confirm, publisher=True)
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


@contextmanager
def dramatiq_publishers(broker: Broker, broker_url: str, queue: str
                        ) -> Iterator[tuple[DramatiqPublisher, DramatiqPublisher]]:
    """Dramatiq without and with ``confirm_delivery`` on ``queue``; on exit their
    connections close and the queue, its ``.DQ`` and its ``.XQ`` are deleted."""
    made: list[DramatiqPublisher] = []
    try:
        made.append(DramatiqPublisher(broker_url, queue, confirm=False))
        made.append(DramatiqPublisher(broker_url, queue, confirm=True))
        yield made[0], made[1]
    finally:
        for publisher in made:
            publisher.close()
        broker.delete(queues_of(queue), [])
