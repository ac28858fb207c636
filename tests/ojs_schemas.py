"""Where the official OJS JSON Schemas and fixtures are, and checks that use them when present.

``OJS_SHARED_DIR`` names the folder that *holds* ``ojs-json-schema`` (the shared
spec folder, ``../shared`` next to the repository by default); pointing it at the
``ojs-json-schema`` folder itself works too.

Without the schemas the suite still runs: tests that are about the official
schemas or fixtures are skipped with the reason (``-ra`` lists it), and checks
of what the project emits fall back to the project's own models
(:class:`~ojs_kombu.spec.envelope.JobEnvelope`, :class:`~ojs_kombu.events.Event`).
``OJS_REQUIRE_SCHEMAS=1`` (set by ``.ci/run``) makes their absence an error.
"""

from __future__ import annotations

import collections
import functools
import json
import os
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

ROOT = Path(__file__).resolve().parents[1]
#: The project's own envelope fixtures, written from the spec (always present).
OWN_FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _locate() -> tuple[Path, Path]:
    """``(shared folder, ojs-json-schema folder)`` from ``OJS_SHARED_DIR`` or ``../shared``."""
    configured = os.environ.get("OJS_SHARED_DIR", "").strip()
    if not configured:
        shared = ROOT.parent / "shared"
        return shared, shared / "ojs-json-schema"
    given = Path(configured).expanduser().resolve()
    if (given / "schemas" / "v1").is_dir() and not (given / "ojs-json-schema").is_dir():
        return given.parent, given  # it names the ojs-json-schema folder itself
    return given, given / "ojs-json-schema"


SHARED, OJS_JSON_SCHEMA = _locate()
SCHEMAS = OJS_JSON_SCHEMA / "schemas" / "v1"
FIXTURES = OJS_JSON_SCHEMA / "tests"
#: ``ojs-events.md``, read by the event model tests (the spec folder beside ojs-json-schema).
EVENTS_SPEC = SHARED / "spec" / "ojs-events.md"

SCHEMAS_PRESENT = all((SCHEMAS / f"{name}.schema.json").is_file() for name in ("job", "event"))
FIXTURES_PRESENT = (FIXTURES / "valid").is_dir() and (FIXTURES / "invalid").is_dir()
EVENTS_SPEC_PRESENT = EVENTS_SPEC.is_file()
REQUIRE_SCHEMAS = os.environ.get("OJS_REQUIRE_SCHEMAS", "").strip() not in ("", "0")

_HINT = "set OJS_SHARED_DIR to the folder that holds ojs-json-schema"
SCHEMAS_MISSING = f"the official OJS JSON Schemas are not at {SCHEMAS}; {_HINT}"
FIXTURES_MISSING = f"the official OJS fixtures are not at {FIXTURES}; {_HINT}"
EVENTS_SPEC_MISSING = (f"the OJS events spec is not at {EVENTS_SPEC}; set OJS_SHARED_DIR to "
                       "the folder that holds ojs-json-schema and spec/")

#: How many documents were checked by a project model because the schemas are absent.
FALLBACK_CHECKS: collections.Counter[str] = collections.Counter()


def missing() -> list[str]:
    """The reasons the official OJS material is incomplete (empty when all is there)."""
    return [reason for present, reason in ((SCHEMAS_PRESENT, SCHEMAS_MISSING),
                                           (FIXTURES_PRESENT, FIXTURES_MISSING),
                                           (EVENTS_SPEC_PRESENT, EVENTS_SPEC_MISSING))
            if not present]


def _skip(reason: str) -> None:
    if REQUIRE_SCHEMAS:
        pytest.fail(f"OJS_REQUIRE_SCHEMAS is set and {reason}", pytrace=False)
    pytest.skip(reason)


def require_schemas() -> None:
    """Skip the calling test (fail under ``OJS_REQUIRE_SCHEMAS``) without the schemas."""
    if not SCHEMAS_PRESENT:
        _skip(SCHEMAS_MISSING)


def require_official_fixtures() -> None:
    if not FIXTURES_PRESENT:
        _skip(FIXTURES_MISSING)


def require_events_spec() -> None:
    if not EVENTS_SPEC_PRESENT:
        _skip(EVENTS_SPEC_MISSING)


@functools.cache
def _registry() -> Registry:
    resources = []
    for path in sorted(SCHEMAS.glob("*.schema.json")):
        document = json.loads(path.read_text())
        resources.append((document["$id"], Resource.from_contents(document)))
    return Registry().with_resources(resources)


def schema_validator(name: str) -> Draft202012Validator:
    """A validator for the official ``{name}.schema.json`` (``$ref``s resolved by ``$id``).

    Skips the calling test when the schemas are absent: use it in tests that are
    about the schemas.  Where schema validity is one check among others, use
    :func:`job_check` or :func:`event_check`.
    """
    require_schemas()
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    return Draft202012Validator(schema, registry=_registry())


class _ModelCheck:
    """The project's own structural check, with a validator's ``validate`` method."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def validate(self, document: Any) -> None:
        FALLBACK_CHECKS[self.kind] += 1
        text = json.dumps(document)
        if self.kind == "job":
            from ojs_kombu.spec.envelope import JobEnvelope

            JobEnvelope.from_json(text)
        else:
            from ojs_kombu.events import Event

            Event.from_json(text)


def job_check() -> Draft202012Validator | _ModelCheck:
    """``job.schema.json`` when present, else the ``JobEnvelope`` model (never skips)."""
    return schema_validator("job") if SCHEMAS_PRESENT else _ModelCheck("job")


def event_check() -> Draft202012Validator | _ModelCheck:
    """``event.schema.json`` when present, else the ``Event`` model (never skips)."""
    return schema_validator("event") if SCHEMAS_PRESENT else _ModelCheck("event")


def fixture_files(kind: str) -> list[Path]:
    """The official ``tests/{kind}`` fixtures (none when they are absent)."""
    return sorted((FIXTURES / kind).glob("*.json"))


def official_fixture_params(kind: str) -> list[Any]:
    """Parameters for a test over the official fixtures: one skipped case when absent."""
    if FIXTURES_PRESENT:
        return [pytest.param(path, id=path.name) for path in fixture_files(kind)]
    # (Under OJS_REQUIRE_SCHEMAS the conftest refuses to start before this.)
    return [pytest.param(None, id=f"official-{kind}-fixtures-absent",
                         marks=pytest.mark.skip(reason=FIXTURES_MISSING))]


def own_fixture_files(kind: str) -> list[Path]:
    """The project's own ``tests/fixtures/{kind}`` envelopes."""
    return sorted((OWN_FIXTURES / kind).glob("*.json"))


def load(path: Path) -> Any:
    return json.loads(path.read_text())
