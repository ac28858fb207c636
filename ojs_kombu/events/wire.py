"""How OJS events travel as AMQP messages on the events exchange, and how to read them back.

Pure code: no I/O.  The AMQP sink publishes in one of two formats, both with
the routing key = the event type, so ``job.*``-style bindings select events
by type whatever the format:

* **single** (``batch_size=1``): one event per message, the body one event
  object, ``content_type`` ``application/json``;
* **batch** (the default): one message per run of same-type events of a
  flush, the body a JSON array of event objects (the CloudEvents JSON batch
  format), ``content_type`` ``application/cloudevents-batch+json``.

:func:`split_batches` cuts a flush into messages so that the events of one
subject (a job, a worker) stay in emission order when a consumer reads the
messages in order and the events of each message in order (events spec
section 9.2).  :func:`decode_events` reads either format.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import orjson

from ..spec.errors import InvalidEventMessage

#: ``content_type`` of a one-event message.
SINGLE_CONTENT_TYPE = "application/json"
#: ``content_type`` of a batch message (CloudEvents JSON batch format).
BATCH_CONTENT_TYPE = "application/cloudevents-batch+json"
#: Header of a batch message: how many events its body holds.
COUNT_HEADER = "x-ojs-event-count"


class _Routable(Protocol):
    @property
    def type(self) -> str: ...

    @property
    def subject(self) -> str | None: ...


E = TypeVar("E", bound=_Routable)


def split_batches(events: Sequence[E]) -> list[tuple[str, list[E]]]:
    """``(event type, events)`` per message, in publishing order.

    Each event goes into the first message of its type that comes no earlier
    than the message holding the previous event of its subject; only when there
    is none does its type get a new message.  So reading the messages in order
    keeps every subject's events in emission order (a job's ``job.started``,
    ``job.failed``, ``job.retrying``, ``job.started`` ...), while a stream of
    ``job.started``/``job.completed`` of many jobs stays one message per type.
    """
    messages: list[tuple[str, list[E]]] = []
    of_type: dict[str, list[int]] = {}  # event type -> its messages' indexes, ascending
    last_of_subject: dict[str, int] = {}  # subject -> message of its latest event
    for event in events:
        subject = event.subject
        after = last_of_subject.get(subject, 0) if subject is not None else 0
        indexes = of_type.setdefault(event.type, [])
        position = bisect.bisect_left(indexes, after)
        if position < len(indexes):
            index = indexes[position]
        else:
            index = len(messages)
            messages.append((event.type, []))
            indexes.append(index)
        messages[index][1].append(event)
        if subject is not None:
            last_of_subject[subject] = index
    return messages


def decode_events(body: bytes | str, content_type: str | None = None) -> list[dict[str, Any]]:
    """The events of one message of the events exchange, in order, as JSON objects.

    ``content_type`` decides the format (``application/cloudevents-batch+json``:
    an array; ``application/json``: one object); without it, an array is a
    batch and an object a single event.  Raises :class:`InvalidEventMessage`
    for anything else (not JSON, not objects, another content type).
    """
    if content_type is not None and content_type not in (BATCH_CONTENT_TYPE,
                                                         SINGLE_CONTENT_TYPE):
        raise InvalidEventMessage(
            f"content_type {content_type!r} is neither {SINGLE_CONTENT_TYPE!r} nor "
            f"{BATCH_CONTENT_TYPE!r}")
    try:
        decoded = json.loads(body)
    except (ValueError, TypeError) as exc:
        raise InvalidEventMessage(f"event message body is not JSON ({exc})") from None
    batch = isinstance(decoded, list) if content_type is None else (
        content_type == BATCH_CONTENT_TYPE)
    if batch:
        if not isinstance(decoded, list):
            raise InvalidEventMessage(
                f"a {BATCH_CONTENT_TYPE} body must be a JSON array, not "
                f"{type(decoded).__name__}")
        events: Iterable[Any] = decoded
    else:
        if not isinstance(decoded, Mapping):
            raise InvalidEventMessage(
                f"a {SINGLE_CONTENT_TYPE} event body must be a JSON object, not "
                f"{type(decoded).__name__}")
        events = [decoded]
    result = []
    for position, event in enumerate(events):
        if not isinstance(event, dict):
            raise InvalidEventMessage(
                f"event {position} of the batch is a {type(event).__name__}, not a JSON object")
        result.append(event)
    return result


def compact_json(value: Any) -> bytes:
    """Compact UTF-8 JSON, as every event body is written.

    orjson writes it (the event sink serialises every event a worker emits, and
    orjson takes a tenth of the standard library's time); what orjson refuses,
    such as an integer beyond 64 bits in a job's result, is written by ``json``.
    """
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode()


def encode_batch(events: Iterable[Mapping[str, Any]]) -> bytes:
    """A batch body: compact UTF-8 JSON array of event objects."""
    return compact_json(list(events))
