"""Role confinement: an ``email`` producer and an ``email`` worker, each a broker user with
exactly the permissions docs/production.rst gives its role, try what the threat model
says they cannot do to ``billing`` and to the shared topology.  Each attempt must be
refused by the broker (403 ``ACCESS_REFUSED``), and ``billing``'s job, scheduled job
and dead letter must all still be there afterwards.

The ``email`` worker runs as users start it (gossip, mingle, heartbeats and events on)
the whole time, so its user is shown to be enough for a default worker.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import amqp
import pytest

from ojs_kombu.spec.delays import SCHEDULE_LEVELS

from .apps import make_app
from .conftest import HOST, PORT, private_vhost, rabbitmqctl, wait_until
from .test_permissions import cli, documented_permissions
from .workers import WorkerProcess, launch_worker

#: Broker users of the test: (role, its queues).
USERS = {"operator": ("operator", "email"), "email-producer": ("producer", "email"),
         "email-worker": ("worker", "email"), "billing-producer": ("producer", "billing")}


@pytest.fixture(scope="module")
def urls() -> Iterator[dict[str, str]]:
    """``{user: broker URL}`` in a vhost of the module's own, the topology of ``email``
    and ``billing`` declared by the operator."""
    token = uuid.uuid4().hex[:6]
    made: list[str] = []
    with private_vhost("ojs-kombu-confine") as vhost:
        try:
            found = {}
            for name, (role, queues) in USERS.items():
                user = f"ojs-{name}-{token}"
                rabbitmqctl("add_user", user, "secret")
                made.append(user)
                rabbitmqctl("set_permissions", "-p", vhost, user,
                            *documented_permissions(queues)[role])
                found[name] = f"ojs://{user}:secret@{HOST}:{PORT}/{vhost}"
            declared = cli(found["operator"], "topology", "declare", "-q", "email",
                           "-q", "billing")
            assert declared.returncode == 0, declared.stderr
            yield found
        finally:
            for user in made:
                rabbitmqctl("delete_user", user)


def _amqp(url: str) -> amqp.Connection:
    """A plain py-amqp connection as the URL's user: what an attacker holding the
    credentials would open, nothing of ojs_kombu in between."""
    rest = url.split("://", 1)[1]
    credentials, location = rest.split("@", 1)
    user, password = credentials.split(":", 1)
    host, vhost = location.split("/", 1)
    connection = amqp.Connection(host, userid=user, password=password, virtual_host=vhost)
    connection.connect()
    return connection


def _counts(url: str) -> dict[str, int]:
    """Ready messages of billing's queues and of the whole ladder (the operator's view)."""
    connection = _amqp(url)
    try:
        channel = connection.channel()

        def ready(name: str) -> int:
            return int(channel.queue_declare(name, passive=True).message_count)

        ladder = sum(ready(f"ojs.queue.schedule.{k}") for k in range(SCHEDULE_LEVELS))
        return {"jobs": ready("ojs.queue.billing"), "dead letters": ready("ojs.queue.dlx.billing"),
                "scheduled": ladder}
    finally:
        connection.close()


@pytest.fixture(scope="module")
def billing(urls: dict[str, str]) -> dict[str, int]:
    """One job, one scheduled job (an hour ahead) and one dead letter of ``billing``."""
    producer = make_app("confine-billing", urls["billing-producer"])
    producer.send_task("math.add", args=[1, 2], queue="billing", ignore_result=True)
    producer.send_task("math.add", args=[3, 4], queue="billing", countdown=3600,
                       ignore_result=True)
    connection = _amqp(urls["operator"])
    try:
        channel = connection.channel()
        channel.basic_publish(amqp.Message(b'{"dead": true}', delivery_mode=2),
                              exchange="ojs.exchange.dlx", routing_key="billing")
    finally:
        connection.close()
    expected = {"jobs": 1, "dead letters": 1, "scheduled": 1}
    wait_until(lambda: _counts(urls["operator"]) == expected, 30, "billing's messages")
    return expected


@pytest.fixture(scope="module")
def email_worker(urls: dict[str, str], billing: dict[str, int],
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """A default ``celery worker -Q email -E`` (gossip, mingle, heartbeats on) as the
    ``email`` worker's user, its OJS events on the ``"amqp"`` sink; a queue of the
    operator's gets them."""
    operator = _amqp(urls["operator"])
    try:
        channel = operator.channel()
        channel.queue_declare(EVENTS_QUEUE, durable=True, auto_delete=False)
        channel.queue_bind(EVENTS_QUEUE, "ojs.exchange.events", "job.#")
    finally:
        operator.close()
    log = tmp_path_factory.mktemp("confine") / "worker.log"
    worker = launch_worker(urls["email-worker"], "integration.cliapp", "email", log=log,
                           without=(), options=("-E",),
                           env={"OJS_TEST_RESULT_BACKEND": "none",
                                "OJS_TEST_EVENT_SINKS": "amqp"})
    try:
        yield worker
    finally:
        worker.stop()


#: The operator's queue bound to ``ojs.exchange.events`` (the ``email`` worker's sink).
EVENTS_QUEUE = "ojs.queue.test-events"


