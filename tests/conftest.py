"""Shared fixtures for the broker-free unit tests.

The official OJS JSON Schemas and fixtures are optional here: see
:mod:`tests.ojs_schemas` (``OJS_SHARED_DIR``, ``OJS_REQUIRE_SCHEMAS``).
"""

from __future__ import annotations

from typing import Any

import pytest

from .ojs_schemas import (
    FALLBACK_CHECKS,
    FIXTURES,
    OJS_JSON_SCHEMA,
    REQUIRE_SCHEMAS,
    ROOT,
    SCHEMAS,
    SHARED,
    fixture_files,
    load,
    missing,
    schema_validator,
)
from .ojs_schemas import event_check as _event_check
from .ojs_schemas import job_check as _job_check

__all__ = ["FIXTURES", "ROOT", "SCHEMAS", "SHARED", "fixture_files", "load", "schema_validator"]

if REQUIRE_SCHEMAS and missing():
    # CI (.ci/run) must run the official fixtures: a missing spec folder is an error there.
    raise pytest.UsageError("OJS_REQUIRE_SCHEMAS is set, but " + "; ".join(missing()))


def pytest_report_header() -> str:
    if not missing():
        return f"OJS JSON Schemas and fixtures: {OJS_JSON_SCHEMA}"
    return ("OJS JSON Schemas and fixtures: the tests that need what is missing are skipped: "
            + "; ".join(missing()))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if FALLBACK_CHECKS:
        checked = ", ".join(f"{n} {kind} documents" for kind, n in sorted(FALLBACK_CHECKS.items()))
        terminalreporter.write_line(
            f"OJS JSON Schemas absent: {checked} were checked with the project's own models "
            "(JobEnvelope, Event) instead")


@pytest.fixture(scope="session")
def job_schema() -> Any:
    """The official ``job.schema.json``; skips the test when the schemas are absent."""
    return schema_validator("job")


@pytest.fixture(scope="session")
def job_check() -> Any:
    """``job.schema.json`` when present, else the ``JobEnvelope`` model: for tests where
    schema validity is one check among others."""
    return _job_check()


@pytest.fixture(scope="session")
def event_check() -> Any:
    """``event.schema.json`` when present, else the ``Event`` model."""
    return _event_check()
