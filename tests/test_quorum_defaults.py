"""Quorum queues through one setting, and what RabbitMQ 4.x changes (no broker).

``ojs_queue_defaults = {"type": "quorum"}`` must make every queue a job can wait
in replicated, with at-least-once dead-lettering; RabbitMQ 4.x's default
``delivery-limit`` must end in ``ojs.queue.dlx.{q}``; ``x-death`` must be gone
from every republished job; workers must never ask for global QoS.  4.x cannot
run here: these are the exact arguments, headers and flags sent.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery.worker.consumer.tasks import Tasks

import ojs_kombu
from ojs_kombu.amqp.binding import Binding
from ojs_kombu.amqp.broker.topology import (
    declare_queue_topology,
    declare_retry_queue,
    declare_schedule_ladder,
)
from ojs_kombu.amqp.transport import Transport
from ojs_kombu.spec.errors import OJSConfigurationError
from ojs_kombu.spec.failures import (
    HANDLER_ERROR,
    JobFailure,
    record_failure,
    reset_for_replay,
    with_error_headers,
)
from ojs_kombu.spec.settings import OJSSettings

AT_LEAST_ONCE = {"x-queue-type": "quorum", "x-dead-letter-strategy": "at-least-once",
                 "x-overflow": "reject-publish"}
DEATH = {"x-death": [{"reason": "expired", "queue": "ojs.queue.retry.email.1000", "count": 1}],
         "x-first-death-reason": "expired", "x-first-death-queue": "ojs.queue.retry.email.1000",
         "x-first-death-exchange": "ojs.exchange.retry", "x-last-death-reason": "expired",
         "x-last-death-queue": "ojs.queue.retry.email.1000",
         "x-last-death-exchange": "ojs.exchange.retry"}


class Declared:
    """A channel that records every declaration (queue -> arguments)."""

    def __init__(self) -> None:
        self.queues: dict[str, dict[str, Any]] = {}

    def exchange_declare(self, exchange: str, type: str, *args: Any, **kwargs: Any) -> None:
        pass

    def exchange_bind(self, destination: str, source: str = "", *args: Any,
                      **kwargs: Any) -> None:
        pass

    def queue_declare(self, queue: str = "", *args: Any, **kwargs: Any) -> None:
        self.queues[queue] = dict(kwargs["arguments"])

    def queue_bind(self, queue: str, exchange: str = "", *args: Any, **kwargs: Any) -> None:
        pass


def settings(**options: Any) -> OJSSettings:
    return OJSSettings.from_options({f"ojs_{k}": v for k, v in options.items()}, source="test")


def declared(**options: Any) -> dict[str, dict[str, Any]]:
    """Every queue of ``email``'s topology, a retry queue and the scheduling ladder."""
    binding = Binding.from_settings(settings(**options))
    channel = Declared()
    arguments = binding.declare_arguments("email")
    declare_queue_topology(channel, binding.names, "email", arguments,
                           binding.settings.unroutable_dead_letter_arguments())
    declare_retry_queue(channel, binding.names, "email", 2000, arguments)
    declare_schedule_ladder(channel, binding.names, binding.settings.schedule_arguments())
    return channel.queues


def test_one_setting_makes_every_queue_a_job_waits_in_quorum_with_at_least_once() -> None:
    queues = declared(queue_defaults={"type": "quorum"})
    job = queues["ojs.queue.email"]
    assert job == {"x-dead-letter-exchange": "ojs.exchange.dlx",
                   "x-dead-letter-routing-key": "email", **AT_LEAST_ONCE}
    retry = queues["ojs.queue.retry.email.2000"]
    assert retry == {"x-dead-letter-exchange": "ojs.exchange.direct",
                     "x-dead-letter-routing-key": "email", "x-message-ttl": 2000,
                     **AT_LEAST_ONCE}  # no x-expires: it would delete waiting jobs
    for level in (0, 10, 31):
        rung = queues[f"ojs.queue.schedule.{level}"]
        assert {k: rung[k] for k in AT_LEAST_ONCE} == AT_LEAST_ONCE
    assert queues["ojs.queue.schedule.unroutable"] == AT_LEAST_ONCE
    # dead letters and control messages live on while a node is away
    assert queues["ojs.queue.dlx.email"] == {"x-queue-type": "quorum"}
    assert queues["ojs.queue.dlx.unroutable"] == {"x-queue-type": "quorum"}
    assert queues["ojs.queue.control.email"] == {"x-queue-type": "quorum"}


