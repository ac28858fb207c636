"""The broker's ceiling for a worker's first start: how long RabbitMQ takes to create
each side's broker objects for ``n`` job queues when a bare py-amqp client asks for
them as fast as it can (every declaration pipelined over :data:`CHANNELS` channels,
one reply per channel at the end), in a fresh vhost each.

Subtracting the plain side's time from ojs_kombu's gives what the broker alone adds
to ojs_kombu's first start; the scale part prints it beside the workers' difference.
Three sets are timed: plain Celery's (an exchange, a queue and a binding per job
queue), ojs_kombu's (the binding's topology from :func:`declare_queue_topology`, the
job queue with ``x-max-priority`` 10 as by default) and ojs_kombu's without the
priority (``ojs_max_priority=None``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from admin import Ctl, private_vhost
from sides import connect

from ojs_kombu import TopologyNames
from ojs_kombu.amqp.broker.declaring import NoWait
from ojs_kombu.amqp.broker.topology import declare_queue_topology

CHANNELS = 4
SETS = ("plain", "ojs", "ojs_no_priority")


def _declare_plain(channel: Any, queue: str) -> None:
    channel.exchange_declare(queue, "direct", durable=True, auto_delete=False)
    channel.queue_declare(queue, durable=True, auto_delete=False)
    channel.queue_bind(queue, queue, routing_key=queue)


def _ojs(priority: int | None) -> Callable[[Any, str], None]:
    names = TopologyNames()
    arguments = {} if priority is None else {"x-max-priority": priority}

    def declare(channel: Any, queue: str) -> None:
        declare_queue_topology(channel, names, queue, arguments, {})
    return declare


DECLARE = {"plain": _declare_plain, "ojs": _ojs(10), "ojs_no_priority": _ojs(None)}


def time_set(broker_url: str, vhost: str, which: str, n: int) -> float:
    """Seconds from the first declaration to the broker's last reply."""
    connection = connect(broker_url, vhost=vhost)
    try:
        channels = [connection.channel() for _ in range(CHANNELS)]
        declare = DECLARE[which]
        started = time.perf_counter()
        for i in range(n):
            declare(NoWait(channels[i % CHANNELS]), f"q{i}")
        for channel in channels:  # a reply per channel: everything before it is done
            channel.queue_declare("", exclusive=True, auto_delete=True)
        return time.perf_counter() - started
    finally:
        connection.close()


def measure(broker_url: str, ctl: Ctl, n: int) -> dict[str, float]:
    """Each set once, in a private vhost created and deleted for it."""
    seconds = {}
    for which in SETS:
        with private_vhost(ctl, f"ojs-ceiling-{os.getpid()}-{which}-{n}") as vhost:
            seconds[which] = time_set(broker_url, vhost, which, n)
    return seconds
