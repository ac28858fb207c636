"""INFO requests are answered by a bounded pool with a bounded backlog (worker side)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from celery import Celery

from ojs_kombu.celery.control_queues import INFO_BACKLOG, INFO_THREADS, ControlQueues


def _wait_for(predicate: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_burst_of_info_requests_uses_a_few_threads_and_drops_beyond_the_backlog(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    release = threading.Event()
    running: set[int] = set()
    answered: list[str] = []
    lock = threading.Lock()

    def slow_answer(app: Any, job_id: str, reply_to: str, correlation_id: Any, *_: Any) -> None:
        with lock:
            running.add(threading.get_ident())
        release.wait(10)
        with lock:
            answered.append(job_id)

    monkeypatch.setattr(ControlQueues, "answer", staticmethod(slow_answer))
    step = ControlQueues(None)  # the bootstep as Celery's consumer builds it
    app = Celery("info", set_as_current=False)
    before = threading.active_count()
    try:
        with caplog.at_level(logging.WARNING, logger="ojs_kombu.celery.control_queues"):
            taken = [step.answer_later(app, f"job-{n}", "reply", None)
                     for n in range(INFO_BACKLOG + 10)]
        assert taken.count(True) == INFO_BACKLOG and taken[-10:] == [False] * 10
        assert threading.active_count() - before <= INFO_THREADS
        assert "dropping INFO request for job job-" in caplog.text
        release.set()
        _wait_for(lambda: len(answered) == INFO_BACKLOG)
        assert sorted(answered) == sorted(f"job-{n}" for n in range(INFO_BACKLOG))
        assert len(running) <= INFO_THREADS
        # slots come back once answered: the whole backlog is taken again
        _wait_for(lambda: step.answer_later(app, "again", "reply", None))
        _wait_for(lambda: "again" in answered)
    finally:
        release.set()
        step.shutdown(None)
    # a worker that shut down takes no more INFO requests
    assert step.answer_later(app, "after", "reply", None) is False
