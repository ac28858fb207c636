"""Raw py-amqp publisher of the throughput part: the broker's ceiling for an OJS job.

It republishes one job ojs_kombu published (its body and every property and
``x-ojs-*`` header, read back from the queue) into the same job queue through
``ojs.exchange.direct`` with ``mandatory``, either in batches with pipelined
publisher confirms, each batch waiting for all of its confirms, as
``enqueue_many`` does, or one message at a time, each waiting for its
confirm, as a confirmed ``apply_async`` does (batches of one).  What it
leaves out is everything ojs_kombu and Celery do per job: ids, timestamps,
the envelope, the JSON, the signature.  So its rate is what this broker takes
of this message with every job confirmed, and ``enqueue_many`` (or
``apply_async``) over it is the share ojs_kombu keeps of that ceiling.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

import amqp
from sides import TASK_ARGS, Side, connect

if TYPE_CHECKING:
    from admin import Broker


class ConfirmChannel:
    """A channel in confirm mode on ``connection`` (the connection is its own, closed with
    it) that counts what it published, what the broker confirmed and what the broker
    refused (nacked or returned).  The raw side's publishers, here and in the storm
    (``storm_messages.PipelinedPublisher``), are built on it."""

    def __init__(self, connection: amqp.Connection) -> None:
        self.connection = connection
        self.channel = connection.channel()
        self.channel.confirm_select()
        self.published = self.confirmed = self.refused = 0
        self.channel.events["basic_ack"].add(self._on_ack)
        self.channel.events["basic_nack"].add(self._on_nack)
        self.channel.events["basic_return"].add(self._on_return)

    def _on_ack(self, delivery_tag: int, multiple: bool) -> None:
        self.confirmed = max(self.confirmed, delivery_tag)

    def _on_nack(self, delivery_tag: int, multiple: bool) -> None:
        self.refused += 1
        self._on_ack(delivery_tag, multiple)

    def _on_return(self, *_args: Any) -> None:
        self.refused += 1

    def close(self) -> None:
        with suppress(Exception):
            self.connection.close()


class RawConfirmPublisher(ConfirmChannel):
    """A :class:`ConfirmChannel` publishing a fixed message."""

    def __init__(self, connection: amqp.Connection, exchange: str, routing_key: str,
                 body: bytes, properties: dict[str, Any]) -> None:
        super().__init__(connection)
        self.exchange, self.routing_key = exchange, routing_key
        self.body, self.properties = body, properties

    def send(self, n: int, size: int) -> list[float]:
        """``n`` messages in batches of ``size`` (1: each waits for its own confirm); each
        batch's latency in seconds.

        A new ``amqp.Message`` per publish, as any client builds one per job.
        """
        publish, Message = self.channel.basic_publish, amqp.Message
        body, properties = self.body, self.properties
        exchange, key, clock = self.exchange, self.routing_key, time.perf_counter
        latencies: list[float] = []
        for done in range(0, n, size):
            started = clock()
            for _ in range(min(size, n - done)):
                publish(Message(body, **properties), exchange, key, mandatory=True)
                self.published += 1
            while self.confirmed < self.published:
                self.connection.drain_events(timeout=30)
            latencies.append(clock() - started)
        self.raise_if_refused()
        return latencies

    def raise_if_refused(self) -> None:
        """A publisher that the broker refused a message (nack or return) is no ceiling."""
        if self.refused:
            raise RuntimeError(f"raw py-amqp publisher: {self.refused} message(s) "
                               "refused or returned by the broker")


@contextmanager
def raw_publisher(broker: Broker, broker_url: str, ojs: Side) -> Iterator[RawConfirmPublisher]:
    """A raw py-amqp publisher of a copy of one ``ojs`` job (read back from its queue)."""
    broker.purge(ojs.amqp_queue)
    ojs.task.apply_async(TASK_ARGS)
    message = broker.channel.basic_get(ojs.amqp_queue, no_ack=True)
    if message is None:
        raise RuntimeError(f"{ojs.label}: the job published for the raw publisher is not "
                           f"in {ojs.amqp_queue}")
    names = ojs.app.amqp.binding.names
    body = message.body  # py-amqp decodes a body that declares its content_encoding
    if isinstance(body, str):
        body = body.encode(message.properties.get("content_encoding") or "utf-8")
    publisher = RawConfirmPublisher(connect(broker_url), names.direct_exchange,
                                    ojs.celery_queue, bytes(body), dict(message.properties))
    try:
        yield publisher
    finally:
        publisher.close()


def raw_drain(broker_url: str, queue: str, n: int, prefetch: int,
              timeout: float = 600.0) -> dict[str, float]:
    """Drain ``n`` Celery jobs from ``queue`` with a raw py-amqp consumer doing the worker's
    loop and nothing else: each delivery's body decoded (Celery's protocol v2 JSON), the
    no-op called, then ``Basic.Ack`` (after the job, as ``task_acks_late``), at
    ``prefetch``.  What a worker of one process could reach on this broker: the drains'
    ceiling.  Jobs/s from the first delivery to the last ack, and the CPU of the loop's
    thread per delivery."""
    connection = connect(broker_url)
    channel = connection.channel()
    channel.basic_qos(0, prefetch, False)
    done = {"n": 0, "first": 0.0, "cpu": 0.0}

    def noop(*_args: Any) -> None:
        return None

    def on_message(message: amqp.Message) -> None:
        if not done["n"]:
            done["first"], done["cpu"] = time.perf_counter(), time.thread_time()
        args, kwargs, _embed = json.loads(message.body)
        noop(*args, **kwargs)
        channel.basic_ack(message.delivery_tag)
        done["n"] += 1

    channel.basic_consume(queue, callback=on_message)
    deadline = time.monotonic() + timeout
    try:
        while done["n"] < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"raw drain: {done['n']} of {n} jobs after {timeout} s")
            connection.drain_events(timeout=1)
        seconds, cpu = time.perf_counter() - done["first"], time.thread_time() - done["cpu"]
    finally:
        with suppress(Exception):
            connection.close()
    return {"main_cpu_us_per_delivery": round(cpu * 1e6 / n, 1),
            "jobs_per_s": round(n / seconds, 1)}
