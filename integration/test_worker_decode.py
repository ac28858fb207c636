"""The worker decodes each consumed job once (issue #8, worker path)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from kombu.serialization import registry

from ojs_kombu.spec.envelope import CONTENT_TYPE


@pytest.fixture
def pool_decodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """Every body the ``application/openjobspec+json`` decoder is asked to read."""
    seen: list[bytes] = []
    decode = registry._decoders[CONTENT_TYPE]

    def counting(body: Any) -> Any:
        seen.append(body)
        return decode(body)

    monkeypatch.setitem(registry._decoders, CONTENT_TYPE, counting)
    yield seen


def test_the_pool_runs_the_job_without_decoding_its_body_again(
        app: Celery, worker: Any, pool_decodes: list[bytes]) -> None:
    """The transport validates the envelope and hands Celery its ``(args, kwargs)``;
    the pool runs the task from those, not from a second JSON decode of the body."""
    result = app.tasks["proj.tasks.Legacy"].apply_async(
        (1, "two", [3]), {"four": {"five": 5}}, queue="default")
    assert result.get(timeout=20) == {"args": [1, "two", [3]], "kwargs": {"four": {"five": 5}}}
    assert pool_decodes == []
