"""A broker's 403 as the permission it names: RabbitMQ 4 says which, RabbitMQ 3.x does not;
what a scoped producer or worker declares (its retry queues) and only checks (the rest),
and what the operator declares."""

from __future__ import annotations

from typing import Any

import pytest
from amqp.exceptions import AccessRefused, NotFound

from ojs_kombu import TopologyPermissionError
from ojs_kombu.amqp.broker.permissions import (
    consumed_topology_exists,
    is_permission_refusal,
    ladder_exists,
    permission_error,
    scoped_error,
)
from ojs_kombu.amqp.broker.topology import declare_retry_queue, declare_shared
from ojs_kombu.spec.delays import SCHEDULE_LEVELS
from ojs_kombu.spec.naming import TopologyNames

V3 = "ACCESS_REFUSED - access to {kind} '{name}' in vhost 'v' refused for user 'u'"
V4 = "ACCESS_REFUSED - {perm} access to {kind} '{name}' in vhost 'v' refused for user 'u'"


def refusal(text: str, method: str) -> AccessRefused:
    return AccessRefused(text, method_sig=None, method_name=method)


@pytest.mark.parametrize(("method", "kind", "name", "permission"), [
    ("Queue.declare", "queue", "ojs.queue.email", "configure"),
    ("Exchange.declare", "exchange", "ojs.exchange.direct", "configure"),
    ("Queue.delete", "queue", "ojs.queue.email", "configure"),
    ("Basic.get", "queue", "ojs.queue.dlx.email", "read"),
    ("Basic.consume", "queue", "ojs.queue.email", "read"),
    ("Queue.purge", "queue", "ojs.queue.dlx.email", "read"),
    ("Basic.publish", "exchange", "amq.default", "write"),
    ("Queue.bind", "queue", "ojs.queue.email", "write"),
    ("Queue.bind", "exchange", "ojs.exchange.dlx", "read"),
])
def test_the_permission_is_named_on_rabbitmq_3_and_4(method: str, kind: str, name: str,
                                                    permission: str) -> None:
    for text in (V3.format(kind=kind, name=name),
                 V4.format(perm=permission, kind=kind, name=name)):
        error = permission_error(refusal(text, method))
        assert isinstance(error, TopologyPermissionError)
        assert (error.kind, error.name, error.permission) == (kind, name, permission)
        assert f"lacks the {permission!r} permission on {kind} {name!r}" in str(error)
        assert "docs/production.rst" in str(error)


def test_a_refused_login_is_no_permission_refusal() -> None:
    login = refusal("ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN",
                    "Connection.start_ok")
    assert not is_permission_refusal(login)
    assert is_permission_refusal(refusal(V3.format(kind="queue", name="q"), "Basic.get"))


@pytest.mark.parametrize(("kind", "name"), [("queue", "ojs.queue.email"),
                                            ("exchange", "ojs.exchange.direct")])
def test_a_missing_entity_a_scoped_user_may_not_declare_names_it_and_the_operator_command(
        kind: str, name: str) -> None:
    missing = NotFound(f"NOT_FOUND - no {kind} '{name}' in vhost 'v'", method_sig=None,
                       method_name=f"{kind.title()}.declare")
    error = scoped_error(missing)
    assert (error.kind, error.name, error.permission) == (kind, name, "configure")
    assert "ojs-kombu topology declare -q QUEUE" in str(error)
    # a passive declaration refused (RabbitMQ 4.2.7+: no permission at all on it)
    refused = scoped_error(refusal(V4.format(perm="configure", kind=kind, name=name),
                                   f"{kind.title()}.declare"))
    assert (refused.kind, refused.name) == (kind, name)


class Recorded:
    """A channel that records what is declared and bound, passively or not."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, bool]] = []

    def exchange_declare(self, exchange: str, type: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("exchange", exchange, bool(kwargs.get("passive"))))

    def exchange_bind(self, destination: str, source: str = "", *args: Any,
                      **kwargs: Any) -> None:
        self.calls.append(("bind", f"{source}->{destination}", False))

    def queue_declare(self, queue: str = "", *args: Any, **kwargs: Any) -> None:
        self.calls.append(("queue", queue, bool(kwargs.get("passive"))))

    def queue_bind(self, queue: str, exchange: str = "", *args: Any, **kwargs: Any) -> None:
        self.calls.append(("bind", f"{exchange}->{queue}", False))


def test_the_operator_declares_every_shared_entity_a_scoped_user_is_refused() -> None:
    names = TopologyNames()
    channel = Recorded()
    declare_shared(channel, names)
    exchanges = {name for kind, name, _ in channel.calls if kind == "exchange"}
    queues = {name for kind, name, _ in channel.calls if kind == "queue"}
    # every exchange workers and producers use (the events and delayed ones aside)
    assert exchanges == set(names.exchanges(events=False, delayed=False))
    assert queues == {names.dlx_unroutable_queue, names.schedule_unroutable_queue,
                      *(names.schedule_queue(k) for k in range(SCHEDULE_LEVELS))}


def test_a_scoped_worker_declares_its_retry_queue_and_nothing_shared() -> None:
    names = TopologyNames()
    channel = Recorded()
    declare_retry_queue(channel, names, "email", 1500, None, False)
    assert channel.calls == [("queue", "ojs.queue.retry.email.1500", False)]
    full = Recorded()
    declare_retry_queue(full, names, "email", 1500)
    assert ("bind", "ojs.exchange.retry->ojs.queue.retry.email.1500", False) in full.calls


def test_scoped_checks_are_passive_only() -> None:
    names = TopologyNames()
    channel = Recorded()
    consumed_topology_exists(channel, names, "email",
                             {"x-max-length": 10, "x-overflow": "drop-head"})
    ladder_exists(channel, names)
    assert all(passive for _, _, passive in channel.calls)
    assert {name for _, name, _ in channel.calls} >= {
        "ojs.exchange.direct", "ojs.queue.email", "ojs.queue.dlx.email",
        "ojs.queue.control.email", "ojs.queue.dropped.email", "ojs.exchange.schedule.31"}
