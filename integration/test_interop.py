"""Interop with OJS clients that are not Celery (AMQP binding section 15)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import amqp
import pika
from celery import Celery

from ojs_kombu.spec.job_ids import new_job_id
from ojs_kombu.spec.naming import is_job_id

from .apps import make_app
from .conftest import HOST, PORT, body_of, get_message, private_vhost
from .test_helpers import check_job
from .workers import in_process_worker


def test_spec_example_publisher_job_runs_as_a_celery_task() -> None:
    """Section 15.1's pika producer, verbatim but for host, vhost and the id source.

    It declares ``ojs.queue.email`` with ``x-max-priority: 10``: an app sharing the
    queue with such producers asks for that priority (priority queues are optional in
    section 7.2, and ojs_kombu declares them where the app asks)."""
    with private_vhost("ojs-kombu-interop") as vhost:
        app = make_app("interop", f"ojs://guest:guest@{HOST}:{PORT}/{vhost}",
                       ojs_queues={"email": {"priority": 10}})
        with in_process_worker(app, ["email"]):
            job_id = publish_spec_example(vhost)
            call = app.calls.wait_for(job_id)
    assert call["task"] == "email.send"
    assert call["args"] == ["user@example.com", "welcome"]


def publish_spec_example(vhost: str) -> str:
    """Section 15.1's producer; the job's id."""
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        host=HOST, port=PORT, virtual_host=vhost))
    ch = conn.channel()
    ch.confirm_delivery()

    # Declare topology (idempotent)
    ch.exchange_declare(exchange='ojs.exchange.direct', exchange_type='direct', durable=True)
    ch.exchange_declare(exchange='ojs.exchange.dlx', exchange_type='direct', durable=True)
    ch.queue_declare(queue='ojs.queue.email', durable=True, arguments={
        'x-dead-letter-exchange': 'ojs.exchange.dlx',
        'x-dead-letter-routing-key': 'email',
        'x-max-priority': 10,
    })
    ch.queue_bind(queue='ojs.queue.email', exchange='ojs.exchange.direct', routing_key='email')

    job_id = new_job_id()  # the example's uuid.uuid7() needs Python 3.14
    job = {
        "id": job_id, "type": "email.send", "queue": "email",
        "args": ["user@example.com", "welcome"],
        "created_at": datetime.now(UTC).isoformat(),
    }

    ch.basic_publish(
        exchange='ojs.exchange.direct', routing_key='email',
        body=json.dumps(job), mandatory=True,
        properties=pika.BasicProperties(
            message_id=job_id, type='email.send',
            content_type='application/openjobspec+json', content_encoding='utf-8',
            delivery_mode=2, app_id='ojs',
            timestamp=int(datetime.now(UTC).timestamp()),
            headers={'x-ojs-queue': 'email', 'x-ojs-attempt': 1, 'x-ojs-max-attempts': 5},
        ),
    )
    conn.close()
    return job_id


def test_celery_job_is_a_complete_ojs_message_for_a_raw_consumer(
        app: Celery, amqp_channel: amqp.Channel) -> None:
    """A raw AMQP consumer finds every required property, header, and a schema-valid body."""
    send = app.tasks["email.send"]
    meta = {"tenant_id": "acme", "tags": ["welcome", "eu"], "idempotency_key": "signup-42",
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    result = send.apply_async(("user@example.com", "welcome"), queue="rawread",
                              priority=5, ojs_meta=meta)
    assert is_job_id(result.id)

    message = get_message(amqp_channel, "ojs.queue.rawread")
    props = message.properties
    assert message.delivery_info["exchange"] == "ojs.exchange.direct"
    assert message.delivery_info["routing_key"] == "rawread"
    assert props["message_id"] == result.id
    assert props["type"] == "email.send"
    assert props["content_type"] == "application/openjobspec+json"
    assert props["content_encoding"] == "utf-8"
    assert props["delivery_mode"] == 2
    assert props["app_id"] == "ojs"
    assert props["priority"] == 5
    assert props["correlation_id"] == result.id
    headers = props["application_headers"]
    created = datetime.fromisoformat(headers["x-ojs-created-at"])
    assert props["timestamp"] == int(created.timestamp())  # epoch seconds of created_at
    assert headers["x-ojs-queue"] == "rawread"
    assert headers["x-ojs-attempt"] == 1
    # ojs_retry_semantics="celery" (the default): no autoretry_for, a failure is not retried
    assert headers["x-ojs-max-attempts"] == 1
    for key in ("x-ojs-created-at", "x-ojs-enqueued-at"):
        assert datetime.fromisoformat(headers[key])
    assert headers["x-ojs-tags"] == "welcome,eu"
    assert headers["x-ojs-idempotency-key"] == "signup-42"
    assert headers["x-ojs-trace-id"] == meta["traceparent"]
    assert not any(k in headers for k in ("task", "id", "lang", "argsrepr"))  # no Celery headers
    assert "x-ojs-scheduled-at" not in headers

    body = body_of(message)
    check_job(body)
    assert body["id"] == result.id and body["type"] == "email.send"
    assert body["queue"] == "rawread" and body["args"] == ["user@example.com", "welcome"]
    assert body["meta"] == meta and body["priority"] == 5
    assert body["retry"]["max_attempts"] == 1 and "x_celery" in body
