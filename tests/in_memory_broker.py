"""RabbitMQ in memory, as the dead-letter queue and the command line use it (no broker).

:class:`Broker` holds queues and the OJS bindings of ``ojs.exchange.direct``
and ``ojs.exchange.dlx``; :meth:`Broker.connection` is a kombu connection on
the ``ojs://`` transport whose py-amqp connection and channels are replaced by
in-memory ones answering the calls ojs_kombu makes, the way RabbitMQ answers
them:

* a passive ``Queue.Declare`` of a missing queue raises ``NotFound`` (404) and
  closes the channel; otherwise it gives the ready messages and consumers;
* ``Basic.Get`` hands out messages in order; unacknowledged ones go back to
  the head of their queue, in order and marked redelivered, when the channel
  closes; ``Basic.Ack`` removes them for good;
* a publish is routed by exchange and routing key (an encoded job, through
  ``ojs.exchange.direct`` to its queue); a confirmed publish to a
  broker told to refuse (:attr:`Broker.nack_publishes`) raises py-amqp's
  ``MessageNacked`` and enqueues nothing;
* a control message reaching a control queue is answered by
  :attr:`Broker.worker` (a worker of that queue), onto its ``reply_to`` queue.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import amqp
import kombu
from amqp.exceptions import MessageNacked, NotFound
from amqp.protocol import queue_declare_ok_t

from ojs_kombu.amqp.binding import Binding
from ojs_kombu.cli.config import Options
from ojs_kombu.spec.encode import OutgoingJob
from ojs_kombu.transport import Transport

#: ``(control message type, body) -> answer``; ``None``: the worker does not answer.
Worker = Callable[[str, dict[str, Any]], dict[str, Any] | None]


@dataclass
class Stored:
    """A message in a queue: what the broker keeps of a publish."""

    body: bytes
    properties: dict[str, Any]
    exchange: str = ""
    routing_key: str = ""
    redelivered: bool = False

    def message(self, **delivery_info: Any) -> amqp.Message:
        properties = {**self.properties,
                      "application_headers": dict(self.properties.get("application_headers")
                                                  or {})}
        message = amqp.Message(self.body, **properties)
        message.delivery_info = {"exchange": self.exchange, "routing_key": self.routing_key,
                                 "redelivered": self.redelivered, **delivery_info}
        return message


@dataclass
class Broker:
    """Queues, bindings and what was published, in order."""

    queues: dict[str, deque[Stored]] = field(default_factory=dict)
    #: ``(exchange, routing key) -> queue``
    routes: dict[tuple[str, str], str] = field(default_factory=dict)
    #: consumers of a queue in other processes (a worker on its control queue)
    consumers: dict[str, int] = field(default_factory=dict)
    #: every message routed by a publish, in order
    published: list[Stored] = field(default_factory=list)
    nack_publishes: bool = False
    worker: Worker | None = None
    #: called after each routed publish (to interrupt a command between two jobs, say)
    after_publish: Callable[[Stored], None] | None = None
    connections_opened: int = 0

    def connection(self, url: str = "ojs://guest:guest@in-memory//",
                   transport_options: dict[str, Any] | None = None) -> kombu.Connection:
        """An unconnected kombu connection to this broker on the ``ojs://`` transport."""
        transport = type("InMemoryTransport", (InMemoryTransport,), {"broker": self})
        return kombu.Connection(url, transport=transport,
                                transport_options=transport_options or {})

    def declare(self, queue: str) -> None:
        self.queues.setdefault(queue, deque())

    def bind(self, queue: str, exchange: str, routing_key: str) -> None:
        self.routes[(exchange, routing_key)] = queue

    def put(self, queue: str, body: bytes | str, **properties: Any) -> None:
        """A message already in ``queue`` (dead-lettered earlier, say)."""
        body = body.encode() if isinstance(body, str) else body
        self.queues[queue].append(Stored(body, properties, routing_key=queue))

    def messages(self, queue: str) -> list[amqp.Message]:
        """What ``queue`` holds now, head first (nothing is taken)."""
        return [stored.message() for stored in self.queues.get(queue, ())]

    def route(self, message: amqp.Message, exchange: str, routing_key: str) -> None:
        queue = self.routes.get((exchange, routing_key)) if exchange else routing_key
        if queue is None or queue not in self.queues:
            raise AssertionError(f"unroutable: {exchange!r} {routing_key!r}")
        stored = Stored(bytes(message.body), dict(message.properties), exchange, routing_key)
        self.published.append(stored)
        self.queues[queue].append(stored)
        self._answer_control(stored)
        if self.after_publish is not None:
            self.after_publish(stored)

    def _answer_control(self, stored: Stored) -> None:
        kind = str(stored.properties.get("type") or "")
        reply_to = stored.properties.get("reply_to")
        if self.worker is None or not kind.startswith("ojs.control."):
            return
        answer = self.worker(kind, json.loads(stored.body))
        if answer is not None and reply_to:
            self.put(reply_to, json.dumps(answer),
                     correlation_id=stored.properties.get("correlation_id"))


