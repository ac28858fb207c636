"""The ``unchecked`` side of ``profile_worker.py``: ojs_kombu as if checking an envelope cost
nothing.  A measurement of the ceiling, never a way to run a worker.

Every consumed job is validated in the worker's main thread before Celery sees it:
strict JSON, then the envelope's pydantic model (``ojs_kombu.spec.strict_input``).
Plain Celery checks nothing of what it consumes, so the difference between the two
workers holds that check.  This side runs the same worker with the check taken out:
the first job's envelope is parsed as usual, and every later job gets a copy of it
with its own id (read off the body, which ojs_kombu writes with the id at a fixed
place) and the first job's timestamps.  Everything after the check (the Celery
headers, the strategy, the pool, the acks) runs as in the real worker, so
``unchecked`` beside ``ojs`` shows what the check costs per delivery, and beside
plain Celery what ojs_kombu's worker costs without it.  Only for the no-op backlog
``profile_worker.py`` publishes: its jobs differ in their ids and timestamps alone.
"""

from __future__ import annotations

from typing import Any

#: What every envelope ojs_kombu writes starts with; the job id (36 characters) follows.
_HEAD = b'{"specversion":"1.0","id":"'
_ID_END = len(_HEAD) + 36


def install() -> None:
    """Replace the consume path's envelope parse (in this process only)."""
    from ojs_kombu.spec import decode

    parse = decode.parse_envelope
    first: list[Any] = []

    def parse_once(body: bytes | str) -> Any:
        raw = body.encode() if isinstance(body, str) else body  # bytes: no copy
        if not first or not raw.startswith(_HEAD) or raw[_ID_END:_ID_END + 2] != b'",':
            envelope = parse(body)
            first[:] = [envelope]
            return envelope
        job_id = raw[len(_HEAD):_ID_END].decode()
        return first[0].model_copy(update={"id": job_id})

    decode.parse_envelope = parse_once
