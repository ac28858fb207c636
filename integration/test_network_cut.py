"""A worker whose broker goes silent while its TCP connections stay up comes back.

A load balancer or TCP proxy whose broker is gone, or a frozen broker, keeps
acknowledging TCP and answers nothing (a plain network cut differs: py-amqp's
``TCP_USER_TIMEOUT`` ends a connection whose writes go unacknowledged).  Here a
TCP proxy goes silent both ways (:mod:`.blackhole`): the worker notices it by its
heartbeats (``broker_heartbeat`` of 2 s), reconnects, and closes its old
connections first, and Celery's mingle asks the other workers over a pooled
connection made before the cut.  Each of those waits for an answer that never
comes: py-amqp waits for ever (the worker hung in the event dispatcher's close,
consuming nothing), the ``ojs`` transport at most ``CLOSE_TIMEOUT_S`` for a close and
two heartbeat intervals of silence for any other reply.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ojs_kombu.amqp.transport import CLOSE_TIMEOUT_S

from .apps import make_app
from .blackhole import Blackhole
from .conftest import HOST, PORT, private_vhost
from .workers import launch_worker

REDIS = "redis://127.0.0.1:6379/0"


@pytest.fixture
def own_vhost() -> Iterator[str]:
    with private_vhost("ojs-kombu-cut") as name:
        yield name


def test_a_worker_whose_broker_goes_silent_reconnects_and_runs_jobs_again(
        own_vhost: str, tmp_path: Path) -> None:
    direct = f"ojs://guest:guest@{HOST}:{PORT}/{own_vhost}"
    # results through Redis, not the broker: the worker's result publishes on a
    # connection cut before it noticed are lost with plain Celery's rpc:// too
    app = make_app("cut-producer", direct, REDIS)
    log = tmp_path / "worker.log"
    with Blackhole(HOST, PORT) as proxy:
        proxied = f"ojs://guest:guest@127.0.0.1:{proxy.port}/{own_vhost}"
        # mingle and gossip on, as `celery worker` runs by default: the event
        # dispatcher's connection is one of those the reconnect closes
        with launch_worker(proxied, "integration.cliapp", "cutq", pool="threads",
                           without=(), log=log, control=True,
                           env={"OJS_TEST_BROKER_HEARTBEAT": "2",
                                "OJS_TEST_RESULT_BACKEND": REDIS}) as worker:
            published, ran = 0, 0
            for n in range(3):
                published += 1
                ran += app.tasks["math.add"].apply_async((n, 1), queue="cutq").get(
                    timeout=30) == n + 1
            assert proxy.cut() >= 2  # the consumer's connection and the others
            cut_at = time.monotonic()
            results = [app.tasks["math.add"].apply_async((n, 10), queue="cutq")
                       for n in range(20)]
            published += len(results)
            deadline = 30 + 3 * CLOSE_TIMEOUT_S
            try:
                ran += sum(result.get(timeout=deadline) == n + 10
                           for n, result in enumerate(results))
            except Exception as exc:
                raise AssertionError(f"{exc!r}; the worker's log:\n"
                                     f"{worker.log_text()[-4000:]}") from None
            back_after = time.monotonic() - cut_at
            text = worker.log_text()
            dropped = [line for line in text.splitlines() if "dropping the connection" in line]
            print(*dropped, sep="\n")
            print(f"[network cut] published={published} ran={ran} lost={published - ran} "
                  f"back_after_s={back_after:.1f}")
            assert ran == published, text[-3000:]
            assert worker.alive(), text[-3000:]
            assert "Connection to broker lost" in text
            assert dropped  # a bounded wait was needed
