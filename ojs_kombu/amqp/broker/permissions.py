"""The broker user's permissions and the OJS topology (403 ``ACCESS_REFUSED``).

RabbitMQ grants *configure*, *write* and *read* per name, and *configure* is
declare **and** delete: a user that may declare ``ojs.exchange.direct`` or a queue
of the scheduling ladder may delete it, and one that may read an exchange may bind
its own queues to it with any routing key (a direct exchange cannot confine keys).
So only the operator (``ojs-kombu topology declare``, or a user with ``.*``)
declares the shared entities and each queue's bindings; a scoped user (a producer,
a worker of some queues) may not declare ``ojs.exchange.direct`` and only checks,
passively, that what it uses exists.  A passive declaration needs no permission on
RabbitMQ 3.x to 4.2.5, *configure* on 4.2.6 and 4.3.0, and any one of the three from
4.2.7 and 4.3.1 on (refused, it is reported as *configure*): each role's patterns
give it one on everything it checks.  A refusal or a missing entity is a
:class:`~ojs_kombu.spec.errors.TopologyPermissionError` naming the entity and the
permission, never retried.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from amqp.exceptions import AccessRefused, NotFound

from ...spec.backpressure import drops_head, rejects_when_full
from ...spec.delays import SCHEDULE_LEVELS
from ...spec.errors import TopologyPermissionError
from ...spec.naming import TopologyNames

#: RabbitMQ's text: ``[configure ]access to queue 'ojs.queue.q' in vhost 'v' refused
#: for user 'u'`` (3.x names no permission for a declaration).
_REFUSED = re.compile(r"(?:(configure|write|read) )?access to (queue|exchange) '([^']*)'")
#: RabbitMQ's 404 to a passive declaration: ``NOT_FOUND - no queue 'q' in vhost 'v'``.
_MISSING = re.compile(r"no (queue|exchange) '([^']*)'")


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


def missing_error(exc: NotFound) -> TopologyPermissionError:
    """A passive declaration's 404: the entity the operator has not declared, which this
    user may not declare (:func:`published_topology_exists`)."""
    text = str(getattr(exc, "reply_text", "") or exc)
    match = _MISSING.search(text)
    kind, name = (match[1], match[2]) if match else ("entity", "?")
    return TopologyPermissionError(kind, name, "configure", f"{text} (it does not exist; "
                                   "ojs-kombu topology declare -q QUEUE declares it)")


def scoped_error(exc: AccessRefused | NotFound) -> TopologyPermissionError:
    """A scoped user's passive check refused (no permission on the entity) or missing."""
    return missing_error(exc) if isinstance(exc, NotFound) else permission_error(exc)


def published_topology_exists(channel: Any, names: TopologyNames, queue: str) -> None:
    """Passive declarations of what a publish to ``queue`` needs (``ojs.exchange.direct``,
    ``ojs.queue.{queue}``; a producer has *write* on both); raises
    :class:`amqp.exceptions.NotFound` for the first one missing."""
    channel.exchange_declare(names.direct_exchange, "direct", passive=True)
    channel.queue_declare(names.job_queue(queue), passive=True)


def consumed_topology_exists(channel: Any, names: TopologyNames, queue: str,
                             job_arguments: Mapping[str, Any]) -> None:
    """:func:`published_topology_exists`, then the queues a worker of ``queue`` uses
    (dead-letter, control, and the dropped-job or ready queue of a bounded queue)."""
    published_topology_exists(channel, names, queue)
    channel.queue_declare(names.dead_letter_queue(queue), passive=True)
    channel.queue_declare(names.control_queue(queue), passive=True)
    if drops_head(job_arguments):
        channel.queue_declare(names.dropped_queue(queue), passive=True)
    if rejects_when_full(job_arguments):
        channel.queue_declare(names.ready_queue(queue), passive=True)


def ladder_exists(channel: Any, names: TopologyNames) -> None:
    """Passive declarations of the scheduling ladder's levels (a scheduled publish enters
    at one of them; producers and workers have *write* on each)."""
    for level in range(SCHEDULE_LEVELS):
        channel.exchange_declare(names.schedule_exchange(level), "topic", passive=True)
