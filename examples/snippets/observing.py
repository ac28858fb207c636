"""docs/events.rst and docs/production.rst: subscribers, observers, metrics, tracing."""

from __future__ import annotations

from typing import Any

from celery import Celery

import ojs_kombu

from .observer import SlowJobs


def subscribe(app: Celery) -> None:
    # [subscribe]
    # in-process, with the section 6.1 filters (AND across keys, "job.*" prefixes)
    ojs_kombu.subscribe(app, print, event_types=["job.*"], queues=["email"])

    # the out-of-catalog events (backpressure.*, connection.reconnected,
    # consumer.cancelled) arrive as OJS-envelope dicts, only when named ("*" alone
    # does not match them, so a sink that expects catalog events never gets one)
    ojs_kombu.subscribe(app, print, event_types=["backpressure.*", "connection.*"])
    # [/subscribe]


def reconnections(app: Celery) -> Any:
    # [reconnections]
    subscription = ojs_kombu.subscribe(
        app, lambda event: print(event["type"], event["data"]),
        event_types=["connection.reconnected", "consumer.cancelled"])
    subscription.cancel()  # when done
    # [/reconnections]
    return subscription


def dashboard(ch: Any) -> None:
    # [decode-events]
    from ojs_kombu.events.wire import decode_events

    ch.queue_declare("my-dashboard", durable=True)
    ch.queue_bind("my-dashboard", "ojs.exchange.events", "job.*")

    def on_message(message):
        for event in decode_events(message.body, message.properties.get("content_type")):
            print(event["type"], event["subject"], event["data"])

    ch.basic_consume("my-dashboard", no_ack=True, callback=on_message)
    # [/decode-events]




def add_observer(app: Celery) -> SlowJobs:
    observer = SlowJobs()
    # [add-observer]
    ojs_kombu.add_observer(app, SlowJobs())      # ojs_kombu.remove_observer(app, ...)
    # [/add-observer]
    return observer
