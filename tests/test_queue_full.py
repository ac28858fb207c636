"""Which backpressure error a caller gets: the broker's nack, or a refusal before sending.

Both are a ``QueueFullError`` (the 429); only the broker's is a ``JobNackedError``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from ojs_kombu.amqp.backpressure.monitor import BackpressureMonitor
from ojs_kombu.spec.backpressure import Bounds, ProducerBackpressure
from ojs_kombu.spec.errors import (
    BatchPublishError,
    BatchQueueFullNacked,
    BatchQueueFullRefused,
    JobNackedError,
    QueueFullError,
    QueueFullNacked,
    QueueFullRefused,
)

FULL = Bounds(max_depth=1, overflow="reject-publish")


@dataclass(frozen=True)
class Job:
    job_id: str
    queue: str = "email"
    job_type: str = "email.send"
    delay_ms: int = 0


def monitor(**settings: object) -> BackpressureMonitor:
    return BackpressureMonitor(ProducerBackpressure(**settings), lambda _q: FULL,
                               clock=lambda: 0.0, sleep=lambda _s: None)


def test_a_nack_of_a_full_queue_is_queue_full_nacked() -> None:
    error = monitor().nack_error("email", "j1", lambda _q: 1)
    assert isinstance(error, QueueFullNacked)
    assert isinstance(error, QueueFullError) and isinstance(error, JobNackedError)


def test_an_open_circuit_refuses_without_a_nack() -> None:
    bp = monitor(circuit_breaker=True, breaker_threshold=1, breaker_cooldown=5.0)
    sent: list[str] = []

    def send() -> None:
        sent.append("j")
        raise bp.nack_error("email", "j")

    with pytest.raises(QueueFullNacked):
        bp.publish("email", "j1", "email.send", send)
    with pytest.raises(QueueFullRefused) as info:
        bp.publish("email", "j2", "email.send", send)
    assert sent == ["j"] and info.value.circuit_open
    assert isinstance(info.value, QueueFullError)
    assert not isinstance(info.value, JobNackedError)


def test_a_batch_refused_before_sending_is_no_nack() -> None:
    with pytest.raises(BatchQueueFullRefused) as info:
        monitor().admit_batch([Job("a"), Job("b")], lambda _q: 0)
    error = info.value
    assert isinstance(error, QueueFullError) and isinstance(error, BatchPublishError)
    assert not isinstance(error, JobNackedError) and error.accepted == ()


def test_a_sent_batch_the_broker_nacked_is_batch_queue_full_nacked() -> None:
    base = BatchPublishError("1 of 2 jobs were not accepted", rejected={"b": "nacked"},
                             unconfirmed=(), accepted=("a",))
    error = monitor().batch_error([Job("a"), Job("b")], base, {"b"}, lambda _q: 1)
    assert isinstance(error, BatchQueueFullNacked) and isinstance(error, JobNackedError)
    assert isinstance(error, QueueFullError) and error.accepted == ("a",)
