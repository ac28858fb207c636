"""How Celery's settlement of a consumed OJS job becomes an OJS outcome."""

from __future__ import annotations

import logging

from amqp.exceptions import RecoverableConnectionError
from kombu.exceptions import MessageStateError
from kombu.transport import pyamqp

from ...spec.failures import HANDLER_ERROR, Delivered, Happened, JobFailure, Outcome, decide
from ...spec.strict_input import INVALID_PAYLOAD
from ..job_channel import JobChannel, JobDelivery

logger = logging.getLogger(__name__)


class JobMessage(pyamqp.Message):
    """A delivery from an OJS job queue, as Celery sees it.

    Celery settles an unsuccessful delivery with ``reject()`` from its event
    loop's thread; here that carries out the outcome the worker decided
    (:attr:`ojs_outcome`, :func:`ojs_kombu.spec.failures.decide`): a broker-side
    retry, or the dead-letter queue.  Without one (a task that does not use
    ojs_kombu's request class), the job is dead-lettered.  Never an immediate
    requeue: the binding forbids it (section 5.4, it loops), so Celery's requeue
    of ``Reject(requeue=True)`` dead-letters it too.  Nothing here waits for the
    broker (:mod:`ojs_kombu.amqp.consuming.outcomes`).
    """

    ojs: JobDelivery
    ojs_outcome: Outcome | None = None

    def ack(self, multiple: bool = False) -> None:
        """Celery acks a message kombu could not decode (its ``on_decode_error``): a
        job is dead-lettered ``INVALID_PAYLOAD`` instead, never acked and dropped.
        (The transport's own checks refuse every such job first; this is the net.)"""
        if self.errors and self.ojs_outcome is None:
            exc = self.errors[0][1]
            self.ojs_outcome = decide(Delivered(Happened.INVALID, JobFailure(
                INVALID_PAYLOAD, INVALID_PAYLOAD,
                f"the message could not be decoded: {type(exc).__name__}: {exc}")),
                self.ojs.attempt)
            logger.error("job %s could not be decoded; dead-lettering it", self.ojs.job_id)
            return self.reject()
        return super().ack(multiple)

    def reject(self, requeue: bool = False) -> None:
        if self.acknowledged:
            raise MessageStateError(f"Message already acknowledged with state: {self._state}")
        outcome = self.ojs_outcome
        if outcome is None:
            reason = "requeue requested" if requeue else "rejected by Celery"
            outcome = decide(Delivered(Happened.HANDLER_ERROR,
                                       JobFailure(HANDLER_ERROR, "Rejected", reason),
                                       retryable=False), self.ojs.attempt)
            if requeue:
                logger.warning("job %s: OJS jobs are never requeued immediately (AMQP "
                               "binding 5.4); dead-lettering it instead", self.ojs.job_id)
        channel: JobChannel = self.channel
        connection = channel.connection
        if connection is None:  # lost: the broker redelivers the job (py-amqp's error)
            raise RecoverableConnectionError("connection already closed")
        try:
            channel.settle_job(self.ojs, self.delivery_tag, outcome)
        except connection.connection_errors:
            raise
        except Exception:
            logger.exception("job %s: could not %s it; nacking it into its dead-letter queue",
                             self.ojs.job_id, outcome.action.value.replace("_", "-"))
            channel.basic_nack(self.delivery_tag, multiple=False, requeue=False)
        self._state = "REJECTED"

    def requeue(self) -> None:
        self.reject(requeue=True)
