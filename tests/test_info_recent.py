"""What INFO answers of jobs a worker finished: the most recent ones, a bounded number."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ojs_kombu.celery.control import JobRecord, ojs_job_info, outcomes


@pytest.fixture
def three_kept() -> Iterator[None]:
    size = outcomes.size
    outcomes.clear()
    outcomes.size = 3
    try:
        yield
    finally:
        outcomes.clear()
        outcomes.size = size


def finished(job_id: str, state: str = "completed") -> None:
    outcomes.remember(job_id, JobRecord.of(state, 1, "w1", (job_id,), "email"))


def test_the_oldest_finished_job_is_forgotten_first(three_kept: None) -> None:
    for job_id in ("a", "b", "c", "d"):
        finished(job_id)
    assert ojs_job_info(None, "a") is None
    assert [ojs_job_info(None, j)["state"] for j in ("b", "c", "d")] == ["completed"] * 3


def test_a_job_recorded_again_counts_as_the_newest(three_kept: None) -> None:
    finished("a", "retryable")
    finished("b")
    finished("c")
    finished("a")  # its next attempt completed: now the newest record
    finished("d")
    assert ojs_job_info(None, "b") is None
    assert ojs_job_info(None, "a") == {"state": "completed", "attempt": 1, "worker_id": "w1"}
    assert ojs_job_info(None, "email-queue-job") is None
