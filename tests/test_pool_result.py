"""The task result ``job.completed`` carries, read back from what Celery's pool reports."""

from __future__ import annotations

from typing import Any

import pytest
from celery.utils.saferepr import saferepr

from ojs_kombu.celery.request import pool_result
from ojs_kombu.events.emitter import json_result


class Opaque:
    def __repr__(self) -> str:
        return "<Opaque thing>"


@pytest.mark.parametrize(("returned", "expected"), [
    (None, None),
    (True, {"value": True}),
    (False, {"value": False}),
    (0, {"value": 0}),
    ("None", {"value": "None"}),  # the string, not the constant
    ({"sent": True, "id": 7}, {"sent": True, "id": 7}),
    ([1, "two", None], {"value": [1, "two", None]}),
    (Opaque(), {"repr": "<Opaque thing>"}),
])
def test_job_completed_result_from_the_pool_repr(returned: Any, expected: Any) -> None:
    # Celery's pool hands the worker saferepr(result), never the value itself.
    assert json_result(pool_result(saferepr(returned))) == expected


def test_a_value_the_pool_passes_through_unchanged() -> None:
    assert pool_result({"a": 1}) == {"a": 1}
