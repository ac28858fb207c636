"""The ``ojs`` kombu serializer: content type ``application/openjobspec+json``.

Celery's worker hands a task's body and content type to its pool, which
decodes them with kombu.  Registering the OJS content type lets the pool read
the OJS envelope straight into Celery's ``(args, kwargs, embed)`` instead of
the transport re-encoding every consumed job into Celery's own JSON body.
"""

from __future__ import annotations

import json
from typing import Any

from kombu.serialization import register

from ..spec.decode import celery_payload
from ..spec.envelope import CONTENT_TYPE, JobEnvelope

SERIALIZER_NAME = "ojs"


def dumps_envelope(job: JobEnvelope | dict[str, Any]) -> str:
    if isinstance(job, JobEnvelope):
        return job.to_json().decode()
    return json.dumps(job, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def register_serializer() -> None:
    register(SERIALIZER_NAME, dumps_envelope, celery_payload, content_type=CONTENT_TYPE,
             content_encoding="utf-8")
