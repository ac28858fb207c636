"""docs/topology.rst, docs/production.rst, docs/unique-jobs.rst, docs/control-plane.rst:
settings."""

from __future__ import annotations

from typing import Any

from celery import Celery

import ojs_kombu


def queue_bounds(app: Celery) -> None:
    # [queue-bounds]
    app.conf.ojs_queue_defaults = {"max_depth": 100_000}          # every queue
    app.conf.ojs_queues = {
        "email": {"max_depth": 10_000, "strategy": "reject", "warn_at": 0.8},
        "reports": {"max_depth": 50, "strategy": "block", "block_timeout": 10},
        "notifications": {"max_depth": 1000, "strategy": "drop_oldest"},
        "payments": {"type": "quorum", "dead_letter_strategy": "at-least-once",
                     "max_depth": 10_000},
        "bulk": {"priority": False},
    }
    # [/queue-bounds]


def tls_app() -> Celery:
    # [tls]
    import ssl

    app = Celery("proj", broker="ojss://worker:secret@rabbit1.example.com/prod")
    ojs_kombu.install(app)
    app.conf.broker_use_ssl = {
        "ca_certs": "/etc/ojs/ca.pem",       # the CA that signed the broker's certificate
        "certfile": "/etc/ojs/client.pem",   # this client's certificate (for verify_peer)
        "keyfile": "/etc/ojs/client.key",
        "cert_reqs": ssl.CERT_REQUIRED,
        # no server_hostname needed: the URL's host (rabbit1.example.com) is checked
    }
    # [/tls]
    return app


def cluster(app: Celery) -> None:
    # [cluster]
    app.conf.broker_url = ";".join(f"ojss://worker:secret@rabbit{n}.example.com/prod"
                                   for n in (1, 2, 3))
    app.conf.ojs_queue_defaults = {"type": "quorum"}
    # [/cluster]


def control_users(app: Celery) -> None:
    # [control-users]
    app.conf.ojs_control_users = {
        "*": ["ojs-operator"],            # ojs-kombu cancel/info, conformance
        "billing": ["billing-producer"],  # e.g. ojs_unique on_conflict "replace"
    }
    # [/control-users]


def event_sinks(app: Celery) -> None:
    # [event-sinks]
    # in config: where each process sends its events
    app.conf.ojs_event_sinks = [
        "amqp",                                   # topic exchange ojs.exchange.events
        # or {"amqp": True, "batch_size": 500, "batch_ms": 50}: events per message, wait
        "file:/var/log/ojs/events.jsonl",         # one JSON object per line
        {"webhook": "https://hooks.example.com/ojs", "secret": "s3cret",
         "filter": {"event_types": ["job.failed", "job.discarded"]}},
    ]
    # [/event-sinks]


def unique_jobs(app: Celery, refresh: Any, user_id: int, order_id: int) -> Any:
    # [unique-jobs]
    app.conf.ojs_dedup_url = "redis://127.0.0.1:6379/0"

    @app.task(ojs_idempotency_key=True)          # the job id is the key
    def charge(order_id): ...

    charge.apply_async((42,), ojs_idempotency_key=f"charge:{order_id}")
    refresh.apply_async((user_id,), ojs_unique={"keys": ["type", "args"],
                                                "period": "PT10M",
                                                "on_conflict": "ignore"})
    # [/unique-jobs]
    return charge
