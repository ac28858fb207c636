"""A broker's 403 as the permission it names: RabbitMQ 4 says which, RabbitMQ 3.x does not."""

from __future__ import annotations

import pytest
from amqp.exceptions import AccessRefused

from ojs_kombu import TopologyPermissionError
from ojs_kombu.amqp.broker.permissions import is_permission_refusal, permission_error

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
