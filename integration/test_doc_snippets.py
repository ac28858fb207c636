"""The documentation's examples that need RabbitMQ (``examples/snippets``), run against
the real broker in a vhost of their own."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import amqp
import pytest
from celery import Celery
from click.testing import CliRunner

import ojs_kombu
from ojs_kombu.cli import cli
from ojs_kombu.spec.naming import TopologyNames

from .conftest import HOST, PORT, private_vhost, queue_depth, rabbitmqctl, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from snippets import operations, publishing

PREFIX = "snippets"


@pytest.fixture(scope="module")
def vhost() -> Iterator[str]:
    with private_vhost("ojs-kombu-snippets") as name:
        yield name


@pytest.fixture(scope="module")
def url(vhost: str) -> str:
    return f"ojs://guest:guest@{HOST}:{PORT}/{vhost}"


@pytest.fixture
def app(url: str) -> Celery:
    app = ojs_kombu.install(Celery("snippets", broker=url, set_as_current=False))
    app.conf.update(ojs_prefix=PREFIX, broker_connection_retry_on_startup=False)
    return app


def exchanges(vhost: str) -> list[str]:
    names = rabbitmqctl("list_exchanges", "-p", vhost, "name").split()
    return sorted(n for n in names if n.startswith(f"{PREFIX}.ojs.exchange."))


def cli_run(url: str, *args: str) -> None:
    result = CliRunner().invoke(cli, ["--broker", url, *args, "--prefix", PREFIX])
    assert result.exit_code == 0, result.output


def test_the_rollback_snippet_deletes_every_ojs_exchange(url: str, vhost: str) -> None:
    cli_run(url, "topology", "declare", "-q", "email", "--schedule")
    before = exchanges(vhost)
    # what the rollback page lists (docs/conf.py: |ojs_exchange_count| leaves out the
    # events exchange, which the operator's declare makes too, and the delayed one)
    names = TopologyNames(prefix=PREFIX)
    assert sorted(names.exchanges(delayed=False)) == before
    deleted = operations.delete_exchanges(url, prefix=PREFIX)
    assert set(before) <= set(deleted)
    assert exchanges(vhost) == []


def test_the_dead_letter_snippet_reads_replays_and_purges(app: Celery, url: str,
                                                          amqp_channel: amqp.Channel,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    cli_run(url, "topology", "declare", "-q", "email")
    ids = []
    for n in range(3):
        result = CliRunner().invoke(cli, ["--broker", url, "enqueue", "email.send",
                                          f'["user{n}@example.com"]', "-q", "email",
                                          "--prefix", PREFIX])
        assert result.exit_code == 0, result.output
        ids.append(result.stdout.strip().split()[-1])
    job_queue = f"{PREFIX}.ojs.queue.email"
    for _ in ids:  # a consumer that gives up on each: the broker dead-letters it
        message = amqp_channel.basic_get(job_queue)
        amqp_channel.basic_reject(message.delivery_tag, requeue=False)
    wait_until(lambda: queue_depth(amqp_channel, f"{PREFIX}.ojs.queue.dlx.email") == 3, 20,
               "the broker dead-lettering the three")  # it does so after the reject returns
    operations.dead_letters(app, ids[0])
    printed = capsys.readouterr().out
    assert all(job_id in printed for job_id in ids)
    # replay(ids[0]) then replay_all() put all three back; purge() found none left
    assert queue_depth(amqp_channel, job_queue) == 3
    assert queue_depth(amqp_channel, f"{PREFIX}.ojs.queue.dlx.email") == 0


def test_the_batch_snippet_enqueues_every_job(app: Celery, amqp_channel: amqp.Channel) -> None:
    @app.task(name="email.send", shared=False)
    def send_email(to: str, template: str) -> None:
        return None

    @app.task(name="images.resize", shared=False)
    def resize(image: str) -> None:
        return None

    @app.task(name="reports.build", shared=False)
    def build(month: str, fmt: str) -> None:
        return None

    results: list[Any] = publishing.batch(app, send_email, resize, ["a.png", "b.png"])
    assert len(results) == 5 and len({r.id for r in results}) == 5
    assert queue_depth(amqp_channel, f"{PREFIX}.ojs.queue.reports") == 1
    assert queue_depth(amqp_channel, f"{PREFIX}.ojs.queue.default") == 3  # one waits 60 s
