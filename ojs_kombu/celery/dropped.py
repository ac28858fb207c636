"""The worker side of ``drop_oldest`` (backpressure section 5.3): ``backpressure.dropped``.

With ``x-overflow=drop-head`` RabbitMQ drops the oldest job of a full queue
without telling anyone but the dead-letter exchange: the job is dead-lettered
to ``ojs.exchange.dlx`` (routing key: the queue) with reason ``maxlen``.  For
``drop_oldest`` queues the topology therefore holds a small tap queue,
``ojs.queue.dropped.{q}``, bound there beside the DLQ.  Each worker that
consumes a ``drop_oldest`` queue consumes its tap (competitively, so each drop
is reported once), emits ``backpressure.dropped`` and counts
``ojs.backpressure.dropped_total`` for every job dropped for ``maxlen``, and
acks the copy; the DLQ keeps the job.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from functools import partial
from typing import Any

import amqp
from celery import bootsteps

from ..amqp.binding import Binding
from ..amqp.job_channel import JobConnection
from ..spec.backpressure import maxlen_death
from ..spec.times import format_time
from .events import consumed_queues

logger = logging.getLogger(__name__)

#: Unacked tap messages per worker channel.
TAP_PREFETCH = 64


class DroppedJobs(bootsteps.StartStopStep):
    """Consumer bootstep: consume ``ojs.queue.dropped.{q}`` of every ``drop_oldest``
    queue this worker consumes."""

    name = "ojs_kombu.dropped_jobs"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._channel: Any = None

    def start(self, parent: Any) -> None:
        binding: Binding = parent.app.amqp.binding
        queues = [q for q in consumed_queues(parent.app) if binding.bounds(q).drops]
        if not queues:
            return
        channel = parent.connection.channel()
        channel.basic_qos(0, TAP_PREFETCH, False)
        amqp_connection: JobConnection = parent.connection.connection
        for queue in queues:
            amqp_connection.ensure_topology(queue)  # declares the tap
            channel.basic_consume(binding.names.dropped_queue(queue),
                                  callback=partial(self.on_message, binding, queue))
        self._channel = channel

    def stop(self, parent: Any) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            try:
                channel.close()
            except Exception:
                logger.debug("closing the dropped-jobs channel failed", exc_info=True)

    shutdown = stop

    @staticmethod
    def on_message(binding: Binding, queue: str, message: amqp.Message) -> None:
        """Report one dead letter of ``queue`` if the bound dropped it; always ack it
        (rejected and expired jobs are dead letters too, and the DLQ keeps them all)."""
        try:
            report_dropped(binding, queue, message)
        except Exception:  # a report must never stop the worker
            logger.exception("could not report dead letter %s of queue %r",
                             message.properties.get("message_id"), queue)
        message.channel.basic_ack(message.delivery_tag)


def report_dropped(binding: Binding, queue: str, message: amqp.Message) -> bool:
    """``backpressure.dropped`` for ``message`` when ``queue`` dropped it for its bound."""
    properties = message.properties
    death = maxlen_death(properties.get("application_headers") or {},
                         binding.names.job_queue(queue))
    if death is None:
        return False
    when = death.get("time")
    if isinstance(when, datetime):
        when = format_time(when if when.tzinfo else when.replace(tzinfo=UTC))
    binding.backpressure.dropped(queue, properties.get("message_id"), properties.get("type"),
                                 dropped_at=when if isinstance(when, str) else None)
    return True
