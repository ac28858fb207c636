"""Priority queues (AMQP-030) where the app asks for them, as in Celery: higher-priority
jobs overtake a backlog on the real broker, and queues an earlier version declared with
``x-max-priority=10`` keep working, and keep their priorities, under the new default."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import amqp
import pytest

from ojs_kombu import declare_topology

from .apps import make_app
from .conftest import HOST, PORT, get_message, private_vhost, rabbitmqctl, wait_until
from .workers import in_process_worker

ROOT = Path(__file__).resolve().parents[1]


def ojs_kombu_cli(broker_url: str, *args: str) -> str:
    """``ojs-kombu ARGS -b broker_url`` (no app: the default settings); its output."""
    env = {k: v for k, v in os.environ.items() if k not in ("CELERY_APP", "OJS_PREFIX")}
    result = subprocess.run([str(Path(sys.executable).parent / "ojs-kombu"), *args,
                             "-b", broker_url], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def queue_arguments(vhost: str, queue: str) -> str:
    """The arguments RabbitMQ holds for ``queue`` (``rabbitmqctl list_queues``)."""
    listing = rabbitmqctl("list_queues", "--no-table-headers", "-p", vhost, "name", "arguments")
    return next(x for x in listing.splitlines() if x.startswith(f"{queue}\t"))


def test_queues_have_priorities_only_where_the_app_asks(broker_url: str, vhost: str) -> None:
    declare_topology(make_app("priority-none", broker_url), ["prio-none"])
    assert "x-max-priority" not in queue_arguments(vhost, "ojs.queue.prio-none")
    asked = make_app("priority-asked", broker_url, task_queue_max_priority=10)
    declare_topology(asked, ["prio-asked"])
    assert '{"x-max-priority",10}' in queue_arguments(vhost, "ojs.queue.prio-asked")
    for sibling in ("dlx", "control"):  # never the job queue's siblings
        assert "x-max-priority" not in queue_arguments(vhost, f"ojs.queue.{sibling}.prio-asked")


def test_high_priority_jobs_overtake_a_backlog(broker_url: str, vhost: str) -> None:
    app = make_app("priority", broker_url, None, worker_prefetch_multiplier=1,
                   task_queue_max_priority=10)
    declare_topology(app, ["bp-prio"])
    assert '{"x-max-priority",10}' in queue_arguments(vhost, "ojs.queue.bp-prio")
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
    app = make_app("priority-map", broker_url, None, ojs_queues={"bp-prio-map": {"priority": 10}})
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


def test_priority_queues_of_an_earlier_version_keep_their_priorities(
        caplog: pytest.LogCaptureFixture) -> None:
    """Earlier versions declared every classic job queue with ``x-max-priority=10``.
    Upgraded with no setting changed, producers, the operator's ``topology declare`` and
    a worker declare it as it is (no 406 PRECONDITION_FAILED), and its jobs keep their
    priorities."""
    queue = "upgraded"
    with private_vhost("ojs-kombu-prio") as vhost:
        broker_url = f"ojs://guest:guest@{HOST}:{PORT}/{vhost}"
        # what earlier versions declared by default
        declare_topology(make_app("earlier", broker_url, ojs_max_priority=10), [queue])
        app = make_app("upgraded", broker_url, None, worker_prefetch_multiplier=1)
        add = app.tasks["math.add"]
        with caplog.at_level(logging.INFO, logger="ojs_kombu"):
            backlog = [add.apply_async((i, 0), queue=queue).id for i in range(10)]
            urgent = [add.apply_async((i, 1), queue=queue, priority=9).id for i in range(3)]
        kept = [r.getMessage() for r in caplog.records if "keeps its priorities" in r.message]
        assert len(kept) == 1 and "'ojs.queue.upgraded'" in kept[0]
        assert "ojs_queues" in kept[0] and "'priority': 10" in kept[0]
        declared = ojs_kombu_cli(broker_url, "topology", "declare", "-q", queue, "--json")
        job = json.loads(declared)["declared"][0]["queues"][0]
        assert job["name"] == f"ojs.queue.{queue}" and job["arguments"]["x-max-priority"] == 10
        listed = json.loads(ojs_kombu_cli(broker_url, "dlq", "list", "-q", queue, "--json"))
        assert listed["dead_letters"] == []
        with in_process_worker(app, [queue], pool="solo", concurrency=1, shutdown_timeout=30):
            wait_until(lambda: len(app.calls.all()) == 13, 60, "13 jobs")
        assert '{"x-max-priority",10}' in queue_arguments(vhost, f"ojs.queue.{queue}")
    order = [call["id"] for call in app.calls.all()]
    assert order[:3] == urgent
    assert order[3:] == backlog
