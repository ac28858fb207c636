"""The docs' Prometheus recipe, followed by a real worker in each pool.

``integration.metricsapp`` sets the global ``MeterProvider`` as the docs say;
the tests scrape the worker's Prometheus endpoint over HTTP, as Prometheus does.
"""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import amqp
import pytest
from celery import Celery
from prometheus_client.parser import text_string_to_metric_families

from .apps import make_app
from .conftest import HOST, PORT, private_vhost, rabbitmqctl, wait_until
from .workers import WorkerProcess, launch_worker

#: The binding's section 12.1, as Prometheus names them.
SECTION_12_1 = [
    "ojs_amqp_connections_active", "ojs_amqp_channels_active",
    "ojs_amqp_messages_published_total", "ojs_amqp_messages_consumed_total",
    "ojs_amqp_messages_acked_total", "ojs_amqp_messages_nacked_total",
    "ojs_amqp_messages_returned_total", "ojs_amqp_messages_unacked",
    "ojs_amqp_consumer_utilization", "ojs_amqp_publish_confirm_latency_seconds_count",
    "ojs_amqp_reconnections_total",
]
#: Sample name -> [(labels, value)].
Samples = dict[str, list[tuple[dict[str, str], float]]]


@pytest.fixture(scope="module")
def metrics_vhost() -> Iterator[str]:
    """A vhost of this module only: one test closes every connection in it."""
    with private_vhost("ojs-kombu-metrics") as name:
        yield name


@pytest.fixture(scope="module")
def url(metrics_vhost: str) -> str:
    return f"ojs://guest:guest@{HOST}:{PORT}/{metrics_vhost}"


@pytest.fixture(scope="module")
def client(url: str) -> Celery:
    return make_app("metrics-client", url, "rpc://")


@pytest.fixture
def start_worker(url: str, tmp_path: Path) -> Iterator[Callable[[str, str], int]]:
    """``start_worker(pool, queue)`` runs ``celery -A integration.metricsapp worker``;
    returns its metrics port."""
    workers: list[WorkerProcess] = []

    def start(pool: str, queue: str) -> int:
        port = _free_port()
        workers.append(launch_worker(url, "integration.metricsapp", queue, pool=pool,
                                     hostname=f"metrics-{pool}@%h", concurrency=2,
                                     log=tmp_path / f"{pool}.log",
                                     env={"OJS_TEST_METRICS_PORT": str(port)}))
        return port

    yield start
    for worker in workers:
        worker.stop()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(port: int) -> Samples:
    """What Prometheus reads from ``http://127.0.0.1:{port}/metrics``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The value of ``name`` whose labels include ``labels`` (``None``: no such sample)."""
    found = [v for have, v in samples.get(name, []) if labels.items() <= have.items()]
    assert len(found) <= 1, (name, labels, samples.get(name))
    return found[0] if found else None


