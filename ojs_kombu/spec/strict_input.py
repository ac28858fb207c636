"""What a consumed message must be before anything reads it: an OJS job in strict JSON.

Another producer, or an attacker, may publish anything onto a job queue.  The
content type must be OJS's, the body strict JSON (:func:`check_strict_json`:
a second parse that refuses what only lenient parsers read, so that every OJS
consumer sees the same job) and the envelope valid (:func:`parse_envelope`);
anything else is a :class:`~ojs_kombu.spec.errors.JobRejected` with its code,
dead-lettered as ``x-ojs-error-code``.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson
from pydantic import ValidationError

from .envelope import CONTENT_TYPE, SPEC_VERSION, JobEnvelope
from .errors import JobRejected

# Consume-side error codes (``x-ojs-error-code`` on dead-lettered messages).
INVALID_PAYLOAD = "INVALID_PAYLOAD"
INVALID_ENVELOPE = "INVALID_ENVELOPE"
UNSUPPORTED_CONTENT_TYPE = "UNSUPPORTED_CONTENT_TYPE"
#: A body larger than the worker reads (``ojs_max_job_bytes``), refused before it is parsed.
JOB_TOO_LARGE = "JOB_TOO_LARGE"


_UTF_8 = ("utf-8", None)


def check_content_type(content_type: str | None, content_encoding: str | None) -> None:
    """Refuse, as ``UNSUPPORTED_CONTENT_TYPE``, a message that is not UTF-8 OJS JSON by
    its properties, before its body is read."""
    if content_type == CONTENT_TYPE and content_encoding in _UTF_8:  # as ojs_kombu sends it
        return
    base = (content_type or "").split(";", 1)[0].strip().lower()
    if base != CONTENT_TYPE:
        raise JobRejected(
            UNSUPPORTED_CONTENT_TYPE,
            f"content_type is {content_type!r}; OJS job queues carry {CONTENT_TYPE!r}",
        )
    if content_encoding and content_encoding.lower().replace("_", "-") not in ("utf-8", "utf8"):
        raise JobRejected(
            UNSUPPORTED_CONTENT_TYPE,
            f"content_encoding is {content_encoding!r}; OJS job bodies are utf-8",
        )


def check_body_size(body: bytes | str, limit: int | None) -> None:
    """Refuse, as ``JOB_TOO_LARGE``, a body over ``limit`` bytes (``None``: no limit)
    before it is parsed: parsing a job costs about twenty times its body in memory."""
    if limit is not None and len(body) > limit:
        raise JobRejected(
            JOB_TOO_LARGE,
            f"message body has {len(body)} bytes, more than this worker reads "
            f"(ojs_max_job_bytes={limit})")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise JobRejected(
                    INVALID_PAYLOAD,
                    f"message body has the object key {key!r} twice; the JSON objects of an "
                    "OJS job have unique keys (parsers disagree on which value wins)")
            seen.add(key)
    return obj


def _refuse_constant(name: str) -> Any:
    raise JobRejected(INVALID_PAYLOAD,
                      f"message body contains {name}, which is not JSON (RFC 8259 has no "
                      "NaN, Infinity or -Infinity)")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise JobRejected(INVALID_PAYLOAD,
                          f"message body has the number {text[:40]}, beyond the range of a "
                          "JSON number (it would read as Infinity)")
    return value


_STRICT_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys,
                                   parse_constant=_refuse_constant, parse_float=_finite_float)


def _canonical(body: bytes | str) -> bool:
    """Whether ``body`` is exactly the text orjson writes for the value it reads from it.

    Such a body is strict JSON without the Python parse: orjson refuses what is not
    UTF-8, ``NaN`` and ``Infinity`` and numbers that overflow to them, and what it
    writes has no object with a key twice, so a body with one never equals it.  The
    jobs ojs_kombu publishes are written that way (compact, each key once) unless they
    hold a number orjson spells differently (a float under 1e-4, an integer beyond 64
    bits); those, bodies with spaces or needless escapes, and whatever orjson cannot
    read or write take the Python parse, which decides."""
    try:
        written = orjson.dumps(orjson.loads(body))
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):
        return False
    return written == (body.encode() if isinstance(body, str) else body)


def check_strict_json(body: bytes | str) -> None:
    """Refuse, as ``INVALID_PAYLOAD``, a body that only lenient parsers read: not UTF-8,
    not JSON, ``NaN``/``Infinity``/``-Infinity`` or a number that overflows to them, or
    an object (at any depth) with a key twice."""
    if _canonical(body):
        return
    try:
        text = body if isinstance(body, str) else bytes(body).decode()
    except UnicodeDecodeError:
        raise JobRejected(INVALID_PAYLOAD, "message body is not valid JSON (not UTF-8)") from None
    try:
        _STRICT_DECODER.decode(text)
    except RecursionError:
        raise JobRejected(INVALID_PAYLOAD, "message body is nested too deeply") from None
    except ValueError:
        raise JobRejected(INVALID_PAYLOAD, "message body is not valid JSON") from None


def parse_envelope(body: bytes | str) -> JobEnvelope:
    """Validate a message body as an OJS job, or raise :class:`JobRejected`.

    The body must be strict JSON (:func:`check_strict_json`).  A body without
    ``specversion`` is read as ``"1.0"``: the binding's own producer example
    (section 15.1) omits it, and the binding has one version.
    """
    check_strict_json(body)
    try:
        return JobEnvelope.model_validate_json(body)
    except ValidationError as exc:
        if _lacks_specversion(exc):
            return parse_envelope(_with_specversion(body))
        errors = exc.errors(include_url=False, include_input=False)
        if any(e["type"] == "json_invalid" for e in errors):
            raise JobRejected(INVALID_PAYLOAD, "message body is not valid JSON") from None
        summary = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in errors[:5]
        )
        raise JobRejected(INVALID_ENVELOPE, f"not a valid OJS job envelope ({summary})") from None


def _lacks_specversion(exc: ValidationError) -> bool:
    return any(e["type"] == "missing" and e["loc"] == ("specversion",) for e in exc.errors())


def _with_specversion(body: bytes | str) -> bytes:
    job = json.loads(body)
    job["specversion"] = SPEC_VERSION
    return json.dumps(job, separators=(",", ":"), ensure_ascii=False).encode()
