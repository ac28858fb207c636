"""The envelope model against the official OJS schema fixtures."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from ojs_kombu.envelope import JobEnvelope, RetryPolicy, parse_duration

from .conftest import fixture_files, load

VALID = fixture_files("valid")
INVALID = fixture_files("invalid")


def test_fixture_directories_are_complete() -> None:
    assert len(VALID) == 17
    assert len(INVALID) == 24


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_accepts_every_valid_fixture(path: Path, job_schema: Any) -> None:
    job_schema.validate(load(path))  # the yardstick agrees
    JobEnvelope.from_json(path.read_bytes())


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_rejects_every_invalid_fixture(path: Path) -> None:
    with pytest.raises(ValidationError):
        JobEnvelope.from_json(path.read_bytes())


def _same_meaning(a: Any, b: Any) -> bool:
    """Equal JSON, where two timestamps are equal if they name the same instant."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_meaning(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_meaning(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, str) and isinstance(b, str) and a != b:
        try:
            return datetime.fromisoformat(a) == datetime.fromisoformat(b)
        except ValueError:
            return False
    return (a == b and type(a) is type(b)) or (isinstance(a, float) and a == b)


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_round_trip_preserves_meaning(path: Path, job_schema: Any) -> None:
    original = load(path)
    written = json.loads(JobEnvelope.from_json(path.read_bytes()).to_json())
    assert _same_meaning(original, written), (original, written)
    job_schema.validate(written)


def test_unknown_attributes_survive_exactly() -> None:
    path = next(p for p in VALID if "unknown-attributes" in p.name)
    job = JobEnvelope.from_json(path.read_bytes())
    assert job.extensions["x_custom_field"] == "custom_value"
    assert job.extensions["x_backend_hint"] == {"partition": 3, "shard": "us-east-1"}
    written = json.loads(job.to_json())
    assert written["x_backend_hint"] == {"partition": 3, "shard": "us-east-1"}


def test_absent_attributes_stay_absent() -> None:
    minimal = next(p for p in VALID if "minimal" in p.name)
    written = json.loads(JobEnvelope.from_json(minimal.read_bytes()).to_json())
    assert set(written) == set(load(minimal))


def test_no_type_coercion() -> None:
    base = {"specversion": "1.0", "id": "019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f",
            "type": "email.send", "queue": "default", "args": []}
    with pytest.raises(ValidationError):
        JobEnvelope.from_json(json.dumps({**base, "timeout": "30"}))
    with pytest.raises(ValidationError):
        JobEnvelope.from_json(json.dumps({**base, "scheduled_at": "2026-03-01T09:00:00"}))


def test_retry_policy_defaults_and_durations() -> None:
    policy = RetryPolicy()
    assert (policy.max_attempts, policy.backoff_coefficient, policy.jitter) == (3, 2.0, True)
    assert parse_duration(policy.initial_interval).total_seconds() == 1
    assert parse_duration(policy.max_interval).total_seconds() == 300
    assert parse_duration("PT0.5S").total_seconds() == 0.5
    with pytest.raises(ValidationError):
        RetryPolicy(initial_interval="1 second")
    with pytest.raises(ValidationError):
        RetryPolicy(non_retryable_errors=["A", "A"])
