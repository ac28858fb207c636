"""The OJS topology on a real broker (AMQP-001..004, 031, section 7)."""

from __future__ import annotations

import re
from typing import Any

import amqp
import pytest
from celery import Celery

import ojs_kombu
from ojs_kombu.spec.errors import TopologyConflictError

from .conftest import get_message, rabbitmqctl


def listing(vhost: str, what: str, *columns: str) -> list[str]:
    return rabbitmqctl(f"list_{what}", "--no-table-headers", "-p", vhost, *columns).splitlines()


def broker_state(vhost: str) -> dict[str, Any]:
    """Exchanges, queues (with flags and arguments) and bindings, as RabbitMQ reports them."""
    exchanges = {}
    for line in listing(vhost, "exchanges", "name", "type", "durable", "auto_delete"):
        name, kind, durable, auto_delete = line.split("\t")
        exchanges[name] = (kind, durable, auto_delete)
    queues = {}
    for line in listing(vhost, "queues", "name", "durable", "auto_delete", "exclusive",
                        "arguments"):
        name, durable, auto_delete, exclusive, arguments = line.split("\t")
        queues[name] = (durable, auto_delete, exclusive, arguments)
    bindings = set()
    for line in listing(vhost, "bindings", "source_name", "destination_name", "routing_key"):
        bindings.add(tuple(line.split("\t")))
    return {"exchanges": exchanges, "queues": queues, "bindings": bindings}


def test_eager_declaration_creates_the_spec_topology(app: Celery, vhost: str) -> None:
    assert ojs_kombu.declare_topology(app, ["topo"]) == ["topo"]
    assert ojs_kombu.declare_topology(app, ["topo"]) == ["topo"]  # idempotent
    state = broker_state(vhost)
    for exchange in ("ojs.exchange.direct", "ojs.exchange.dlx"):
        assert state["exchanges"][exchange] == ("direct", "true", "false")
    durable, auto_delete, exclusive, arguments = state["queues"]["ojs.queue.topo"]
    assert (durable, auto_delete, exclusive) == ("true", "false", "false")
    assert '{"x-dead-letter-exchange","ojs.exchange.dlx"}' in arguments
    assert '{"x-dead-letter-routing-key","topo"}' in arguments
    assert "x-max-priority" not in arguments  # priority queues where the app asks
    assert state["queues"]["ojs.queue.dlx.topo"][:3] == ("true", "false", "false")
    assert ("ojs.exchange.direct", "ojs.queue.topo", "topo") in state["bindings"]
    assert ("ojs.exchange.dlx", "ojs.queue.dlx.topo", "topo") in state["bindings"]


def test_lazy_declaration_on_first_publish(app: Celery, vhost: str,
                                           amqp_channel: amqp.Channel) -> None:
    result = app.tasks["math.add"].apply_async((1, 2), queue="lazy-first-use")
    state = broker_state(vhost)
    assert "ojs.queue.lazy-first-use" in state["queues"]
    assert "ojs.queue.dlx.lazy-first-use" in state["queues"]
    assert get_message(amqp_channel, "ojs.queue.lazy-first-use").properties[
        "message_id"] == result.id


def test_worker_start_declared_its_queues(worker: Any, vhost: str) -> None:
    state = broker_state(vhost)
    for name in ("default", "email", "malformed", "failing", "canvas"):
        for queue in (f"ojs.queue.{name}", f"ojs.queue.dlx.{name}", f"ojs.queue.control.{name}"):
            assert queue in state["queues"]
        assert ("ojs.exchange.direct", f"ojs.queue.{name}", name) in state["bindings"]
        assert ("ojs.exchange.dlx", f"ojs.queue.dlx.{name}", name) in state["bindings"]


def test_conflicting_queue_gives_one_clear_error_and_publishing_goes_on(
        app: Celery, amqp_channel: amqp.Channel) -> None:
    amqp_channel.queue_declare("ojs.queue.conflict", durable=True, auto_delete=False,
                               arguments={"x-max-length": 5})
    with pytest.raises(TopologyConflictError) as info:
        ojs_kombu.declare_topology(app, ["conflict"])
    error = info.value
    assert error.kind == "queue" and error.name == "ojs.queue.conflict"
    assert "x-dead-letter-exchange" in error.declared["arguments"]
    assert re.search(r"PRECONDITION_FAILED.*inequivalent arg", error.broker_reply)
    assert "ojs.queue.conflict" in str(error)
    # The declaring channel was thrown away; the app's publishing channel is intact.
    ok = app.tasks["math.add"].apply_async((1, 2), queue="after-conflict")
    assert get_message(amqp_channel, "ojs.queue.after-conflict").properties[
        "message_id"] == ok.id


def test_celery_native_delayed_delivery_never_runs(app: Celery, worker: Any,
                                                   vhost: str) -> None:
    result = app.tasks["math.add"].apply_async((20, 22), queue="canvas", countdown=1)
    assert result.get(timeout=20) == 42
    exchanges = broker_state(vhost)["exchanges"]
    assert not [name for name in exchanges if name.startswith("celery_delayed")]
    # Only OJS entities and the broker's own exist: no per-queue Celery exchanges.
    assert not [n for n in exchanges if n and not n.startswith(("amq.", "celery",
                                                                "reply.celery"))
                and not n.startswith("ojs.") and ".ojs." not in n]