#: Each attack: what it does, given a channel.  ``{q}`` is a ladder level.
ATTACKS: dict[str, Callable[[amqp.Channel], Any]] = {
    "declare a queue named like the ladder's":
        lambda ch: ch.queue_declare("ojs.queue.schedule.mine", durable=True,
                                    auto_delete=False),
    "declare an exchange named like the ladder's":
        lambda ch: ch.exchange_declare("ojs.exchange.schedule.mine", "topic", durable=True,
                                       auto_delete=False),
    "bind its job queue to ojs.exchange.direct with billing's key":
        lambda ch: ch.queue_bind("ojs.queue.email", "ojs.exchange.direct", "billing"),
    "bind its control queue to ojs.exchange.dlx with billing's key":
        lambda ch: ch.queue_bind("ojs.queue.control.email", "ojs.exchange.dlx", "billing"),
    "bind its job queue to the ladder's way out with billing's key":
        lambda ch: ch.queue_bind("ojs.queue.email", "ojs.exchange.schedule.ready",
                                 "*." * SCHEDULE_LEVELS + "billing"),
    "bind its job queue to ojs.exchange.retry with billing's retry key":
        lambda ch: ch.queue_bind("ojs.queue.email", "ojs.exchange.retry", "billing.1000"),
    "bind its job queue to a ladder level":
        lambda ch: ch.queue_bind("ojs.queue.email", "ojs.exchange.schedule.0", "#"),
    "consume billing's job queue": lambda ch: ch.basic_consume("ojs.queue.billing"),
    "get from billing's job queue": lambda ch: ch.basic_get("ojs.queue.billing"),
    "consume billing's dead letters": lambda ch: ch.basic_consume("ojs.queue.dlx.billing"),
    "purge billing's job queue": lambda ch: ch.queue_purge("ojs.queue.billing"),
    "purge billing's dead letters": lambda ch: ch.queue_purge("ojs.queue.dlx.billing"),
    "delete billing's dead-letter queue": lambda ch: ch.queue_delete("ojs.queue.dlx.billing"),
    "delete ojs.exchange.direct": lambda ch: ch.exchange_delete("ojs.exchange.direct"),
    "delete ojs.exchange.dlx": lambda ch: ch.exchange_delete("ojs.exchange.dlx"),
    "delete ojs.exchange.retry": lambda ch: ch.exchange_delete("ojs.exchange.retry"),
    "redeclare ojs.exchange.direct":
        lambda ch: ch.exchange_declare("ojs.exchange.direct", "direct", durable=True,
                                       auto_delete=False),
    "delete the unroutable dead letters":
        lambda ch: ch.queue_delete("ojs.queue.dlx.unroutable"),
    **{f"purge ladder queue {k}": (lambda ch, k=k: ch.queue_purge(f"ojs.queue.schedule.{k}"))
       for k in range(SCHEDULE_LEVELS)},
    **{f"consume ladder queue {k}":
       (lambda ch, k=k: ch.basic_consume(f"ojs.queue.schedule.{k}"))
       for k in range(SCHEDULE_LEVELS)},
    **{f"delete ladder queue {k}": (lambda ch, k=k: ch.queue_delete(f"ojs.queue.schedule.{k}"))
       for k in range(0, SCHEDULE_LEVELS, 7)},
    **{f"delete ladder level {k}":
       (lambda ch, k=k: ch.exchange_delete(f"ojs.exchange.schedule.{k}"))
       for k in range(0, SCHEDULE_LEVELS, 7)},
    "purge the ladder's unroutable queue":
        lambda ch: ch.queue_purge("ojs.queue.schedule.unroutable"),
}


@pytest.mark.parametrize("attacker", ["email-producer", "email-worker"])
def test_an_email_user_cannot_touch_billing_or_the_shared_topology(
        urls: dict[str, str], billing: dict[str, int], email_worker: WorkerProcess,
        attacker: str) -> None:
    allowed = []
    connection = _amqp(urls[attacker])
    try:
        for what, attack in ATTACKS.items():
            channel = connection.channel()
            try:
                attack(channel)
                allowed.append(what)
            except amqp.exceptions.AccessRefused:
                pass  # the broker closed the channel: the next attack opens another
            if channel.is_open:
                channel.close()
    finally:
        connection.close()
    assert allowed == [], f"{attacker} was allowed to: {allowed}"
    assert email_worker.alive(), "the email worker stopped"
    assert _counts(urls["operator"]) == billing  # billing's job, scheduled job, dead letter


def test_email_roles_still_do_their_work(urls: dict[str, str], email_worker: WorkerProcess,
                                         billing: dict[str, int]) -> None:
    """The same users publish (now and through the ladder) and run jobs; a failing job
    is retried through retry queues the worker declares and is dead-lettered."""
    producer = make_app("confine-email", urls["email-producer"])
    now = producer.send_task("math.add", args=[1, 1], queue="email", ignore_result=True)
    later = producer.send_task("math.add", args=[2, 2], queue="email", countdown=1,
                               ignore_result=True)
    flaky = producer.send_task("flaky.twice", queue="email", ignore_result=True)
    producer.send_task("always.fail", queue="email", ignore_result=True)
    log = email_worker.log
    assert isinstance(log, Path)
    for job, task in ((now, "math.add"), (later, "math.add"), (flaky, "flaky.twice")):
        wait_until(lambda j=job, t=task: f"Task {t}[{j.id}] succeeded" in log.read_text(),
                   90, f"job {job.id} to run")

    def dead_letters() -> int:
        connection = _amqp(urls["operator"])
        try:
            return int(connection.channel().queue_declare(
                "ojs.queue.dlx.email", passive=True).message_count)
        finally:
            connection.close()

    wait_until(lambda: dead_letters() == 1, 90, "the failing job's dead letter (3 attempts)")

    def events() -> int:
        connection = _amqp(urls["operator"])
        try:
            return int(connection.channel().queue_declare(
                EVENTS_QUEUE, passive=True).message_count)
        finally:
            connection.close()

    # the scoped worker's "amqp" sink checks the operator's exchange passively
    wait_until(lambda: events() > 0, 60, "the email worker's job events")
    assert "ACCESS_REFUSED" not in log.read_text()
    assert "could not deliver" not in log.read_text()
    assert _counts(urls["operator"]) == billing