@pytest.mark.parametrize("pool", ["prefork", "threads", "solo"])
def test_job_metrics_reach_prometheus(pool: str, client: Celery,
                                      start_worker: Callable[[str, str], int],
                                      tmp_path: Path) -> None:
    queue = f"metrics-{pool}"
    port = start_worker(pool, queue)
    gate = tmp_path / "gate"
    running = client.tasks["sleep.for"].apply_async((60, str(gate)), queue=queue)
    # While a job runs, its delivery is unacked and fills part of the prefetch window.
    during = wait_until(lambda: (s := scrape(port)) and value(
        s, "ojs_amqp_messages_unacked", queue=queue) == 1 and s, timeout=20,
        what="the running job's unacked delivery")
    assert 0 < value(during, "ojs_amqp_consumer_utilization", queue=queue) <= 1
    gate.touch()  # the job may end now
    assert running.get(timeout=30) == 60
    results = [client.tasks["math.add"].apply_async((i, 1), queue=queue) for i in range(3)]
    assert [r.get(timeout=30) for r in results] == [1, 2, 3]
    client.tasks["reject.value"].apply_async(queue=queue)  # discarded: nacked, failed

    add = {"job_type": "math.add", "queue": queue}
    def settled() -> Samples | None:  # acks and the nack go out after the job's events
        s = scrape(port)
        done = (value(s, "ojs_jobs_failed_total", queue=queue) == 1
                and value(s, "ojs_jobs_completed_total", **add) == 3
                and value(s, "ojs_amqp_messages_acked_total", queue=queue) == 4
                and value(s, "ojs_amqp_messages_nacked_total", queue=queue) == 1)
        return s if done else None

    samples = wait_until(settled, timeout=30, what="the completions, the discard, their acks")
    assert value(samples, "ojs_jobs_duration_ms_count", **add) == 3
    assert value(samples, "ojs_jobs_duration_ms_bucket", le="+Inf", **add) == 3
    assert value(samples, "ojs_jobs_wait_ms_count", **add) == 3
    assert value(samples, "ojs_amqp_messages_consumed_total", queue=queue) == 5
    assert value(samples, "ojs_amqp_messages_unacked", queue=queue) == 0
    assert value(samples, "ojs_amqp_consumer_utilization", queue=queue) == 0
    assert value(samples, "ojs_amqp_connections_active") >= 1
    assert value(samples, "ojs_amqp_channels_active") >= 1
    assert value(samples, "ojs_queue_depth", queue=queue) == 0
    assert value(samples, "ojs_dead_letter_depth", queue=queue) == 1
    names = set(samples)
    assert not [n for n in names if "_ms_milliseconds" in n or "seconds_seconds" in n], names
    for labelled in samples.values():
        for labels, _ in labelled:
            assert "job_id" not in labels


def test_all_amqp_metrics_of_section_12_1_are_exported(
        client: Celery, start_worker: Callable[[str, str], int], metrics_vhost: str) -> None:
    queue, side = "metrics-amqp", "metrics-side"
    port = start_worker("threads", queue)
    assert client.tasks["math.add"].apply_async((1, 2), queue=queue).get(timeout=30) == 3
    client.tasks["reject.value"].apply_async(queue=queue)
    # The worker publishes a job (confirmed) ...
    def enqueue() -> str:
        return client.send_task("metrics.enqueue", (side,), queue=queue).get(timeout=30)

    assert enqueue() == "published"
    # ... and one the broker returns: its queue is gone.
    connection = amqp.Connection(f"{HOST}:{PORT}", virtual_host=metrics_vhost)
    connection.connect()
    try:
        connection.channel().queue_delete(f"ojs.queue.{side}")
    finally:
        connection.close()
    assert enqueue() == "returned"
    # The broker drops the worker's connections: it reconnects.
    rabbitmqctl("close_all_connections", "--vhost", metrics_vhost, "--limit", "100",
                "metrics test")

    # Reconnected first, consuming again a moment later: the consumer gauges
    # (unacked, utilization) have readings once the consumers are back.
    samples = wait_until(lambda: (s := scrape(port)) and value(
        s, "ojs_amqp_reconnections_total", outcome="succeeded", role="worker") and value(
        s, "ojs_amqp_messages_nacked_total", queue=queue) and s, timeout=60,
        what="the worker's reconnection")
    try:
        samples = wait_until(lambda: (s := scrape(port)) and all(
            name in s for name in SECTION_12_1) and s, timeout=30,
            what="every metric of section 12.1")
    except AssertionError:
        missing = [name for name in SECTION_12_1 if name not in scrape(port)]
        raise AssertionError(f"not exported: {missing}") from None
    assert value(samples, "ojs_amqp_messages_published_total", queue=side) == 1
    assert value(samples, "ojs_amqp_messages_returned_total", queue=side) == 1
    assert value(samples, "ojs_amqp_publish_confirm_latency_seconds_count") >= 1
    assert value(samples, "ojs_amqp_connections_active") >= 1
