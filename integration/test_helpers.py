"""Schema helpers shared with the unit suite (kept out of conftest to stay importable).

The official OJS JSON Schemas are optional (``OJS_SHARED_DIR``, see
``tests/ojs_schemas.py``).  ``check_job``/``check_event`` validate an emitted
message against them when present and with the project's own models
(``JobEnvelope``, ``Event``) otherwise: use them where schema validity is one
check among others.  ``job_schema_validator``/``event_schema_validator`` skip
the calling test without the schemas: for tests that are about the schemas.
"""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator

from tests.ojs_schemas import event_check, job_check, schema_validator


def job_schema_validator() -> Draft202012Validator:
    return schema_validator("job")


def event_schema_validator() -> Draft202012Validator:
    return schema_validator("event")


def check_job(document: Any) -> None:
    """``job.schema.json`` when present, else the ``JobEnvelope`` model."""
    job_check().validate(document)


def check_event(document: Any) -> None:
    """``event.schema.json`` when present, else the ``Event`` model."""
    event_check().validate(document)
