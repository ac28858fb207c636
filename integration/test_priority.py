"""Priority queues (AMQP-030): higher-priority jobs overtake a backlog on the real broker."""

from __future__ import annotations

import json

import amqp

from ojs_kombu import declare_topology

from .apps import make_app
from .conftest import get_message, rabbitmqctl, wait_until
from .workers import in_process_worker


def test_high_priority_jobs_overtake_a_backlog(broker_url: str, vhost: str) -> None:
    app = make_app("priority", broker_url, None, worker_prefetch_multiplier=1)
    declare_topology(app, ["bp-prio"])
    listing = rabbitmqctl("list_queues", "--no-table-headers", "-p", vhost, "name", "arguments")
    line = next(x for x in listing.splitlines() if x.startswith("ojs.queue.bp-prio\t"))
    assert '{"x-max-priority",10}' in line
    add = app.tasks["math.add"]
    backlog = [add.apply_async((i, 0), queue="bp-prio").id for i in range(10)]
    urgent = [add.apply_async((i, 1), queue="bp-prio", priority=9).id for i in range(3)]
    with in_process_worker(app, ["bp-prio"], pool="solo", concurrency=1,
                           shutdown_timeout=30):
        wait_until(lambda: len(app.calls.all()) == 13, 60, "13 jobs")
    order = [call["id"] for call in app.calls.all()]
    assert order[:3] == urgent
    assert order[3:] == backlog  # equal priorities keep their FIFO order


def test_ojs_priority_reaches_the_broker_as_amqp_priority(
        broker_url: str, amqp_channel: amqp.Channel) -> None:
    """OJS ``priority`` stays in the envelope; the AMQP property is its 0..9 mapping."""
    app = make_app("priority-map", broker_url, None)
    add = app.tasks["math.add"]
    for priority in (0, 5, 100):
        add.apply_async((1, 1), queue="bp-prio-map", priority=priority)
    seen = []
    for _ in range(3):
        message = get_message(amqp_channel, "ojs.queue.bp-prio-map")
        seen.append((json.loads(message.body).get("priority"),
                     message.properties.get("priority")))
    # RabbitMQ delivers the highest first; priority 0 is sent without the property
    assert seen == [(100, 9), (5, 5), (None, None)]