class BrokerChannel:
    """A py-amqp channel on :class:`Broker`."""

    def __init__(self, connection: BrokerConnection) -> None:
        self.connection = connection
        self.broker = connection.broker
        self.is_open = True
        self._tags = itertools.count(1)
        #: delivery tag -> (queue, message) handed out and not yet acked
        self.unacked: dict[int, tuple[str, Stored]] = {}
        self.consumers: dict[str, tuple[str, Callable[[amqp.Message], Any]]] = {}
        self.acked_consumers: set[str] = set()
        self.prefetch = 0

    def queue_declare(self, queue: str = "", passive: bool = False, durable: bool = False,
                      exclusive: bool = False, auto_delete: bool = False,
                      arguments: dict[str, Any] | None = None, **_: Any) -> queue_declare_ok_t:
        if passive and queue not in self.broker.queues:
            self.is_open = False
            raise NotFound(reply_text=f"NOT_FOUND - no queue '{queue}' in vhost '/'",
                           reply_code=404)
        if not queue:
            queue = f"amq.gen-{next(self._tags)}"
        self.broker.declare(queue)
        own = sum(name == queue for name, _ in self.consumers.values())
        return queue_declare_ok_t(queue, len(self.broker.queues[queue]),
                                  self.broker.consumers.get(queue, 0) + own)

    def basic_get(self, queue: str = "", no_ack: bool = False) -> amqp.Message | None:
        waiting = self.broker.queues[queue]
        if not waiting:
            return None
        stored = waiting.popleft()
        tag = next(self._tags)
        if not no_ack:
            self.unacked[tag] = (queue, stored)
        return stored.message(delivery_tag=tag, message_count=len(waiting))

    def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
        for tag in [t for t in self.unacked if t <= delivery_tag] if multiple \
                else [delivery_tag]:
            del self.unacked[tag]

    def basic_qos(self, prefetch_size: int, prefetch_count: int, a_global: bool) -> None:
        self.prefetch = prefetch_count

    def basic_cancel(self, consumer_tag: str) -> None:
        self.consumers.pop(consumer_tag, None)

    def publish_many_confirmed(self, messages: list[tuple[amqp.Message, str, str]],
                               confirm_timeout: float | None = None, *,
                               mandatory: bool = False,
                               replaces: Any = None) -> list[bool]:
        if self.broker.nack_publishes:
            return [False] * len(messages)
        for message, exchange, routing_key in messages:
            self.broker.route(message, exchange, routing_key)
        for delivery_tag in replaces or ():  # acked once its copy is confirmed
            self.basic_ack(delivery_tag)
        return [True] * len(messages)

    def basic_publish(self, msg: amqp.Message, exchange: str = "", routing_key: str = "",
                      mandatory: bool = False, **_: Any) -> None:
        self.broker.route(msg, exchange, routing_key)

    def publish_job(self, job: OutgoingJob, *, timeout: float | None = None,
                    confirm_timeout: float | None = None) -> None:
        """A job due now goes to its queue through ``ojs.exchange.direct``; one due later
        is only recorded in :attr:`Broker.published` (the schedule is not modelled)."""
        self.connection.ensure_topology(job.queue)
        message = amqp.Message(job.body, **job.properties)
        exchange = self.connection.ojs.names.direct_exchange
        if job.delay_ms > 0:
            self.broker.published.append(Stored(job.body, dict(message.properties), exchange,
                                                job.queue))
            return
        self.publish_confirmed(message, exchange, job.queue, job_id=job.job_id,
                               queue=job.queue)

    def publish_confirmed(self, message: amqp.Message, exchange: str, routing_key: str, *,
                          job_id: str, queue: str, replaces: int | None = None,
                          **_: Any) -> None:
        if self.broker.nack_publishes:
            raise MessageNacked(f"job {job_id} for queue {queue!r} was nacked")
        self.broker.route(message, exchange, routing_key)
        if replaces is not None:  # acked once its copy is confirmed
            self.basic_ack(replaces)

    def queue_purge(self, queue: str = "") -> int:
        count = len(self.broker.queues[queue])
        self.broker.queues[queue].clear()
        return count

    def basic_consume(self, queue: str = "", consumer_tag: str = "", no_ack: bool = True,
                      callback: Callable[[amqp.Message], Any] | None = None, **_: Any) -> str:
        """``no_ack`` false: deliveries wait for their acks, at most ``basic_qos``'s
        prefetch at a time (the default here is true: the control clients' replies)."""
        tag = consumer_tag or f"ctag-{next(self._tags)}"
        if queue == "amq.rabbitmq.reply-to":  # direct reply-to: the broker's own queue
            self.broker.queues.setdefault(queue, deque())
        self.consumers[tag] = (queue, callback or (lambda message: None))
        if not no_ack:
            self.acked_consumers.add(tag)
        self.connection.consuming.append(self)
        return tag

    def deliver(self) -> bool:
        """Hand the ready messages of consumed queues to their callbacks."""
        delivered = False
        for consumer, (queue, callback) in list(self.consumers.items()):
            waiting = self.broker.queues[queue]
            acked = consumer in self.acked_consumers
            while waiting and (not acked or not self.prefetch
                               or len(self.unacked) < self.prefetch):
                stored, tag = waiting.popleft(), next(self._tags)
                if acked:
                    self.unacked[tag] = (queue, stored)
                callback(stored.message(delivery_tag=tag))
                delivered = True
        return delivered

    def close(self) -> None:
        """What RabbitMQ does when a channel closes: unacked messages go back, in order."""
        for queue, stored in reversed(list(self.unacked.values())):
            stored.redelivered = True
            self.broker.queues[queue].appendleft(stored)
        self.unacked.clear()
        self.consumers.clear()
        self.is_open = False


