"""The control plane under green pools (gevent, eventlet): no signal to a greenlet's id,
no second reader of the consumer connection (integration/test_green_pools.py runs it)."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import amqp
import pytest
from celery.concurrency.prefork import TaskPool as PreforkPool

from ojs_kombu.celery import control as celery_control
from ojs_kombu.celery.control_queues import ControlQueues


def _kills(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(celery_control.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    return sent


def test_a_cooperative_cancel_signals_prefork_pool_processes_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sent = _kills(monkeypatch)
    prefork = PreforkPool.__new__(PreforkPool)
    green = SimpleNamespace(is_green=True)
    greenlet_id = 0x7F48DD12F9C0  # what the gevent/eventlet pools report as worker_pid
    celery_control._ask_to_stop(SimpleNamespace(worker_pid=greenlet_id), green)
    celery_control._ask_to_stop(SimpleNamespace(worker_pid=4242), None)
    assert sent == []
    celery_control._ask_to_stop(SimpleNamespace(worker_pid=4242), prefork)
    assert sent == [(4242, celery_control.COOPERATIVE_SIGNAL)]


class _Channel:
    def __init__(self) -> None:
        self.published: list[tuple[Any, ...]] = []

    def publish_confirmed(self, *args: Any, **kwargs: Any) -> None:
        self.published.append((*args, kwargs))


def _parent(hub: Any, pooled: _Channel) -> Any:
    names = SimpleNamespace(direct_exchange="ojs.exchange.direct",
                            control_queue=lambda q: f"ojs.queue.control.{q}")

    @contextmanager
    def producer_or_acquire() -> Any:
        yield SimpleNamespace(channel=pooled)

    app = SimpleNamespace(amqp=SimpleNamespace(binding=SimpleNamespace(names=names)),
                          producer_or_acquire=producer_or_acquire)
    return SimpleNamespace(hub=hub, app=app)


@pytest.mark.parametrize("hub", [object(), None], ids=["event loop", "green pool"])
def test_a_beat_waits_for_its_confirm_off_the_consumer_connection_without_a_loop(
        hub: Any) -> None:
    control, pooled = _Channel(), _Channel()
    beat = amqp.Message("{}", message_id="beat-1")
    ControlQueues._publish_beat(_parent(hub, pooled), control, beat, "email")
    used, unused = (control, pooled) if hub is not None else (pooled, control)
    assert unused.published == []
    assert used.published == [(beat, "ojs.exchange.direct", "ojs.queue.control.email",
                               {"job_id": "beat-1", "queue": "email"})]
