"""A dead letter never vanishes: what ``ojs.exchange.dlx`` cannot route is kept (no broker).

Dead-lettering is not a confirmed publish: with ``ojs.queue.dlx.{q}`` deleted,
RabbitMQ would drop the job nacked into it (AMQP-009).  These are the exact
declarations sent, routed the way RabbitMQ routes a dead letter: through queue
and exchange bindings to a set of queues (each once), an exchange that routes
nowhere handing the message to its ``alternate-exchange``.
"""

from __future__ import annotations

from typing import Any

import pytest

from ojs_kombu.amqp.binding import Binding
from ojs_kombu.amqp.broker.topology import declare_queue_topology
from ojs_kombu.spec.settings import OJSSettings


class Broker:
    """Records exchanges, queues and bindings; routes like RabbitMQ (direct, fanout, AE)."""

    def __init__(self) -> None:
        self.exchanges: dict[str, tuple[str, dict[str, Any]]] = {}
        self.queues: dict[str, dict[str, Any]] = {}
        self.bindings: list[tuple[str, str, str]] = []  # (exchange, queue, key)
        self.exchange_bindings: list[tuple[str, str, str]] = []  # (source, dest., key)

    def exchange_declare(self, exchange: str, type: str, *args: Any, **kwargs: Any) -> None:
        self.exchanges[exchange] = (type, dict(kwargs.get("arguments") or {}))

    def exchange_bind(self, destination: str, source: str = "", routing_key: str = "",
                      *args: Any, **kwargs: Any) -> None:
        if (source, destination, routing_key) not in self.exchange_bindings:
            self.exchange_bindings.append((source, destination, routing_key))

    def queue_declare(self, queue: str = "", *args: Any, **kwargs: Any) -> None:
        self.queues[queue] = dict(kwargs["arguments"])

    def queue_bind(self, queue: str, exchange: str = "", routing_key: str = "",
                   *args: Any, **kwargs: Any) -> None:
        if (exchange, queue, routing_key) not in self.bindings:  # a binding is declared once
            self.bindings.append((exchange, queue, routing_key))

    def queue_delete(self, queue: str) -> None:
        del self.queues[queue]
        self.bindings = [b for b in self.bindings if b[1] != queue]

    def route(self, exchange: str, key: str) -> list[str]:
        """The queues a message published to ``exchange`` with ``key`` reaches, each once."""
        kind, arguments = self.exchanges[exchange]
        matches = (lambda k: True) if kind == "fanout" else (lambda k: k == key)
        found = [q for e, q, k in self.bindings if e == exchange and q in self.queues
                 and matches(k)]
        for source, destination, k in self.exchange_bindings:
            if source == exchange and matches(k):
                found += self.route(destination, key)
        alternate = arguments.get("alternate-exchange")
        if not found and alternate in self.exchanges:
            found = self.route(alternate, key)
        return sorted(set(found))


def declared(**options: Any) -> Broker:
    settings = OJSSettings.from_options({f"ojs_{k}": v for k, v in options.items()},
                                        source="test")
    binding = Binding.from_settings(settings)
    broker = Broker()
    for queue in ("email", "reports"):
        declare_queue_topology(broker, binding.names, queue, binding.declare_arguments(queue),
                               settings.unroutable_dead_letter_arguments())
    return broker


@pytest.mark.parametrize("options", [{}, {"queue_defaults": {"type": "quorum"}}])
def test_a_dead_letter_whose_dlq_was_deleted_lands_in_the_unroutable_queue(
        options: dict[str, Any]) -> None:
    broker = declared(**options)
    job = broker.queues["ojs.queue.email"]
    assert (job["x-dead-letter-exchange"], job["x-dead-letter-routing-key"]) == (
        "ojs.exchange.dlx", "email")
    assert broker.route("ojs.exchange.dlx", "email") == ["ojs.queue.dlx.email"]
    broker.queue_delete("ojs.queue.dlx.email")
    assert broker.route("ojs.exchange.dlx", "email") == ["ojs.queue.dlx.unroutable"]
    # the other queues' dead letters still go to their own DLQ
    assert broker.route("ojs.exchange.dlx", "reports") == ["ojs.queue.dlx.reports"]


def test_the_dlx_stays_plain_and_the_catch_all_is_shared() -> None:
    broker = declared()
    # other OJS clients declare ojs.exchange.dlx without arguments (AMQP-002): they must
    # not meet a 406 for an argument ojs_kombu added
    assert broker.exchanges["ojs.exchange.dlx"] == ("direct", {})
    assert broker.exchanges["ojs.exchange.dlx.guard"] == (
        "direct", {"alternate-exchange": "ojs.exchange.dlx.unroutable"})
    assert broker.exchanges["ojs.exchange.dlx.unroutable"] == ("fanout", {})
    assert broker.queues["ojs.queue.dlx.unroutable"] == {}  # no TTL, no bound: kept
    quorum = declared(queue_defaults={"type": "quorum"})
    assert quorum.queues["ojs.queue.dlx.unroutable"] == {"x-queue-type": "quorum"}
    # quorum job queues also keep a dead letter until a queue confirmed it
    assert quorum.queues["ojs.queue.email"]["x-dead-letter-strategy"] == "at-least-once"


def test_a_prefixed_topology_has_its_own_catch_all() -> None:
    broker = declared(prefix="t1")
    broker.queue_delete("t1.ojs.queue.dlx.email")
    assert broker.route("t1.ojs.exchange.dlx", "email") == ["t1.ojs.queue.dlx.unroutable"]
