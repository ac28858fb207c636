"""Schema helpers shared with the unit suite (kept out of conftest to stay importable)."""

from __future__ import annotations

from jsonschema import Draft202012Validator

from tests.conftest import schema_validator


def job_schema_validator() -> Draft202012Validator:
    return schema_validator("job")


def event_schema_validator() -> Draft202012Validator:
    return schema_validator("event")
