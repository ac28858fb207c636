"""A decided outcome (:func:`ojs_kombu.spec.failures.decide`) as broker operations.

* ack: ``Basic.Ack``;
* retry (section 5.4): the job, its error recorded and ``x-ojs-attempt``
  incremented, through ``ojs.exchange.retry`` into the delay queue of its
  delay, then the ack;
* wait (section 9): an early job back through the scheduling ladder, then the ack;
* dead letter (section 5.5): ``Basic.Nack(requeue=false)``, which the queue's
  dead-letter arguments route to ``ojs.queue.dlx.{q}`` (AMQP-009); with
  ``ojs_dead_letter_mode="republish"``, and always for a message that is not
  a valid job (its dead letter must say why), a copy with ``x-ojs-error-*``
  headers published to ``ojs.exchange.dlx``, then the ack.

Copies go through the connection's :class:`~ojs_kombu.amqp.consuming.outcomes.OutcomePublisher`:
nothing here waits for the broker, except :func:`retry_and_wait`, for callers
outside a worker's loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import amqp

from ...spec.delays import MAX_SCHEDULE_DELAY_MS, retry_delay_ms
from ...spec.errors import PublishConfirmTimeout
from ...spec.failures import (
    Action,
    Delivered,
    Happened,
    JobFailure,
    Outcome,
    decide,
    record_failure,
    with_error_headers,
    without_death_headers,
)
from ..job_channel import JobChannel, JobDelivery
from ..publishing.ledger import Replaced
from ..publishing.publisher import schedule_route
from .outcomes import PendingOutcome

logger = logging.getLogger(__name__)
#: A retry's ``scheduled_at`` is at most this far ahead (about 95 years: a datetime
#: goes no further than the year 9999).
MAX_DUE_S = 3e9


def settle(channel: JobChannel, delivery: JobDelivery, delivery_tag: int, outcome: Outcome,
           on_settled: Callable[[], None] | None = None) -> None:
    """Carry out ``outcome`` for ``delivery`` on ``channel``, the channel it came on.

    ``on_settled`` runs once the delivery is settled (for callers outside an
    event loop that wait for it).
    """
    action = outcome.action
    if action is Action.ACK:
        channel.basic_ack(delivery_tag)
    elif action is Action.RETRY:
        _retry(channel, delivery, delivery_tag, outcome, on_settled)
        return
    elif action is Action.WAIT:
        _wait(channel, delivery, delivery_tag, outcome.delay_s, on_settled)
        return
    else:
        _dead_letter(channel, delivery, delivery_tag, outcome, on_settled)
        return
    if on_settled is not None:
        on_settled()


def retry_and_wait(channel: JobChannel, delivery: JobDelivery, delivery_tag: int,
                   failure: JobFailure, delay_s: float, timeout: float | None = None) -> int:
    """Retry ``delivery`` and wait until the broker confirmed the copy (for callers
    outside a worker's loop, such as ``ojs-kombu conformance``); returns the delay
    queue's delay in ms."""
    done: list[bool] = []
    outcome = decide(Delivered(Happened.RETRY_REQUESTED, failure, delay_s=delay_s),
                     delivery.attempt)
    settle(channel, delivery, delivery_tag, outcome, lambda: done.append(True))
    limit = timeout or channel.ojs.settings.confirm_timeout
    if not channel.connection.wait_until(lambda: bool(done), limit):
        raise PublishConfirmTimeout(f"no confirm for the retry of job {delivery.job_id} "
                                    f"within {limit}s", job_id=delivery.job_id,
                                    queue=delivery.queue)
    return retry_delay_ms(delay_s)


def _retry(channel: JobChannel, delivery: JobDelivery, delivery_tag: int, outcome: Outcome,
           on_settled: Callable[[], None] | None) -> None:
    assert outcome.failure is not None
    delay_ms = retry_delay_ms(outcome.delay_s)
    now = datetime.now(UTC)
    # the retry queue's rung may be shorter than the delay, never longer: the job's
    # scheduled_at sends it on through the scheduling ladder for the rest
    body, headers = record_failure(delivery.body, delivery.headers, outcome.failure,
                                   attempt=delivery.attempt, state="retryable", now=now,
                                   due=now + timedelta(seconds=min(outcome.delay_s, MAX_DUE_S)))
    headers["x-ojs-attempt"] = delivery.attempt + 1
    queue, connection = delivery.queue, channel.connection
    exchange, routing_key = connection.retry_route(queue, delay_ms)
    _send(channel, "retry", delivery, delivery_tag, _copy(delivery, body, headers),
          exchange, routing_key,
          lambda via: connection.ensure_retry_queue(queue, delay_ms, via), on_settled)
    logger.info("job %s failed attempt %d (%s: %s); retrying in %.3f s", delivery.job_id,
                delivery.attempt, outcome.failure.code, outcome.failure.message,
                outcome.delay_s)


def _wait(channel: JobChannel, delivery: JobDelivery, delivery_tag: int, seconds: float,
          on_settled: Callable[[], None] | None) -> None:
    # beyond the ladder's reach the job waits as long as it can, then again
    delay_ms = min(max(1, round(seconds * 1000)), MAX_SCHEDULE_DELAY_MS)
    message = _copy(delivery, delivery.body, without_death_headers(delivery.headers))
    exchange, routing_key, mandatory, prepare = schedule_route(
        channel.connection, message.properties, delivery.job_id, delivery.queue, delay_ms)
    _send(channel, "reschedule", delivery, delivery_tag, message, exchange, routing_key,
          prepare, on_settled, mandatory=mandatory)


def _dead_letter(channel: JobChannel, delivery: JobDelivery, delivery_tag: int, outcome: Outcome,
                 on_settled: Callable[[], None] | None) -> None:
    failure = outcome.failure
    assert failure is not None
    connection = channel.connection
    queue = delivery.queue
    connection.ojs_outcomes.log_dead_letter(delivery.job_id, queue, failure.code,
                                            failure.message)
    if outcome.invalid_input:
        headers = with_error_headers(delivery.headers, failure.code, failure.message)
        message = _copy(delivery, delivery.body, headers, keep_id=True)
    elif connection.ojs.settings.dead_letter_mode == "nack":
        channel.basic_nack(delivery_tag, multiple=False, requeue=False)
        if on_settled is not None:
            on_settled()
        return
    else:
        body, headers = record_failure(delivery.body, delivery.headers, failure,
                                       attempt=delivery.attempt, state="discarded")
        message = _copy(delivery, body, headers)
    _send(channel, "dead letter", delivery, delivery_tag, message,
          connection.ojs.names.dlx_exchange, queue,
          lambda via: connection.ensure_topology(queue, via), on_settled)


def _send(channel: JobChannel, what: str, delivery: JobDelivery, delivery_tag: int,
          message: amqp.Message, exchange: str, routing_key: str,
          prepare: Callable[[Callable[..., None]], None] | None,
          on_settled: Callable[[], None] | None, *, mandatory: bool = True) -> None:
    channel.connection.ojs_outcomes.publish(PendingOutcome(
        what, delivery.job_id, delivery.queue, message, exchange, routing_key, mandatory,
        Replaced(channel, delivery_tag), prepare, on_settled=on_settled))


def _copy(delivery: JobDelivery, body: bytes, headers: dict[str, Any], *,
          keep_id: bool = False) -> amqp.Message:
    properties = dict(delivery.properties)
    properties["application_headers"] = headers
    if not keep_id or not properties.get("message_id"):
        properties["message_id"] = delivery.job_id
    return amqp.Message(body, **properties)
