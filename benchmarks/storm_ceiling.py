"""The broker's ceiling for the backlog storm: a raw py-amqp consumer on the same
backlog, the same prefetch as the storm's worker, without Celery or ojs_kombu.

Two ways to dead-letter a delivery, on the same OJS topology:

* ``reject``: ``Basic.Reject(requeue=false)``; the broker moves the message to the
  queue's dead-letter exchange itself (what plain Celery does with an unregistered
  task, and what ``ojs_dead_letter_mode="nack"`` does with a failed job);
* ``copy``: what the binding asks for a delivery that is not a runnable job: a copy
  with ``x-ojs-error-code``/``x-ojs-error-message`` published (mandatory) to
  ``ojs.exchange.dlx``, and the delivery acked once the broker has confirmed the
  copy, so that nothing is lost between the two.

``copy`` holds each delivery for a confirm round trip (a persistent message in a
durable queue: the broker's write) inside the consumer's prefetch window; the
ratio of the two rates is the ceiling of an ojs_kombu worker against plain
Celery's at that prefetch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import amqp
from poison_storm import QUEUE, Admin
from storm_app import make_app
from storm_messages import PipelinedPublisher, ojs_poison

import ojs_kombu
from ojs_kombu.spec.naming import UNROUTABLE

MODES = ("reject", "copy")


def watch_dead_letters(admin: Admin, queue: str, expected: int, timeout_s: float,
                       poll_s: float, check: Callable[[], None] = lambda: None
                       ) -> tuple[tuple[float, int] | None, tuple[float, int]]:
    """Poll ``queue``'s depth until it holds ``expected`` or ``timeout_s`` passed: the
    (time, depth) of the first poll that saw a dead letter and of the last rise."""
    started = time.perf_counter()
    first: tuple[float, int] | None = None
    last = (started, 0)
    while time.perf_counter() < started + timeout_s:
        depth = admin.depth(queue) or 0
        now = time.perf_counter()
        if depth and first is None:
            first = (now, depth)
        if depth > last[1]:
            last = (now, depth)
        if depth >= expected:
            break
        check()
        time.sleep(poll_s)
    return first, last


def _consume(connection: amqp.Connection, queue: str, mode: str, prefetch: int,
             dlx_exchange: str, routing_key: str, stop: threading.Event) -> None:
    channel = connection.channel()
    channel.basic_qos(0, prefetch, False)
    copies = connection.channel()
    copies.confirm_select()
    held: dict[int, int] = {}  # publish sequence -> delivery tag
    sequence = 0

    def confirmed(tag: int, multiple: bool) -> None:
        for number in sorted(n for n in held if n == tag or (multiple and n <= tag)):
            channel.basic_ack(held.pop(number))

    copies.events["basic_ack"].add(confirmed)

    def on_message(message: amqp.Message) -> None:
        nonlocal sequence
        tag = message.delivery_info["delivery_tag"]
        if mode == "reject":
            channel.basic_reject(tag, requeue=False)
            return
        properties = dict(message.properties)
        headers = dict(properties.get("application_headers") or {})
        headers.update({"x-ojs-error-code": "UNKNOWN_JOB_TYPE",
                        "x-ojs-error-message": "no task handles this type"})
        properties["application_headers"] = headers
        sequence += 1
        held[sequence] = tag
        copies.basic_publish(amqp.Message(message.body, **properties), exchange=dlx_exchange,
                             routing_key=routing_key, mandatory=True)

    channel.basic_consume(queue, callback=on_message)
    while not stop.is_set():
        with suppress(TimeoutError, OSError):
            connection.drain_events(timeout=0.1)


def measure(admin: Admin, connect: Callable[[], amqp.Connection], ojs_url: str, mode: str,
            jobs: int, prefetch: int, marker: str, poll_s: float = 0.01,
            timeout_s: float = 120.0) -> dict[str, Any]:
    """Queue ``jobs`` unknown-type jobs, then dead-letter them raw by ``mode``; the rate
    from the first dead letter to the last, polled as the storm polls its sides."""
    app = make_app(ojs_url, QUEUE, f"{marker}-ctl", ojs_prefix=marker)
    names = app.amqp.binding.names
    ojs_queue = names.ojs_queue(QUEUE)
    job_queue, dead_queue = names.job_queue(ojs_queue), names.dead_letter_queue(ojs_queue)
    publisher, consumer = connect(), connect()
    stop = threading.Event()
    try:
        ojs_kombu.declare_topology(app, [QUEUE])
        poison = [m for m in ojs_poison(jobs, ojs_queue) if m[0] == "unknown type"]
        PipelinedPublisher(publisher).publish(poison, names.direct_exchange, ojs_queue)
        thread = threading.Thread(target=_consume, args=(
            consumer, job_queue, mode, prefetch, names.dlx_exchange, ojs_queue, stop))
        thread.start()
        first, last = watch_dead_letters(admin, dead_queue, len(poison), timeout_s, poll_s)
        stop.set()
        thread.join(10)
    finally:
        for connection in (publisher, consumer):
            with suppress(Exception):
                connection.close()
        # every exchange of the prefix (those never declared are skipped) and the
        # unroutable dead letters' queue the guard exchange routes to
        admin.delete([job_queue, dead_queue, names.control_queue(ojs_queue),
                      names.dead_letter_queue(UNROUTABLE)], names.exchanges())
        app.close()
    span = last[0] - first[0] if first else 0.0
    return {"mode": mode, "prefetch": prefetch, "published": len(poison),
            "dead_lettered": last[1],
            "rate": (last[1] - first[1]) / span if first and span > 0 else None}


def render(rows: list[dict[str, Any]]) -> list[str]:
    """One line per mode and prefetch, then copy/reject per prefetch."""
    lines = ["Raw py-amqp consumer on the same backlog (the broker's ceiling): "
             "Basic.Reject into the DLX vs a confirmed copy with x-ojs-error-* then the ack",
             "", f"{'mode':<8} {'prefetch':>8} {'dead-lettered':>13} {'per s':>8}"]
    for row in rows:
        rate = f"{row['rate']:.0f}" if row["rate"] else "-"
        lines.append(f"{row['mode']:<8} {row['prefetch']:>8} {row['dead_lettered']:>13} "
                     f"{rate:>8}")
    for prefetch in sorted({row["prefetch"] for row in rows}):
        rates = {row["mode"]: row["rate"] for row in rows if row["prefetch"] == prefetch}
        if rates.get("reject") and rates.get("copy"):
            lines.append(f"prefetch {prefetch}: copy / reject "
                         f"{rates['copy'] / rates['reject']:.2f}x")
    return lines
