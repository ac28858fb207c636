"""A seeded generator of malformed deliveries for an OJS job queue (and valid ones).

Every malformed delivery is certain to be refused by a conformant worker: the
fuzz test counts that each one reaches the dead-letter queue with an
``x-ojs-error-code``.  Kinds cover the body (not JSON, not an object, not an
envelope, strictness the spec asks for: ``NaN``, duplicate keys), the envelope
(each required attribute missing or wrong), Celery's extension (``x_celery``
values of the wrong type), the properties (content types, short strings that
are not UTF-8) and types no task handles (Celery's built-ins included).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import amqp

from ojs_kombu.spec.job_ids import new_job_id

CONTENT_TYPE = "application/openjobspec+json"


@dataclass(frozen=True)
class Delivery:
    kind: str
    message: amqp.Message
    valid: bool = False
    job_id: str = ""


def envelope(queue: str, job_type: str = "fuzz.count", **changes: Any) -> dict[str, Any]:
    job = {"specversion": "1.0", "id": new_job_id(), "type": job_type, "queue": queue,
           "args": []}
    job.update(changes)
    return job


def _message(body: bytes, job_id: str | None = None, **properties: Any) -> amqp.Message:
    properties.setdefault("content_type", CONTENT_TYPE)
    properties.setdefault("delivery_mode", 2)
    if job_id is not None:
        properties.setdefault("message_id", job_id)
    return amqp.Message(body, **properties)


def _json(job: dict[str, Any], **properties: Any) -> amqp.Message:
    properties.setdefault("type", job.get("type") if isinstance(job.get("type"), str) else None)
    if properties["type"] is None:
        del properties["type"]
    job_id = job.get("id") if isinstance(job.get("id"), str) else new_job_id()
    return _message(json.dumps(job).encode(), job_id, **properties)


def _kinds(queue: str, rng: random.Random) -> dict[str, Callable[[], amqp.Message]]:
    def missing() -> amqp.Message:
        job = envelope(queue)
        # (a missing specversion is read as "1.0": the binding's 15.1 example omits it)
        del job[rng.choice(["id", "type", "queue", "args"])]
        return _json(job)

    def wrong() -> amqp.Message:
        field, value = rng.choice([
            ("specversion", "2.0"), ("id", 42), ("id", "not-a-uuid"),
            ("id", new_job_id().upper()), ("type", "Fuzz.Count"), ("type", "fuzz..count"),
            ("queue", "Not A Queue"), ("args", {"a": 1}), ("args", "text"),
            ("priority", 1.5), ("priority", "high"), ("timeout", -1),
            ("scheduled_at", "tomorrow"), ("expires_at", "2026-01-01T00:00:00"),
            ("retry", {"backoff_coefficient": 0.5}), ("retry", {"max_attempts": -1}),
            ("meta", [1, 2]),
        ])
        job = envelope(queue)
        job[field] = value
        return _json(job)

    def not_utf8() -> amqp.Message:
        prop = rng.choice(["content_type", "content_encoding", "correlation_id", "reply_to",
                           "message_id", "type", "app_id", "cluster_id"])
        body = json.dumps(envelope(queue)).encode()
        return amqp.Message(body, delivery_mode=2, **{prop: bytes([0xff, rng.randrange(256)])})

    def x_celery() -> amqp.Message:
        field, value = rng.choice([
            ("timelimit", "abc"), ("timelimit", [1, 2, 3]), ("timelimit", ["a", None]),
            ("kwargs", [1]), ("kwargs", "x"), ("eta", "not a date"), ("expires", 12),
            ("retries", "many"), ("callbacks", "x"), ("chain", {"a": 1}), ("group", 5),
        ])
        return _json(envelope(queue, x_celery={field: value}))

    return {
        "random bytes": lambda: _message(rng.randbytes(rng.randrange(0, 200)), new_job_id()),
        "truncated JSON": lambda: _message(
            json.dumps(envelope(queue)).encode()[:rng.randrange(1, 60)], new_job_id()),
        "JSON, not an object": lambda: _message(
            rng.choice([b"[]", b"1", b'"job"', b"null", b"true", b"[{}]"]), new_job_id()),
        "required attribute missing": missing,
        "attribute of the wrong kind": wrong,
        "NaN or Infinity": lambda: _message(
            json.dumps(envelope(queue, args=[1])).replace("[1]", rng.choice(
                ["[NaN]", "[Infinity]", "[-Infinity]"])).encode(), new_job_id()),
        "duplicate keys": lambda: _duplicate_keys(queue),
        "unknown type": lambda: _json(envelope(queue, job_type="fuzz.nobody_handles_this")),
        "Celery built-in as a type": lambda: _json(envelope(queue, job_type=rng.choice(
            ["celery.group", "celery.chord", "celery.accumulate", "celery.backend_cleanup",
             "celery.chain", "celery.map", "celery.starmap", "celery.chunks"]))),
        "another queue's job": lambda: _json(envelope("somewhere-else")),
        "wrong content type": lambda: _json(envelope(queue), content_type=rng.choice(
            ["application/json", "application/x-python-serialize", "text/plain",
             "application/x-yaml"])),
        "properties not UTF-8": not_utf8,
        "x_celery of the wrong kind": x_celery,
    }


def _duplicate_keys(queue: str) -> amqp.Message:
    job = envelope(queue)
    other = new_job_id()
    text = json.dumps(job)
    return _message(("{" + f'"id": "{other}", ' + text[1:]).encode(), job["id"])


def deliveries(queue: str, malformed: int, valid_every: int, seed: int) -> Iterator[Delivery]:
    """``malformed`` refused deliveries in a seeded order, a valid ``fuzz.count`` job
    after every ``valid_every`` of them."""
    rng = random.Random(seed)
    kinds = _kinds(queue, rng)
    names = sorted(kinds)
    for n in range(malformed):
        kind = names[n % len(names)] if n < len(names) else rng.choice(names)
        yield Delivery(kind, kinds[kind]())
        if n % valid_every == valid_every - 1:
            job = envelope(queue, args=[n])
            yield Delivery("valid", _json(job), valid=True, job_id=job["id"])
