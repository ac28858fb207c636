"""``celery -A proj purge -Q email`` empties the job queue ``ojs.queue.email``."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import amqp
import kombu
import pytest
from celery import Celery

from .apps import make_app
from .conftest import HOST, PORT, publish_raw, queue_depth, rabbitmqctl, wait_until

ROOT = Path(__file__).resolve().parents[1]


def celery_purge(broker_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OJS_TEST_BROKER_URL": broker_url}
    return subprocess.run([sys.executable, "-m", "celery", "-A", "integration.cliapp",
                           "purge", "-f", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def client(broker_url: str) -> Celery:
    return make_app("purge-client", broker_url, "cache+memory://")


def enqueue(client: Celery, channel: amqp.Channel, queue: str, count: int) -> None:
    for n in range(count):
        client.send_task("math.add", args=[n, 1], queue=queue)
    wait_until(lambda: queue_depth(channel, f"ojs.queue.{queue}") == count,
               what=f"{count} jobs in ojs.queue.{queue}")


def test_purge_by_celery_queue_name_empties_the_job_queue(
        broker_url: str, client: Celery, amqp_channel: amqp.Channel) -> None:
    email, other = f"purge-{uuid.uuid4().hex[:8]}", f"purge-{uuid.uuid4().hex[:8]}"
    enqueue(client, amqp_channel, email, 3)
    enqueue(client, amqp_channel, other, 2)

    result = celery_purge(broker_url, "-Q", email)

    assert result.returncode == 0, result.stderr
    assert "Purged 3 messages from 1 known task queue." in result.stdout, result.stdout
    assert queue_depth(amqp_channel, f"ojs.queue.{email}") == 0
    assert queue_depth(amqp_channel, f"ojs.queue.{other}") == 2


def test_purge_by_amqp_name_still_works(broker_url: str, client: Celery,
                                        amqp_channel: amqp.Channel) -> None:
    queue = f"purge-{uuid.uuid4().hex[:8]}"
    enqueue(client, amqp_channel, queue, 2)

    result = celery_purge(broker_url, "-Q", f"ojs.queue.{queue}")

    assert "Purged 2 messages from 1 known task queue." in result.stdout, result.stdout
    assert queue_depth(amqp_channel, f"ojs.queue.{queue}") == 0


def test_a_queue_without_a_job_queue_is_purged_as_named(
        broker_url: str, amqp_channel: amqp.Channel) -> None:
    """A plain Celery queue (a producer not yet switched to ojs://) keeps its own name."""
    legacy = f"legacy-{uuid.uuid4().hex[:8]}"
    amqp_channel.queue_declare(legacy, durable=True, auto_delete=False)
    for n in range(2):
        publish_raw(amqp_channel, amqp.Message(f"old {n}"), legacy, exchange="")
    wait_until(lambda: queue_depth(amqp_channel, legacy) == 2, what="the plain messages")

    result = celery_purge(broker_url, "-Q", legacy)

    assert "Purged 2 messages from 1 known task queue." in result.stdout, result.stdout
    assert queue_depth(amqp_channel, legacy) == 0


def test_purge_without_queues_empties_the_apps_queues() -> None:
    """Plain ``celery purge`` purges the app's queues by their Celery names (``celery``
    is the OJS queue ``default``), in a vhost of its own: other tests use ``default``."""
    vhost = f"ojs-kombu-purge-{uuid.uuid4().hex[:8]}"
    rabbitmqctl("add_vhost", vhost)
    try:
        rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        broker_url = f"ojs://guest:guest@{HOST}:{PORT}/{vhost}"
        producer = make_app("purge-default", broker_url, "cache+memory://")
        for n in range(2):
            producer.send_task("math.add", args=[n, 1])
        connection = amqp.Connection(f"{HOST}:{PORT}", virtual_host=vhost)
        connection.connect()
        try:
            channel = connection.channel()
            wait_until(lambda: queue_depth(channel, "ojs.queue.default") == 2,
                       what="2 jobs in ojs.queue.default")

            result = celery_purge(broker_url)

            assert "Purged 2 messages from 1 known task queue." in result.stdout, result.stdout
            assert queue_depth(channel, "ojs.queue.default") == 0
        finally:
            connection.close()
    finally:
        rabbitmqctl("delete_vhost", vhost)


def fill_both(client: Celery, channel: amqp.Channel, name: str, plain: int, jobs: int) -> None:
    """Migration: old workers' plain queue ``name`` beside the job queue ``ojs.queue.name``."""
    channel.queue_declare(name, durable=True, auto_delete=False)
    for n in range(plain):
        publish_raw(channel, amqp.Message(f"old {n}"), name, exchange="")
    enqueue(client, channel, name, jobs)
    wait_until(lambda: queue_depth(channel, name) == plain, what="the plain messages")


def depths(channel: amqp.Channel, name: str) -> tuple[int, int]:
    return queue_depth(channel, name), queue_depth(channel, f"ojs.queue.{name}")


def test_kombus_own_purge_acts_on_the_queue_it_names(
        broker_url: str, client: Celery, amqp_channel: amqp.Channel) -> None:
    """kombu's calls through ``ojs://`` empty what they name, as on ``amqp://``, whatever
    their shape: ``channel.queue_purge('pq')`` (positional), ``queue_purge(queue='pq')``
    and ``Queue('pq').purge()`` empty the plain queue ``pq`` and leave ``ojs.queue.pq``
    full; then ``celery purge -Q pq`` (a Celery queue name) empties the job queue."""
    name = f"pq-{uuid.uuid4().hex[:8]}"
    fill_both(client, amqp_channel, name, plain=2, jobs=1)
    try:
        with kombu.Connection(broker_url) as connection:
            assert connection.default_channel.queue_purge(name) == 2
            assert depths(amqp_channel, name) == (0, 1)
            publish_raw(amqp_channel, amqp.Message("old again"), name, exchange="")
            wait_until(lambda: queue_depth(amqp_channel, name) == 1, what="a plain message")
            assert connection.default_channel.queue_purge(queue=name) == 1
            assert depths(amqp_channel, name) == (0, 1)
            publish_raw(amqp_channel, amqp.Message("old again"), name, exchange="")
            wait_until(lambda: queue_depth(amqp_channel, name) == 1, what="a plain message")
            purged = kombu.Queue(name, channel=connection.default_channel).purge()
        assert purged == 1
        assert depths(amqp_channel, name) == (0, 1)

        result = celery_purge(broker_url, "-Q", name)
        assert "Purged 1 message from 1 known task queue." in result.stdout, result.stdout
        assert depths(amqp_channel, name) == (0, 0)
    finally:
        amqp_channel.queue_delete(name)


def test_control_purge_empties_the_apps_job_queues_not_a_plain_queue(
        broker_url: str, amqp_channel: amqp.Channel) -> None:
    """``app.control.purge()`` (Celery's control purge) empties the job queues of the
    app's queue table, and a plain queue of the same Celery name is left alone."""
    name = f"pq-{uuid.uuid4().hex[:8]}"
    app = make_app("purge-control", broker_url, "cache+memory://")
    app.conf.task_queues = [kombu.Queue(name)]
    fill_both(app, amqp_channel, name, plain=2, jobs=3)
    try:
        assert app.control.purge() == 3
        assert depths(amqp_channel, name) == (2, 0)
    finally:
        amqp_channel.queue_delete(name)
