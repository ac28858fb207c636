"""The poison storm's messages and their broker I/O: what each side is flooded with
(built without a broker, so tests can check them against ojs_kombu's decoder), the
pipelined confirmed publisher, and the read-out that finds where every message ended.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import amqp
from celery import Celery
from kombu.utils.json import dumps as kombu_dumps
from raw_side import ConfirmChannel

import ojs_kombu

UNKNOWN_TYPE = "storm.unknown_type"
UNREGISTERED_TASK = "storm.unregistered"
#: Publishes in flight before the publisher waits for confirms.
CONFIRM_WINDOW = 1000
#: (kind, body, properties) of one storm message.
Poison = tuple[str, bytes, dict[str, Any]]


def ojs_poison(n: int, queue: str, new_id: Callable[[], str] = ojs_kombu.new_job_id,
               now: dt.datetime | None = None) -> list[Poison]:
    """``n`` valid OJS jobs of a type no task handles, each followed by a delivery that is
    not a job (alternately a body that is not JSON and a JSON envelope without ``id``),
    with the properties and ``x-ojs-*`` headers of an OJS producer: only the body or
    the type makes them poison."""
    created = (now or dt.datetime.now(dt.UTC)).isoformat(timespec="milliseconds")
    created = created.replace("+00:00", "Z")
    messages: list[Poison] = []
    for i in range(2 * n):
        job_id = new_id()
        properties = {
            "message_id": job_id, "type": UNKNOWN_TYPE, "content_type": ojs_kombu.CONTENT_TYPE,
            "content_encoding": "utf-8", "delivery_mode": 2, "app_id": "ojs",
            "correlation_id": job_id, "timestamp": int(time.time()),
            "application_headers": {"x-ojs-queue": queue, "x-ojs-attempt": 1,
                                    "x-ojs-max-attempts": 3, "x-ojs-created-at": created,
                                    "x-ojs-enqueued-at": created}}
        job = {"specversion": "1.0", "id": job_id, "type": UNKNOWN_TYPE, "queue": queue,
               "args": []}
        if i % 2 == 0:
            messages.append(("unknown type", json.dumps(job).encode(), properties))
        elif i % 4 == 1:
            messages.append(("not JSON", b"storm: this is not JSON {", properties))
        else:
            del job["id"]
            messages.append(("JSON, not a job", json.dumps(job).encode(), properties))
    return messages


def plain_poison(app: Celery, n: int) -> list[Poison]:
    """``n`` protocol-2 task messages of an unregistered task, built as Celery builds them
    (``app.amqp.as_task_v2``, kombu's JSON), each followed by a message whose body is not
    JSON (no ``task`` header, so Celery has to decode it, fails, and acks it)."""
    messages: list[Poison] = []
    for _ in range(n):
        task_id = ojs_kombu.new_job_id()
        headers, properties, body, _sent = app.amqp.as_task_v2(task_id, UNREGISTERED_TASK,
                                                              args=(), kwargs={})
        messages.append(("unregistered task", kombu_dumps(body).encode(), {
            **properties, "content_type": "application/json", "content_encoding": "utf-8",
            "delivery_mode": 2, "priority": 0, "application_headers": headers,
            "message_id": task_id}))
        messages.append(("undecodable", b"storm: this is not JSON {", {
            "content_type": "application/json", "content_encoding": "utf-8",
            "delivery_mode": 2, "message_id": ojs_kombu.new_job_id()}))
    return messages


def count_kinds(published: list[Poison], dead: list[amqp.Message], left: list[amqp.Message]
                ) -> dict[str, dict[str, int]]:
    """Per kind, matched by ``message_id``: published, in the dead-letter queue, back in
    the job queue, lost (found in neither) and duplicated (copies beyond the first, e.g.
    a dead letter whose original went back to the job queue unacked)."""
    kind_of = {props["message_id"]: kind for kind, _body, props in published}
    result = {kind: {"published": 0, "dead_lettered": 0, "left": 0, "lost": 0,
                     "duplicated": 0} for kind, _body, _props in published}
    for kind, _body, _props in published:
        result[kind]["published"] += 1
    found: dict[str, set[str]] = {kind: set() for kind in result}
    for where, messages in (("dead_lettered", dead), ("left", left)):
        for message in messages:
            message_id = message.properties.get("message_id")
            kind = kind_of.get(message_id)
            if kind is not None:
                result[kind][where] += 1
                found[kind].add(message_id)
    for kind, counts in result.items():
        counts["lost"] = counts["published"] - len(found[kind])
        counts["duplicated"] = counts["dead_lettered"] + counts["left"] - len(found[kind])
    return result


# -- broker I/O ----------------------------------------------------------------


class PipelinedPublisher(ConfirmChannel):
    """A confirm-mode channel that publishes without waiting per message, at most
    ``CONFIRM_WINDOW`` unconfirmed; a nacked or returned message fails the run (its
    connection stays open: the caller closes it)."""

    def publish(self, messages: list[Poison], exchange: str, routing_key: str) -> None:
        publish, drain = self.channel.basic_publish, self.connection.drain_events
        for _kind, body, properties in messages:
            publish(amqp.Message(body, **properties), exchange, routing_key, mandatory=True)
            self.published += 1
            while self.published - self.confirmed >= CONFIRM_WINDOW:
                drain(timeout=30)
        while self.confirmed < self.published:
            drain(timeout=30)
        if self.refused:
            raise RuntimeError(f"storm publisher: {self.refused} message(s) refused or "
                               f"returned by the broker ({exchange!r}, {routing_key!r})")


def read_out(connection: amqp.Connection, queue: str) -> list[amqp.Message]:
    """Every message in ``queue`` (consumed without acks, so the queue ends empty)."""
    channel = connection.channel()
    try:
        depth = channel.queue_declare(queue, passive=True).message_count
    except amqp.exceptions.NotFound:
        return []
    got: list[amqp.Message] = []
    if depth:
        channel.basic_consume(queue, no_ack=True, callback=got.append)
        while len(got) < depth:
            try:
                connection.drain_events(timeout=2)
            except TimeoutError:
                break
    with suppress(Exception):
        channel.close()
    return got
