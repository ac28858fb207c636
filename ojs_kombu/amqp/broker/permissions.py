"""The broker user's permissions and the OJS topology (403 ``ACCESS_REFUSED``).

RabbitMQ grants *configure*, *write* and *read* per name.  Declaring an OJS job
queue takes *configure* and *read* on it (a queue with a dead-letter exchange)
and *write* on its exchanges: a user that declares the queues can consume them.
So a producer without those permissions does not declare: it uses the topology
that exists (declared by a worker or ``ojs-kombu topology declare``), which a
passive declaration confirms without any permission.  A worker's start must
declare; its refusal is a :class:`~ojs_kombu.spec.errors.TopologyPermissionError`
naming the entity and the permission, never retried.
"""

from __future__ import annotations

import re
from typing import Any

from amqp.exceptions import AccessRefused

from ...spec.errors import TopologyPermissionError
from ...spec.naming import TopologyNames

#: RabbitMQ's text: ``[configure ]access to queue 'ojs.queue.q' in vhost 'v' refused
#: for user 'u'`` (3.x names no permission for a declaration).
_REFUSED = re.compile(r"(?:(configure|write|read) )?access to (queue|exchange) '([^']*)'")


#: The permission each refused method needs, where RabbitMQ (3.x) does not say.
_METHOD_PERMISSION = {"Queue.declare": "configure", "Queue.delete": "configure",
                      "Exchange.declare": "configure", "Exchange.delete": "configure",
                      "Queue.bind": "write", "Queue.unbind": "write", "Exchange.bind": "write",
                      "Exchange.unbind": "write", "Basic.publish": "write",
                      "Basic.get": "read", "Basic.consume": "read", "Queue.purge": "read"}


def permission_error(exc: AccessRefused) -> TopologyPermissionError:
    """The broker's 403 as the entity and the permission it needs."""
    text = str(getattr(exc, "reply_text", "") or exc)
    match = _REFUSED.search(text)
    kind, name = (match[2], match[3]) if match else ("entity", "?")
    method = str(getattr(exc, "method_name", "") or "")
    permission = match[1] if match and match[1] else _METHOD_PERMISSION.get(method, "configure")
    if not (match and match[1]) and kind == "exchange" and method.endswith("bind"):
        permission = "read"  # the source exchange of a binding
    return TopologyPermissionError(kind, name, permission, text)


def is_permission_refusal(exc: BaseException) -> bool:
    """A channel's 403 on an entity (not a refused login)."""
    return isinstance(exc, AccessRefused) and bool(
        _REFUSED.search(str(getattr(exc, "reply_text", "") or exc)))


def topology_exists(channel: Any, names: TopologyNames, queue: str) -> None:
    """Passive declarations (no permission needed) of what a publish to ``queue`` needs;
    raises :class:`amqp.exceptions.NotFound` for the first one missing."""
    channel.exchange_declare(names.direct_exchange, "direct", passive=True)
    channel.exchange_declare(names.dlx_exchange, "direct", passive=True)
    channel.queue_declare(names.job_queue(queue), passive=True)
    channel.queue_declare(names.dead_letter_queue(queue), passive=True)

