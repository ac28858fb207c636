"""Reconnection, re-declaration, consumer cancellation and failover against the real broker.

The module works in a vhost of its own (each test in queues of its own names; the
quorum-queue test in a vhost of its own) and breaks only that vhost's connections
(``rabbitmqctl close_all_connections`` on it, never all of the broker's).  Broker
restarts are in the fault suite (faults/), which runs its own node.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import kombu
import pytest
from amqp.exceptions import ConsumerCancelled
from celery import Celery

import ojs_kombu

from .apps import make_app
from .conftest import HOST, PORT, private_vhost, queue_counts, rabbitmqctl, wait_until
from .workers import in_process_worker


@pytest.fixture(scope="module")
def own_vhost() -> Iterator[str]:
    with private_vhost("ojs-kombu-reconnect") as name:
        yield name


@pytest.fixture
def quorum_vhost() -> Iterator[str]:
    """A vhost of the test's own, where the topology's queues are quorum queues (the
    module's holds them as classic queues: a worker declaring them stops there)."""
    with private_vhost("ojs-kombu-reconnect-quorum") as name:
        yield name


ConnectionEvents = Callable[[Celery], list[dict[str, Any]]]


@pytest.fixture
def connection_events() -> Iterator[ConnectionEvents]:
    """``connection_events(app)``: the list ``connection.reconnected`` and
    ``consumer.cancelled`` events of ``app`` are appended to."""
    subscriptions: list[Any] = []

    def watch(app: Celery) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        subscriptions.append(ojs_kombu.subscribe(
            app, events.append, event_types=["connection.reconnected", "consumer.cancelled"]))
        return events
    yield watch
    for subscription in subscriptions:
        subscription.cancel()


def close_connections_of(vhost: str) -> int:
    """Close every connection of ``vhost`` (and only those); how many it had."""
    listed = rabbitmqctl("list_connections", "vhost").splitlines()
    count = sum(name == vhost for name in listed)
    if count:
        rabbitmqctl("close_all_connections", "--vhost", vhost, "--limit", str(count),
                    "reconnect test")
    return count


def consumers_of(vhost: str, queue: str) -> list[int]:
    """Prefetch counts of the consumers of ``queue``."""
    out = rabbitmqctl("list_consumers", "-p", vhost, "queue_name", "prefetch_count")
    return [int(line.split("\t")[1]) for line in out.splitlines()
            if line.split("\t")[0] == queue]


def wait_for_consumers(vhost: str, queues: list[str], prefetch: int, what: str) -> None:
    """Wait until each of ``queues`` has one consumer, with ``prefetch``: first for a
    consumer at all over AMQP (cheap to poll), then for the prefetch, which only
    ``rabbitmqctl`` tells (asked once a second)."""
    wait_until(lambda: all((queue_counts(vhost, queue) or (0, 0))[1] >= 1
                           for queue in queues), 30, what)
    wait_until(lambda: all(consumers_of(vhost, queue) == [prefetch] for queue in queues), 30,
               what, interval=1.0)


def test_worker_reconnects_redeclares_and_consumes_with_the_same_prefetch(
        own_vhost: str, connection_events: ConnectionEvents) -> None:
    app = make_app("reconnect", f"ojs://guest:guest@{HOST}:{PORT}/{own_vhost}", "cache+memory://")
    events = connection_events(app)
    with in_process_worker(app, ["rq"], pool="threads", concurrency=2):
        first = app.tasks["math.add"].apply_async((1, 1), queue="rq")
        app.calls.wait_for(first.id)
        prefetch = consumers_of(own_vhost, "ojs.queue.rq")
        assert prefetch == [8]  # concurrency 2 x prefetch multiplier 4
        # remove what the worker declared, then cut its connections
        rabbitmqctl("delete_queue", "-p", own_vhost, "ojs.queue.dlx.rq")
        assert close_connections_of(own_vhost) >= 1
        wait_until(lambda: any(e["data"].get("role") == "worker" for e in events),
                   60, "the worker's connection.reconnected event")
        event = next(e for e in events if e["data"].get("role") == "worker")
        assert event["data"]["queues"] == ["rq"]
        assert event["data"]["prefetch_count"] == 8
        wait_for_consumers(own_vhost, ["ojs.queue.rq"], 8,
                           "the consumer back with the same prefetch")
        assert queue_counts(own_vhost, "ojs.queue.dlx.rq") is not None  # re-declared
        second = app.tasks["math.add"].apply_async((2, 2), queue="rq")
        app.calls.wait_for(second.id)


def test_producer_redeclares_topology_after_reconnecting(
        own_vhost: str, connection_events: ConnectionEvents) -> None:
    app = make_app("reconnect-producer", f"ojs://guest:guest@{HOST}:{PORT}/{own_vhost}")
    events = connection_events(app)
    app.tasks["math.add"].apply_async((1, 1), queue="pq")
    # the broker loses the exchange and queue, and the producer its connection
    rabbitmqctl("delete_queue", "-p", own_vhost, "ojs.queue.pq")
    rabbitmqctl("eval", f'rabbit_exchange:delete(rabbit_misc:r(<<"{own_vhost}">>, exchange, '
                '<<"ojs.exchange.direct">>), false, <<"test">>).')
    assert close_connections_of(own_vhost) >= 1
    app.tasks["math.add"].apply_async((2, 2), queue="pq")  # mandatory + confirmed
    assert queue_counts(own_vhost, "ojs.queue.pq") == (1, 0)
    assert [e["data"]["role"] for e in events
            if e["type"] == "connection.reconnected"] == ["client"]


def test_producer_with_the_rpc_backend_publishes_after_its_connection_was_closed(
        own_vhost: str) -> None:
    """The rpc:// backend declares its reply queue first, which reconnects; the job is then
    published on a new channel, not on the one closed with the old connection."""
    app = make_app("reconnect-rpc", f"ojs://guest:guest@{HOST}:{PORT}/{own_vhost}", "rpc://")
    app.tasks["math.add"].apply_async((1, 1), queue="rpcq")
    assert close_connections_of(own_vhost) >= 1
    app.tasks["math.add"].apply_async((2, 2), queue="rpcq")
    assert queue_counts(own_vhost, "ojs.queue.rpcq") == (2, 0)


def test_deleted_queue_cancels_the_consumer_which_comes_back(
        own_vhost: str, connection_events: ConnectionEvents) -> None:
    """Each time: the consumer comes back with its prefetch, jobs run, and the worker's
    remote control answers (the connection it leaves is closed, not dropped: on
    RabbitMQ 4.x a dropped one kept Celery's exclusive pidbox queue locked, and the
    worker stopped on ``RESOURCE_LOCKED``)."""
    app = make_app("cancel", f"ojs://guest:guest@{HOST}:{PORT}/{own_vhost}", "cache+memory://")
    events = connection_events(app)
    with in_process_worker(app, ["cq"], pool="threads", concurrency=2) as worker:
        first = app.tasks["math.add"].apply_async((1, 1), queue="cq")
        app.calls.wait_for(first.id)
        for cycle in range(1, 4):
            rabbitmqctl("delete_queue", "-p", own_vhost, "ojs.queue.cq")
            wait_until(lambda n=cycle: sum(e["type"] == "consumer.cancelled"
                                           for e in events) == n, 30, "consumer.cancelled")
            cancelled = [e for e in events if e["type"] == "consumer.cancelled"][-1]
            assert cancelled["data"]["queue"] == "cq"
            assert 750 <= cancelled["data"]["retry_in_ms"] <= 1250  # the schedule's first step
            wait_for_consumers(own_vhost, ["ojs.queue.cq"], 8,
                               "the consumer re-registered with the same prefetch")
            again = app.tasks["math.add"].apply_async((cycle, 2), queue="cq")
            app.calls.wait_for(again.id)
            assert wait_until(lambda: app.control.ping([worker.hostname], timeout=1.0), 10,
                              "the worker's remote control answering")


def test_a_cancelled_consumer_closes_its_connection_before_the_reconnect(
        own_vhost: str) -> None:
    """The reconnection path a deleted queue hands over to starts from a closed
    connection: its exclusive queues (Celery's pidbox queue) are free for the next
    connection at once.  A connection left open kept them, and Celery's worker stopped
    on 405 ``RESOURCE_LOCKED`` declaring its pidbox queue again."""
    url = f"ojs://guest:guest@{HOST}:{PORT}/{own_vhost}"
    connection = kombu.Connection(url)
    channel = connection.channel()
    kombu.Queue("node.pidbox", exclusive=True, channel=channel).declare()
    consumer = kombu.Consumer(channel, [kombu.Queue("ojs.queue.cx", channel=channel)],
                              callbacks=[lambda body, message: message.ack()])
    consumer.consume()
    rabbitmqctl("delete_queue", "-p", own_vhost, "ojs.queue.cx")
    with pytest.raises(ConsumerCancelled):
        connection.drain_events(timeout=10)
    try:
        with kombu.Connection(url) as next_connection:
            kombu.Queue("node.pidbox", exclusive=True,
                        channel=next_connection.channel()).declare()
    finally:
        connection.release()


def test_an_exclusive_queue_still_held_by_the_previous_connection_is_waited_for(
        own_vhost: str) -> None:
    """A worker that reconnects declares its pidbox queue again while the broker may
    still hold it for the connection it lost (RabbitMQ 4.3, the old connection's node
    killed): the declaration waits for the queue to be let go (here: the holder closes
    after 1 s) instead of failing at once with 405 ``RESOURCE_LOCKED``, which stopped
    Celery's worker.  A queue held for longer than the wait still raises."""
    url = f"ojs://guest:guest@{HOST}:{PORT}/{own_vhost}"
    holder = kombu.Connection(url)
    kombu.Queue("node.pidbox", exclusive=True, channel=holder.channel()).declare()
    closer = threading.Timer(1.0, holder.release)
    closer.start()
    try:
        with kombu.Connection(url) as next_connection:
            name = kombu.Queue("node.pidbox", exclusive=True,
                               channel=next_connection.channel()).declare()
            assert name == "node.pidbox"
            assert "node.pidbox" in rabbitmqctl("list_queues", "-p", own_vhost, "name")
    finally:
        closer.join()


def test_celery_55s_transient_client_queues_are_declared_as_celery_57_declares_them(
        own_vhost: str) -> None:
    """Celery 5.5's remote-control, event and ``rpc://`` queues ask for transient
    non-exclusive auto-delete queues, which RabbitMQ 4.x refuses (541, the connection
    closed) once ``transient_nonexcl_queues`` is denied, as CI's 4.x nodes deny it: the
    worker reconnected for ever.  ojs_kombu declares the remote-control and event
    queues exclusive (deleted with their connection, even when its node dies: a durable
    one stayed behind on a killed node and the worker stopped on 404), and any other
    durable, still auto-delete, usable from another connection."""
    url = f"ojs://guest:guest@{HOST}:{PORT}/{own_vhost}"
    with kombu.Connection(url) as first, kombu.Connection(url) as second:
        for name in ("node.celery.pidbox", "celeryev.e1"):
            kombu.Queue(name, durable=False, auto_delete=True,
                        channel=first.channel()).declare()
        for connection in (first, second):
            kombu.Queue("3f2b-oid", durable=False, auto_delete=True,
                        channel=connection.channel()).declare()
        listing = rabbitmqctl("list_queues", "-p", own_vhost, "name", "durable",
                              "auto_delete", "exclusive").splitlines()
        assert "node.celery.pidbox\tfalse\ttrue\ttrue" in listing, listing
        assert "celeryev.e1\tfalse\ttrue\ttrue" in listing, listing
        assert "3f2b-oid\ttrue\ttrue\tfalse" in listing, listing
    listing = rabbitmqctl("list_queues", "-p", own_vhost, "name")
    assert "node.celery.pidbox" not in listing and "celeryev.e1" not in listing, listing


def test_a_deleted_quorum_control_queue_is_consumed_again(
        quorum_vhost: str, connection_events: ConnectionEvents) -> None:
    """RabbitMQ 4.0 cancels the consumers of a quorum queue before the queue is gone: the
    worker declares it again after the schedule's first step (not at once, which found
    the dying queue and then no queue), and INFO is answered through it again; the
    control queue of its other OJS queue is consumed too."""
    from ojs_kombu import ControlClient
    from ojs_kombu.spec.job_ids import new_job_id

    app = make_app("cancel-control", f"ojs://guest:guest@{HOST}:{PORT}/{quorum_vhost}",
                   "cache+memory://", ojs_queue_defaults={"type": "quorum"})
    events = connection_events(app)
    controls = ["ojs.queue.control.qa", "ojs.queue.control.qb"]
    with in_process_worker(app, ["qa", "qb"], pool="threads", concurrency=2):
        wait_for_consumers(quorum_vhost, controls, 16, "the worker consuming both control queues")
        rabbitmqctl("delete_queue", "-p", quorum_vhost, controls[0])
        wait_until(lambda: any(e["type"] == "consumer.cancelled" for e in events), 30,
                   "consumer.cancelled")
        cancelled = next(e for e in events if e["type"] == "consumer.cancelled")
        assert cancelled["data"]["queue"] == controls[0]
        assert 750 <= cancelled["data"]["retry_in_ms"] <= 1250  # first step of the schedule
        wait_for_consumers(quorum_vhost, controls, 16,
                           "both control queues consumed again with the same prefetch")
        with ControlClient(app) as client:
            for queue in ("qa", "qb"):
                assert client.info(new_job_id(), queue, timeout=10)["state"] == "not_found"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_failover_to_the_next_broker_url(own_vhost: str) -> None:
    """``ojs://dead;ojs://alive``: kombu's failover with the ojs transport."""
    dead = f"ojs://guest:guest@127.0.0.1:{_closed_port()}/{own_vhost}"
    alive = f"ojs://guest:guest@{HOST}:{PORT}/{own_vhost}"
    app = make_app("failover", f"{dead};{alive}", "cache+memory://")
    app.conf.broker_connection_retry_on_startup = True  # failover is a retry
    with in_process_worker(app, ["fq"], pool="threads", concurrency=1):
        result = app.tasks["math.add"].apply_async((20, 22), queue="fq")
        assert app.calls.wait_for(result.id)["args"] == [20, 22]


def test_heartbeats_and_control_outlive_a_reconnect(own_vhost: str) -> None:
    """After the broker drops the worker's connection, its ``worker.heartbeat`` and its
    jobs' ``job.heartbeat`` go on and CANCEL reaches a running job (Celery 5.5 clears
    the worker's timer on each reconnect, 5.7 cancels what was registered while
    connecting: the beats are registered again)."""
    from ojs_kombu.amqp.broker.control import ControlClient

    app = make_app("reconnect-beats", f"ojs://guest:guest@{HOST}:{PORT}/{own_vhost}",
                   "cache+memory://", ojs_worker_heartbeat=0.5, ojs_job_heartbeat=0.5)
    seen: list[tuple[str, str | None, dict[str, Any]]] = []  # OJS events are models

    def record(event: Any) -> None:
        seen.append((event["type"], event.get("subject"), event["data"])
                    if isinstance(event, dict)
                    else (event.type, event.subject, dict(event.data or {})))

    def beats_after(index: int, job_id: str) -> set[str]:
        return {kind for kind, subject, _ in seen[index:]
                if kind == "worker.heartbeat" or (kind == "job.heartbeat"
                                                  and subject == job_id)}

    subscription = ojs_kombu.subscribe(app, record, event_types=[
        "worker.heartbeat", "job.heartbeat", "connection.reconnected"])
    try:
        with in_process_worker(app, ["hq"], pool="threads", concurrency=2):
            # a short job across the reconnect (unacked then, it is redelivered)
            before = app.tasks["loop.until_cancelled"].apply_async((3,), queue="hq")
            wait_until(lambda: beats_after(0, before.id) == {"worker.heartbeat",
                                                             "job.heartbeat"}, 30,
                       "both heartbeats before the reconnect")
            assert close_connections_of(own_vhost) >= 1

            def reconnected() -> int | None:
                return next((i for i, (kind, _, data) in enumerate(seen)
                             if kind == "connection.reconnected"
                             and data.get("role") == "worker"), None)

            wait_until(lambda: reconnected() is not None, 60,
                       "the worker's connection.reconnected event")
            back = reconnected()
            assert back is not None
            after = app.tasks["loop.until_cancelled"].apply_async((60,), queue="hq")
            wait_until(lambda: beats_after(back, after.id) == {"worker.heartbeat",
                                                               "job.heartbeat"}, 30,
                       "both heartbeats after the reconnect")
            with ControlClient(app) as client:
                client.cancel(after.id, "hq", reason="after a reconnect")
            app.calls.wait_for(after.id)  # it saw the cancel and stopped
    finally:
        subscription.cancel()
