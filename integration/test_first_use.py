"""First use of ``ojs://``: an app that ``ojs_kombu.install(app)`` never wired is refused
at once (its worker at start, its first publish), and the uses of ``ojs://`` that need
no ``install()`` go on: a kombu producer's task message, the CLI's own connections,
``celery inspect`` from an installed app and from the bare command line."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import amqp
import kombu
import pytest
from amqp.exceptions import NotFound
from celery import Celery

import ojs_kombu
from ojs_kombu import AppNotInstalledError

from .conftest import HOST, PORT, get_message
from .workers import ROOT, launch_worker


def celery(broker_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m celery ARGS`` as a user runs it, from the repository root."""
    env = {**os.environ, "OJS_TEST_BROKER_URL": broker_url}
    return subprocess.run([sys.executable, "-m", "celery", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def queue_depth(vhost: str, queue: str) -> int | None:
    """Messages ready in ``queue``; ``None`` when it does not exist (passive declare)."""
    connection = amqp.Connection(f"{HOST}:{PORT}", virtual_host=vhost)
    connection.connect()
    try:
        return connection.channel().queue_declare(queue, passive=True).message_count
    except NotFound:
        return None
    finally:
        if connection.connected:
            connection.close()


@pytest.fixture()
def forgetful_app(broker_url: str) -> Iterator[Celery]:
    """An app on ``ojs://`` that was never installed, routing its task to a queue of
    this test only."""
    app = Celery("forgetful", broker=broker_url, set_as_current=False)
    app.conf.task_routes = {"orders.validate": {"queue": "firstuse"}}

    @app.task(name="orders.validate", shared=False)
    def validate(order_id: str) -> str:
        return order_id

    yield app
    app.close()
    # Celery declares the routed queue and its exchange before the publish the transport
    # refuses; the suite's other modules find only OJS names in the session's vhost
    with kombu.Connection(broker_url.replace("ojs://", "amqp://", 1)) as connection:
        channel = connection.channel()
        channel.queue_delete("firstuse")
        channel.exchange_delete("firstuse")


def test_first_publish_of_an_uninstalled_app_is_refused(forgetful_app: Celery,
                                                          vhost: str) -> None:
    with pytest.raises(AppNotInstalledError, match=r"ojs_kombu\.install\(app\)"):
        forgetful_app.send_task("orders.validate", ("order-7",))
    # nothing reached a queue: neither Celery's nor the OJS job queue holds the call
    assert queue_depth(vhost, "firstuse") in (None, 0)
    assert queue_depth(vhost, "ojs.queue.firstuse") in (None, 0)


def test_the_same_app_publishes_once_installed(forgetful_app: Celery, vhost: str,
                                               amqp_channel: amqp.Channel) -> None:
    ojs_kombu.install(forgetful_app)
    forgetful_app.send_task("orders.validate", ("order-8",))
    message = get_message(amqp_channel, "ojs.queue.firstuse")
    assert message.properties["content_type"] == ojs_kombu.CONTENT_TYPE


def test_worker_of_an_uninstalled_app_stops_at_start(broker_url: str, vhost: str) -> None:
    run = celery(broker_url, "-A", "integration.uninstalledapp", "worker", "--pool", "solo",
                 "-Q", "firstuse-worker")
    assert run.returncode != 0
    assert "AppNotInstalledError" in run.stderr
    assert "ojs_kombu.install(app)" in run.stderr
    # it stopped before consuming: the queue it was told to consume was never declared
    assert queue_depth(vhost, "firstuse-worker") is None
    assert queue_depth(vhost, "ojs.queue.firstuse-worker") is None


def test_celery_ojs_command_says_whether_the_app_is_installed(broker_url: str) -> None:
    forgot = celery(broker_url, "-A", "integration.uninstalledapp", "ojs")
    assert forgot.returncode == 1 and "NOT installed" in forgot.stdout
    installed = celery(broker_url, "-A", "integration.cliapp", "ojs")
    assert installed.returncode == 0 and "installed" in installed.stdout


def test_bare_worker_stops_saying_what_to_do(broker_url: str) -> None:
    """``celery -b ojs://... worker`` without ``-A``: ojs_kombu is imported by Celery's
    CLI (the ``celery.commands`` entry point), so ``ojs://`` resolves; the default
    app was never installed, so the worker stops, naming what to do."""
    run = celery(broker_url, "-b", broker_url, "worker", "--pool", "solo")
    assert run.returncode != 0
    assert "No such transport" not in run.stderr
    assert "AppNotInstalledError" in run.stderr
    assert "ojs_kombu.install(app)" in run.stderr and "-A" in run.stderr


def test_a_kombu_producers_task_message_is_still_published_as_a_job(
        broker_url: str, amqp_channel: amqp.Channel) -> None:
    """kombu alone (no Celery app, no ``install()``): a task message with a ``task``
    header and a JSON body is published as its OJS job (docs/mapping.rst)."""
    job_id = ojs_kombu.new_job_id()
    with kombu.Connection(broker_url) as connection:
        connection.Producer().publish(
            [["order-9"], {}, {}], routing_key="firstuse-kombu", serializer="json",
            headers={"task": "orders.validate", "id": job_id, "lang": "py"})
    message = get_message(amqp_channel, "ojs.queue.firstuse-kombu")
    assert message.properties["content_type"] == ojs_kombu.CONTENT_TYPE
    assert message.properties["message_id"] == job_id


def test_inspect_from_an_installed_app_and_from_the_bare_command_line(
        broker_url: str) -> None:
    with launch_worker(broker_url, "integration.cliapp", "firstuse-inspect",
                       pool="solo", concurrency=1, control=False) as worker:
        node = worker.hostname.replace("%h", "")
        from_app = celery(broker_url, "-A", "integration.cliapp", "inspect", "ping",
                          "--timeout", "10")
        assert from_app.returncode == 0, from_app.stderr
        assert "pong" in from_app.stdout and node in from_app.stdout
        bare = celery(broker_url, "-b", broker_url, "inspect", "ping", "--timeout", "10")
        assert bare.returncode == 0, bare.stderr
        assert "pong" in bare.stdout and node in bare.stdout
