"""Shared fixtures for the broker-free unit tests."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("OJS_SHARED_DIR", ROOT.parent / "shared"))
SCHEMAS = SHARED / "ojs-json-schema" / "schemas" / "v1"
FIXTURES = SHARED / "ojs-json-schema" / "tests"

if not SCHEMAS.is_dir() or not FIXTURES.is_dir():
    # Without them the schema tests would have nothing to check (an empty
    # directory parametrises no case), so refuse to run at all.
    raise pytest.UsageError(
        f"the OJS JSON Schemas and fixtures are not at {SHARED / 'ojs-json-schema'}: "
        "put the repository next to the shared spec folder (../shared) or set "
        "OJS_SHARED_DIR to that folder")


def schema_validator(name: str) -> Draft202012Validator:
    """A validator for ``{name}.schema.json`` that resolves ``$ref``s by ``$id``."""
    resources = []
    for path in sorted(SCHEMAS.glob("*.schema.json")):
        document = json.loads(path.read_text())
        resources.append((document["$id"], Resource.from_contents(document)))
    registry = Registry().with_resources(resources)
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    return Draft202012Validator(schema, registry=registry)


@pytest.fixture(scope="session")
def job_schema() -> Draft202012Validator:
    if not SCHEMAS.is_dir():
        pytest.fail(f"OJS schemas not found at {SCHEMAS} (set OJS_SHARED_DIR)")
    return schema_validator("job")


def fixture_files(kind: str) -> list[Path]:
    return sorted((FIXTURES / kind).glob("*.json"))


def load(path: Path) -> Any:
    return json.loads(path.read_text())
