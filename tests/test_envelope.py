"""The envelope model against the project's own fixtures and the official OJS schema fixtures.

``tests/fixtures`` (written from the spec) always runs; the official fixtures
and schema cross-checks run when the OJS spec folder is there (``OJS_SHARED_DIR``).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from ojs_kombu.spec.envelope import JobEnvelope, RetryPolicy, parse_duration

from .ojs_schemas import (
    fixture_files,
    load,
    official_fixture_params,
    own_fixture_files,
    require_official_fixtures,
)

VALID = official_fixture_params("valid")
INVALID = official_fixture_params("invalid")
OWN_VALID = own_fixture_files("valid")
OWN_INVALID = own_fixture_files("invalid")
#: Own invalid fixtures the official schema cannot reject: ``format: date-time``
#: is only an annotation in draft 2020-12 (the spec still requires a zone).
SCHEMA_SILENT = {"31-scheduled-at-without-zone.json", "32-expires-at-without-zone.json",
                 "33-created-at-date-only.json"}


def test_fixture_directories_are_complete() -> None:
    require_official_fixtures()
    assert len(fixture_files("valid")) == 17
    assert len(fixture_files("invalid")) == 24


@pytest.mark.parametrize("path", VALID)
def test_accepts_every_valid_fixture(path: Path, job_schema: Any) -> None:
    job_schema.validate(load(path))  # the yardstick agrees
    JobEnvelope.from_json(path.read_bytes())


@pytest.mark.parametrize("path", INVALID)
def test_rejects_every_invalid_fixture(path: Path) -> None:
    with pytest.raises(ValidationError):
        JobEnvelope.from_json(path.read_bytes())


# -- the project's own fixtures (tests/fixtures), always ----------------------------------


def test_own_fixtures_are_there() -> None:
    assert len(OWN_VALID) >= 10 and len(OWN_INVALID) >= 15
    ids = [load(p)["id"] for p in OWN_VALID]
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("path", OWN_VALID, ids=lambda p: p.name)
def test_accepts_every_own_valid_fixture(path: Path) -> None:
    job = JobEnvelope.from_json(path.read_bytes())
    written = json.loads(job.to_json())
    assert _same_meaning(load(path), written), (load(path), written)
    assert JobEnvelope.from_json(job.to_json()) == job


@pytest.mark.parametrize("path", OWN_INVALID, ids=lambda p: p.name)
def test_rejects_every_own_invalid_fixture(path: Path) -> None:
    with pytest.raises(ValidationError):
        JobEnvelope.from_json(path.read_bytes())


@pytest.mark.parametrize("path", OWN_VALID, ids=lambda p: p.name)
def test_official_schema_accepts_own_valid_fixture(path: Path, job_schema: Any) -> None:
    job_schema.validate(load(path))


@pytest.mark.parametrize("path", [p for p in OWN_INVALID if p.name not in SCHEMA_SILENT],
                         ids=lambda p: p.name)
def test_official_schema_rejects_own_invalid_fixture(path: Path, job_schema: Any) -> None:
    assert not job_schema.is_valid(load(path))


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
    # A JSON number keeps its meaning when an integer comes back as a float
    # (``backoff_coefficient: 3`` is written ``3.0``); a boolean is no number here.
    number = isinstance(a, int) and not isinstance(a, bool) and isinstance(b, float)
    return (a == b and type(a) is type(b)) or ((isinstance(a, float) or number) and a == b)


@pytest.mark.parametrize("path", VALID)
def test_round_trip_preserves_meaning(path: Path, job_schema: Any) -> None:
    original = load(path)
    written = json.loads(JobEnvelope.from_json(path.read_bytes()).to_json())
    assert _same_meaning(original, written), (original, written)
    job_schema.validate(written)


def test_unknown_attributes_survive_exactly() -> None:
    path = next(p for p in OWN_VALID if "unknown-top-level-attributes" in p.name)
    job = JobEnvelope.from_json(path.read_bytes())
    expected = {"x_region": "eu-west-1", "x_routing": {"shard": 7, "zones": ["a", "b"]},
                "x_flag": None, "ext_count": 3}
    assert job.extensions == expected
    written = json.loads(job.to_json())
    assert {k: written[k] for k in expected} == expected


def test_meta_is_kept_untouched() -> None:
    path = next(p for p in OWN_VALID if "meta-preserved" in p.name)
    assert json.loads(JobEnvelope.from_json(path.read_bytes()).to_json())["meta"] == (
        load(path)["meta"])


def test_absent_attributes_stay_absent() -> None:
    minimal = next(p for p in OWN_VALID if "minimal" in p.name)
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
