"""Connections opened on demand (queue-depth gauges, the AMQP event sink, control) back
off during an outage as section 11.3 says: attempts counted through a local proxy."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from typing import Any

import pytest
from celery import Celery

from ojs_kombu.amqp.broker.control import ControlClient
from ojs_kombu.celery.events import QueueDepths, sink_from_spec
from ojs_kombu.cli.local_proxy import LocalProxy
from ojs_kombu.events.models import make_event
from ojs_kombu.spec.errors import ControlError

from .apps import make_app
from .conftest import HOST, PORT, wait_until

#: Long enough for attempts at about 0, 1, 3, 7 and 15 s after the first failure.
OUTAGE_S = 20.0
#: How often each on-demand user tries during the outage (an exporter, a busy sink).
USE_EVERY_S = 0.2


@pytest.fixture
def proxy() -> Iterator[LocalProxy]:
    with LocalProxy(HOST, PORT) as running:
        yield running


@pytest.fixture
def proxied_app(proxy: LocalProxy, vhost: str) -> Celery:
    return make_app("on-demand", f"ojs://guest:guest@127.0.0.1:{proxy.port}/{vhost}", None)


def use_during_outage(proxy: LocalProxy, use: Callable[[], Any]) -> list[float]:
    """Call ``use`` every :data:`USE_EVERY_S` through an outage; the connection attempts
    the proxy saw, in seconds after it began."""
    use()  # connected before the outage
    started = proxy.cut()
    while time.monotonic() - started < OUTAGE_S:
        with suppress(Exception):
            use()
        time.sleep(USE_EVERY_S)
    attempts = proxy.attempts_since(started)
    proxy.restore()
    return attempts


def assert_backs_off(attempts: list[float], what: str, tight: bool = True) -> None:
    """1, 2, 4, 8 s apart (each +-25 %), not one attempt per use.  ``tight=False``: at
    least that far apart (a user that itself sleeps between tries comes back later)."""
    print(f"{what}: {len(attempts)} attempts in {OUTAGE_S:.0f}s at "
          f"{', '.join(f'{t:.1f}' for t in attempts)}")
    assert 3 <= len(attempts) <= 6, attempts
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    for n, gap in enumerate(gaps, start=1):
        assert 0.75 * 2 ** (n - 1) - 0.3 <= gap, (n, gaps)
        assert not tight or gap <= 1.25 * 2 ** (n - 1) + 0.5, (n, gaps)


def test_queue_depth_gauges_back_off(proxied_app: Celery, proxy: LocalProxy) -> None:
    depths = QueueDepths(proxied_app)
    names = proxied_app.amqp.binding.names
    proxied_app.connection_for_write().ensure_connection().connection.ensure_topology("email")
    attempts = use_during_outage(proxy, lambda: depths.depths(["email"], names.job_queue))
    assert_backs_off(attempts, "queue-depth gauges")


    def back() -> bool:  # at the next attempt of the schedule, not at once
        with suppress(Exception):
            return depths.depths(["email"], names.job_queue) == [("email", 0.0)]
        return False

    wait_until(back, 40, "the gauges after the outage")


def test_the_amqp_event_sink_backs_off(proxied_app: Celery, proxy: LocalProxy) -> None:
    sink, _ = sink_from_spec({"amqp": True, "batch_size": 1}, proxied_app,
                             proxied_app.amqp.binding.names)
    event = make_event("job.enqueued", {"job_type": "math.add", "queue": "email"},
                       source="ojs://test", subject="0190d2a4-0000-7000-8000-000000000001")

    def deliver() -> None:
        sink.deliver_batch([event])

    attempts = use_during_outage(proxy, deliver)
    # the sink sleeps 0.5, 1, 2 s between its own tries of a batch
    assert_backs_off(attempts, "AMQP event sink", tight=False)


def test_control_clients_back_off(proxied_app: Celery, proxy: LocalProxy) -> None:
    def open_client() -> None:
        ControlClient(proxied_app).close()

    attempts = use_during_outage(proxy, open_client)
    assert_backs_off(attempts, "control")
    proxy.cut()
    with suppress(ControlError):
        open_client()  # fails (or is still backing off)
    with pytest.raises(ControlError, match="next attempt in"):
        open_client()  # says when it will try again, without trying