def test_classic_stays_the_default_and_declares_no_queue_type() -> None:
    queues = declared()
    assert not [name for name, args in queues.items() if "x-queue-type" in args
                or "x-dead-letter-strategy" in args]
    assert queues["ojs.queue.control.email"] == {}
    assert "x-expires" in queues["ojs.queue.retry.email.2000"]


def test_explicit_ladder_arguments_win_over_the_queue_defaults() -> None:
    assert settings(queue_defaults={"type": "quorum"},
                    schedule_queue_arguments={"x-queue-type": "quorum"}
                    ).schedule_arguments() == {"x-queue-type": "quorum"}
    assert settings(queues={"email": {"type": "quorum"}}).schedule_arguments() == {}


def test_no_mirrored_queue_arguments_anywhere() -> None:
    # classic mirrored queues are gone in RabbitMQ 4: replication is the quorum type
    for options in ({}, {"queue_defaults": {"type": "quorum"}}):
        for arguments in declared(**options).values():
            assert not [k for k in arguments if k.startswith(("x-ha-", "ha-"))]


def test_delivery_limit_is_sent_and_dead_letters_into_the_dlq() -> None:
    queues = declared(queue_defaults={"type": "quorum", "delivery_limit": 5})
    job = queues["ojs.queue.email"]
    assert job["x-delivery-limit"] == 5
    # over the limit RabbitMQ dead-letters (reason delivery_limit), never drops: the DLX
    # is ojs.exchange.dlx -> ojs.queue.dlx.email, at least once
    assert job["x-dead-letter-exchange"] == "ojs.exchange.dlx"
    assert job["x-dead-letter-strategy"] == "at-least-once"


def test_without_delivery_limit_the_broker_default_applies_and_still_dead_letters() -> None:
    # RabbitMQ 4.0+ gives quorum queues delivery-limit 20 when none is declared: the
    # queue's dead-letter arguments are what keep such a job
    job = declared(queue_defaults={"type": "quorum"})["ojs.queue.email"]
    assert "x-delivery-limit" not in job
    assert job["x-dead-letter-exchange"] == "ojs.exchange.dlx"


def test_delivery_limit_on_a_classic_queue_is_refused() -> None:
    with pytest.raises(OJSConfigurationError, match="delivery_limit needs type 'quorum'"):
        settings(queues={"email": {"delivery_limit": 5}})


@pytest.mark.parametrize("republish", [
    lambda h: record_failure(b'{"id": "x"}', h, JobFailure(HANDLER_ERROR, "E", "boom"),
                             attempt=1, state="retryable")[1],
    lambda h: with_error_headers(h, HANDLER_ERROR, "boom"),
    lambda h: reset_for_replay({"id": "x", "attempt": 3}, h)[1],
], ids=["retry or dead letter", "invalid input", "replay"])
def test_x_death_is_stripped_on_every_republish(republish: Any) -> None:
    # RabbitMQ 4 drops a message whose x-death shows a cycle of only `expired` reasons
    headers = republish({**DEATH, "traceparent": "00-abc-def-01", "x-ojs-attempt": 1})
    assert not [k for k in headers if k.startswith(("x-death", "x-first-death",
                                                    "x-last-death"))]
    assert headers["traceparent"] == "00-abc-def-01"


def test_workers_ask_for_per_consumer_qos_on_quorum_queues() -> None:
    # RabbitMQ 4 refuses global QoS on quorum queues; Celery sends global QoS when the
    # transport says its qos semantics are not the spec's
    app = Celery("quorum", broker="ojs://localhost//", set_as_current=False)
    ojs_kombu.install(app)
    app.conf.ojs_queue_defaults = {"type": "quorum"}
    semantics = Transport(SimpleNamespace(transport_options={})).qos_semantics_matches_spec(None)
    consumer = SimpleNamespace(app=app, connection=SimpleNamespace(
        qos_semantics_matches_spec=semantics, transport=SimpleNamespace(driver_type="amqp")))
    assert Tasks.qos_global(Tasks.__new__(Tasks), consumer) is False