class BrokerConnection:
    """A connected ``ojs://`` py-amqp connection on :class:`Broker`.

    It has every member of :class:`ojs_kombu.amqp.job_channel.JobConnection`, the
    interface the dead-letter and control clients check for; the retry and
    scheduling topology is not modelled (nothing under test declares it).
    """

    connection_errors: tuple[type[BaseException], ...] = (ConnectionError,)
    ojs_outcomes: Any = None
    ojs_jobs_run_in_loop = False
    ojs_confirm_all = False
    ojs_loop_acks: Any = None
    transport: Any = None
    frame_max = 131072

    def write_frames(self, data: bytes) -> None:
        raise NotImplementedError("the in-memory broker takes publishes, not frames")

    def flush_acks_in_loop(self) -> None:
        """Acks are never collected here."""

    def closing_within(self, close: Any, *args: Any, **kwargs: Any) -> Any:
        return close(*args, **kwargs)

    def __init__(self, broker: Broker, binding: Binding) -> None:
        self.broker = broker
        self.ojs = binding
        self.connected = True
        self.client: Any = None
        self.consuming: list[BrokerChannel] = []

    def channel(self) -> BrokerChannel:
        return BrokerChannel(self)

    def ensure_topology(self, queue: str, via: Any = None) -> None:
        """The job, dead-letter and control queues of ``queue``, bound as ojs_kombu binds them."""
        names, broker = self.ojs.names, self.broker
        for name in (names.job_queue(queue), names.dead_letter_queue(queue),
                     names.control_queue(queue)):
            broker.declare(name)
        broker.bind(names.job_queue(queue), names.direct_exchange, queue)
        broker.bind(names.control_queue(queue), names.direct_exchange, names.control_queue(queue))
        broker.bind(names.dead_letter_queue(queue), names.dlx_exchange, queue)

    def ensure_topologies(self, queues: Any) -> None:
        for queue in queues:
            self.ensure_topology(queue)

    def drain_events(self, timeout: float | None = None) -> None:
        if not any(channel.deliver() for channel in self.consuming):
            time.sleep(timeout or 0)
            raise TimeoutError("timed out")

    def wait_until(self, done: Any, limit: float) -> bool:
        deadline = time.monotonic() + limit
        while not done():
            if time.monotonic() >= deadline:
                return False
            with contextlib.suppress(TimeoutError):
                self.drain_events(timeout=min(0.01, limit))
        return True

    def queue_depth(self, queue: str) -> int | None:
        stored = self.broker.queues.get(self.ojs.names.job_queue(queue))
        return None if stored is None else len(stored)

    def ensure_retry_queue(self, queue: str, delay_ms: int, via: Any = None) -> None:
        raise NotImplementedError("the in-memory broker has no retry queues")

    def retry_route(self, queue: str, delay_ms: int) -> tuple[str, str]:
        return self.ojs.names.retry_exchange, f"{queue}.{delay_ms}"

    def ensure_schedule(self, queue: str, via: Any = None) -> None:
        raise NotImplementedError("the in-memory broker has no scheduling ladder")

    def ensure_delayed_exchange(self, queue: str) -> None:
        raise NotImplementedError("the in-memory broker has no delayed exchange")

    def forget_topology(self, queue: str | None = None) -> None:
        """Nothing is cached: every ensure_topology declares again."""

    def topology_arguments(self, queue: str) -> dict[str, Any]:
        return self.ojs.declare_arguments(queue)

    def close(self) -> None:
        self.connected = False


class InMemoryTransport(Transport):
    """The ``ojs://`` transport, connecting to a :class:`Broker` instead of a socket."""

    broker: Broker

    def establish_connection(self) -> BrokerConnection:
        self.broker.connections_opened += 1
        return BrokerConnection(self.broker, Binding.from_options(self.client.transport_options))

    def close_connection(self, connection: BrokerConnection) -> None:
        connection.close()


class BrokerOptions(Options):
    """The command line's options, with its broker connections going to ``broker``."""

    def __init__(self, in_memory: Broker, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.in_memory = in_memory

    def connection(self) -> kombu.Connection:
        return self.in_memory.connection(self.target().url,
                                         {"ojs_binding": self.binding()})
