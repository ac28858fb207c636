"""Hostile input against the session's worker and the real broker.

Consume side: a job body that is not strict JSON, an envelope naming another
queue, an invalid ``x_celery`` or a foreign ``celery.*`` job is dead-lettered
with its error code, and the next job runs once.  Caller side: a bad
``apply_async``/``send_task``/``enqueue_many`` raises a typed error and nothing
reaches the queue.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import amqp
import pytest
from celery import Celery

import ojs_kombu
from ojs_kombu.spec.errors import JobOptionError, JobTooLargeError, NonJSONArgumentError
from ojs_kombu.spec.job_ids import new_job_id

from .apps import make_app
from .conftest import queue_depth, wait_until

OJS = "application/openjobspec+json"
QUEUE = "malformed"  # consumed by the session's worker
DLQ = f"ojs.queue.dlx.{QUEUE}"


def envelope_text(job_id: str, *, job_type: str = "math.add", queue: str = QUEUE,
                  args: str = "[1, 2]", extra: str = "") -> bytes:
    """A job body written out by hand (json.dumps cannot write a duplicate key)."""
    return (f'{{"specversion": "1.0", "id": "{job_id}", "type": "{job_type}", '
            f'"queue": "{queue}", "args": {args}{extra}}}').encode()


def publish(channel: amqp.Channel, body: bytes, job_id: str) -> None:
    channel.confirm_select()
    channel.basic_publish_confirm(
        amqp.Message(body, message_id=job_id, content_type=OJS, content_encoding="utf-8",
                     delivery_mode=2,
                     application_headers={"x-ojs-queue": QUEUE, "x-ojs-attempt": 1}),
        exchange="ojs.exchange.direct", routing_key=QUEUE, mandatory=True)


def dead_letter(channel: amqp.Channel, job_id: str, timeout: float = 20.0) -> amqp.Message:
    """The dead letter of ``job_id`` (others found on the way are acked away)."""
    def take() -> amqp.Message | None:
        message = channel.basic_get(DLQ)
        if message is None:
            return None
        channel.basic_ack(message.delivery_tag)
        return message if message.properties.get("message_id") == job_id else None

    return wait_until(take, timeout, f"the dead letter of {job_id}")


def x_celery(entries: str) -> str:
    return f', "x_celery": {entries}'


CASES = [
    ("NaN", dict(args="[NaN]"), "INVALID_PAYLOAD", "NaN"),
    ("Infinity", dict(args="[1, Infinity]"), "INVALID_PAYLOAD", "Infinity"),
    ("-Infinity", dict(extra=', "priority": -Infinity'), "INVALID_PAYLOAD", "-Infinity"),
    ("duplicate top-level key", dict(extra=', "type": "always.fail"'), "INVALID_PAYLOAD",
     "'type' twice"),
    ("duplicate nested key", dict(args='[{"x": 1, "x": 2}]'), "INVALID_PAYLOAD", "'x' twice"),
    ("wrong queue", dict(queue="email"), "INVALID_ENVELOPE", "'email'"),
    ("x_celery.timelimit", dict(extra=x_celery('{"timelimit": "abc"}')), "INVALID_ENVELOPE",
     "x_celery.timelimit"),
    ("x_celery.retries", dict(extra=x_celery('{"retries": "many"}')), "INVALID_ENVELOPE",
     "x_celery.retries"),
    ("x_celery.callbacks", dict(extra=x_celery('{"callbacks": [1]}')), "INVALID_ENVELOPE",
     "x_celery.callbacks"),
    ("x_celery.eta", dict(extra=x_celery('{"eta": "soon"}')), "INVALID_ENVELOPE",
     "x_celery.eta"),
    ("x_celery.kwargs", dict(extra=x_celery('{"kwargs": [1]}')), "INVALID_ENVELOPE",
     "x_celery.kwargs"),
    ("celery.group", dict(job_type="celery.group", args="[[]]"), "UNKNOWN_JOB_TYPE",
     "celery.group"),
    ("celery.backend_cleanup", dict(job_type="celery.backend_cleanup", args="[]"),
     "UNKNOWN_JOB_TYPE", "celery.backend_cleanup"),
]


@pytest.mark.parametrize("body, code, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_envelopes_are_dead_lettered_and_the_next_job_runs_once(
        app: Celery, worker: Any, amqp_channel: amqp.Channel, body: dict[str, str], code: str,
        words: str) -> None:
    job_id = new_job_id()
    raw = envelope_text(job_id, **body)
    publish(amqp_channel, raw, job_id)

    dead = dead_letter(amqp_channel, job_id)
    headers = dead.properties["application_headers"]
    assert headers["x-ojs-error-code"] == code
    assert words in headers["x-ojs-error-message"]
    body = dead.body  # py-amqp decodes it (content_encoding utf-8)
    assert (body.encode() if isinstance(body, str) else body) == raw  # kept, byte for byte
    assert app.calls.count(job_id) == 0  # never ran

    # A valid job right after it runs, once; the worker is still consuming.
    good_id = new_job_id()
    publish(amqp_channel, envelope_text(good_id, args="[20, 22]"), good_id)
    assert app.calls.wait_for(good_id)["args"] == [20, 22]
    time.sleep(0.3)
    assert app.calls.count(good_id) == 1
    wait_until(lambda: queue_depth(amqp_channel, f"ojs.queue.{QUEUE}") == 0, 10,
               "an empty job queue")
    assert queue_depth(amqp_channel, DLQ) == 0


def test_celerys_own_builtin_tasks_still_run(app: Celery, worker: Any) -> None:
    """Celery publishes its built-ins with x_celery: they keep running."""
    result = app.tasks["celery.accumulate"].apply_async((1, 2, 3), queue="canvas")
    assert result.get(timeout=20) == [1, 2, 3]


# -- caller side ---------------------------------------------------------------------------

CALLER_QUEUE = "hostile-caller"  # no worker consumes it


@pytest.fixture
def caller_queue(app: Celery, amqp_channel: amqp.Channel) -> Iterator[str]:
    ojs_kombu.declare_topology(app, [CALLER_QUEUE])
    amqp_channel.queue_purge(f"ojs.queue.{CALLER_QUEUE}")
    yield CALLER_QUEUE
    amqp_channel.queue_purge(f"ojs.queue.{CALLER_QUEUE}")


class Opaque:
    pass


BAD_CALLS = [
    ("time_limit=-1", (1, 2), dict(time_limit=-1), JobOptionError, "time_limit"),
    ("soft over hard", (1, 2), dict(time_limit=1, soft_time_limit=5), JobOptionError,
     "soft_time_limit"),
    ("time_limit not a number", (1, 2), dict(time_limit="abc"), JobOptionError, "time_limit"),
    ("priority string", (1, 2), dict(priority="high"), JobOptionError, "priority"),
    ("priority out of range", (1, 2), dict(priority=101), JobOptionError, "priority"),
    ("a set", ({1, 2}, 0), {}, NonJSONArgumentError, None),
    ("an object", (Opaque(), 0), {}, NonJSONArgumentError, None),
    ("a bytearray", (bytearray(b"raw"), 0), {}, NonJSONArgumentError, None),
]


@pytest.mark.parametrize("path", ["apply_async", "headers", "send_task"])
@pytest.mark.parametrize("args, options, error, option", [c[1:] for c in BAD_CALLS],
                         ids=[c[0] for c in BAD_CALLS])
def test_bad_calls_raise_typed_errors_and_send_nothing(
        app: Celery, amqp_channel: amqp.Channel, caller_queue: str, path: str, args: Any,
        options: dict[str, Any], error: type, option: str | None) -> None:
    add = app.tasks["math.add"]
    with pytest.raises(error) as info:
        if path == "apply_async":
            add.apply_async(args, queue=caller_queue, **options)
        elif path == "headers":  # a custom header travels in x_celery
            add.apply_async(args, queue=caller_queue, headers={"h": 1}, **options)
        else:
            app.send_task("math.add", args, queue=caller_queue, **options)
    assert "'math.add'" in str(info.value)
    if option is not None:
        assert info.value.option == option
    assert queue_depth(amqp_channel, f"ojs.queue.{caller_queue}") == 0
    # the same call without the bad value goes through
    add.apply_async((1, 2), queue=caller_queue, headers={"h": 1} if path == "headers" else None)
    assert queue_depth(amqp_channel, f"ojs.queue.{caller_queue}") == 1


def test_a_bad_batch_sends_nothing(app: Celery, amqp_channel: amqp.Channel,
                                   caller_queue: str) -> None:
    add = app.tasks["math.add"]
    with pytest.raises(JobOptionError, match="batch job #1"):
        ojs_kombu.enqueue_many(app, [add.s(1, 2).set(queue=caller_queue),
                                     add.s(3, 4).set(queue=caller_queue, priority=-101)])
    with pytest.raises(NonJSONArgumentError):
        ojs_kombu.enqueue_many(app, [add.s({1}, 2).set(queue=caller_queue)])
    assert queue_depth(amqp_channel, f"ojs.queue.{caller_queue}") == 0


def test_a_job_over_ojs_max_job_bytes_is_refused_naming_it(
        broker_url: str, amqp_channel: amqp.Channel, caller_queue: str) -> None:
    small = make_app("hostile-small", broker_url, None, ojs_max_job_bytes=4096)
    try:
        add = small.tasks["math.add"]
        big = "x" * 5000
        calls = [lambda: add.apply_async((big, 0), queue=caller_queue),
                 lambda: add.apply_async((big, 0), queue=caller_queue, headers={"h": 1}),
                 lambda: small.send_task("math.add", (big, 0), queue=caller_queue),
                 lambda: ojs_kombu.enqueue_many(small, [add.s(big, 0).set(queue=caller_queue)])]
        for call in calls:
            with pytest.raises(JobTooLargeError) as info:
                call()
            assert info.value.limit == 4096 and info.value.size > 5000
            assert info.value.job_id and info.value.job_id in str(info.value)
        assert queue_depth(amqp_channel, f"ojs.queue.{caller_queue}") == 0
        add.apply_async(("small", 0), queue=caller_queue)
        assert queue_depth(amqp_channel, f"ojs.queue.{caller_queue}") == 1
    finally:
        small.close()
