"""A busy worker writes the acks of jobs that end together in one write, without losing any."""

from __future__ import annotations

from typing import Any

import amqp
import pytest
from celery import Celery

import ojs_kombu
import ojs_kombu.amqp.channel

from .conftest import queue_depth, unacked, wait_until

JOBS = 400


def test_a_backlog_is_acked_in_batches_and_every_job_runs_once(
        app: Celery, worker: Any, vhost: str, amqp_channel: amqp.Channel,
        monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[list[tuple[int, bool]]] = []
    frames = ojs_kombu.amqp.channel.ack_frames

    def spy(channel_id: int, acks: list[tuple[int, bool]]) -> bytes:
        writes.append(list(acks))
        return frames(channel_id, acks)

    monkeypatch.setattr(ojs_kombu.amqp.channel, "ack_frames", spy)
    add = app.tasks["math.add"]
    results = ojs_kombu.enqueue_many(app, [add.s(i, 1000) for i in range(JOBS)])
    for result in results:
        app.calls.wait_for(result.id, timeout=60)  # type: ignore[attr-defined]
    queue = app.amqp.binding.names.job_queue("default")
    wait_until(lambda: unacked(vhost, queue) == 0, timeout=30, what="every job acked",
               interval=1.0)
    assert all(app.calls.count(r.id) == 1 for r in results)  # type: ignore[attr-defined]
    assert queue_depth(amqp_channel, queue) == 0
    # Fewer writes than jobs; one Basic.Ack(multiple=false) per job (section 5.3).
    assert 0 < len(writes) < JOBS
    assert any(len(acks) > 1 for acks in writes)
    assert not any(multiple for acks in writes for _, multiple in acks)
