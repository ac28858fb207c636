"""The worker's control queues: CANCEL, BEAT and INFO received and answered.

A consumer bootstep consumes ``ojs.queue.control.{q}`` for every queue the
worker consumes (AMQP binding sections 5.6 to 5.8), hands each message to
:mod:`ojs_kombu.celery.control` (CANCEL broadcast, INFO answered from a
bounded pool of threads), consumes a deleted control queue again on the
reconnection schedule (AMQP-026/027) and publishes job heartbeats.

A CANCEL or INFO is honoured only from a broker user authorised for the queue
whose control queue it came through (its broker-checked ``user_id``: the
worker's own user, or one ``ojs_control_users`` lists), and only for a job of
that queue; an INFO answer goes only to a reply queue of the requester's own.
Anything else is refused, logged (once per reason and queue), counted
(``ojs.control.refused``) and acked.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from typing import Any

import amqp
from celery import Celery, bootsteps
from celery.worker import state as worker_state

from ..amqp.broker.control import (
    CANCEL,
    FORBIDDEN,
    HEARTBEAT,
    INFO,
    control_message,
    login_user,
    parse_control,
    reply_queue_problem,
    reply_to_problem,
)
from ..amqp.broker.reconnect import DEFAULT_POLICY
from ..amqp.consuming.delivery import JobMessage
from ..amqp.job_channel import JobChannel, JobConnection
from ..events.metrics import OJSMetrics
from ..spec.times import format_time
from .control import ANSWER_FAILED, job_info
from .events import consumed_queues

logger = logging.getLogger(__name__)


#: Control messages a worker holds unacknowledged on its control channel.
CONTROL_PREFETCH = 16
#: INFO requests a worker answers at the same time (each waits for the other workers).
INFO_THREADS = 4
#: INFO requests a worker holds (answering or waiting); more are dropped with a warning.
INFO_BACKLOG = 64


class ControlQueues(bootsteps.StartStopStep):
    """Consumer bootstep: consume the control queues and publish job heartbeats."""

    name = "ojs_kombu.control_queues"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._channel: JobChannel | None = None
        self._timer: Any = None
        # A burst of INFO requests must not start a thread each: a few answer,
        # a bounded backlog waits, the rest are dropped (their callers time out).
        self._info_pool = ThreadPoolExecutor(INFO_THREADS, thread_name_prefix="ojs-info")
        self._info_slots = threading.BoundedSemaphore(INFO_BACKLOG)
        #: The broker user the worker's consumer logs in as (read at start): its own
        #: requests are always honoured.
        self.own_user: str | None = None
        self._refusals_logged: set[tuple[str, str, str]] = set()

    def start(self, parent: Any) -> None:
        binding = parent.app.amqp.binding
        self.own_user = login_user(parent.connection)
        channel = parent.connection.channel()
        if binding.settings.control_queues:
            channel.basic_qos(0, CONTROL_PREFETCH, False)
            amqp_connection: JobConnection = parent.connection.connection
            self._channel = channel
            for queue in consumed_queues(parent.app):
                amqp_connection.ensure_topology(queue)
                self._consume(parent, channel, queue)
        self._channel = channel
        interval = binding.settings.job_heartbeat
        if interval and parent.timer is not None:
            self._timer = parent.timer.call_repeatedly(interval, self.beat, (parent, interval),
                                                       priority=10)

    def _consume(self, parent: Any, channel: JobChannel, queue: str) -> None:
        channel.basic_consume(
            parent.app.amqp.binding.names.control_queue(queue),
            callback=lambda message, p=parent, q=queue: self.on_message(p, message, q),
            on_cancel=lambda tag, p=parent, q=queue: self._cancelled(p, q, tag))

    def _cancelled(self, parent: Any, queue: str, consumer_tag: str) -> None:
        """The broker cancelled the consumer of ``queue``'s control queue (deleted by an
        operator or ``ojs-kombu conformance --recovery``): declare it again and consume
        it, on this channel, from the event loop (AMQP-026/027), instead of the
        connection loss an unhandled ``Basic.Cancel`` would be.

        After the first delay of the reconnection schedule, as for a job queue: RabbitMQ
        4.0 cancels the consumers of a quorum queue when it stops the queue's Raft
        members, before it removes the queue itself, so a declaration made at once finds
        the dying queue (``Declare-Ok``) and the consume then fails with 404, or with a
        541 that closes the whole connection (:meth:`_resume_later`)."""
        delay = DEFAULT_POLICY.delay(1)
        logger.warning("the broker cancelled consumer %s of the control queue of OJS queue "
                       "%r (was it deleted?); declaring it again and consuming it in %.1fs",
                       consumer_tag, queue, delay)
        binding = parent.app.amqp.binding
        binding.hook.consumer_cancelled(binding.names.control_queue(queue),
                                        {"consumer_tag": consumer_tag,
                                         "retry_in_ms": round(delay * 1000)})
        self._resume_later(parent, [queue], 1, delay)

    def _resume_later(self, parent: Any, queues: list[str], attempt: int, delay: float
                      ) -> None:
        """Declare and consume the control queues of ``queues`` again in ``delay`` seconds.

        A channel error (404: the queue was still being deleted when it was declared)
        closes the channel and every control consumer on it: all of them are consumed
        again on a new channel at the schedule's next delay.  A connection error (541)
        is left to the event loop, which hands it to Celery's reconnection (its restart
        of this step consumes them all again); any other error is logged."""
        channel = self._channel

        def resume() -> None:
            if channel is None or self._channel is not channel or not channel.is_open:
                return  # stopped, or a reconnect or a later try consumes them again
            connection: JobConnection = parent.connection.connection
            try:
                for queue in queues:
                    connection.forget_topology(queue)
                    connection.ensure_topology(queue)
                    self._consume(parent, channel, queue)
            except amqp.exceptions.ChannelError as exc:
                again = DEFAULT_POLICY.delay(attempt + 1)
                logger.warning("could not consume the control queues of %s again (%s); "
                               "on a new channel in %.1fs", ", ".join(map(repr, queues)), exc,
                               again)
                with suppress(Exception):
                    channel.close()  # py-amqp reopened it, without its consumers
                fresh = parent.connection.channel()
                fresh.basic_qos(0, CONTROL_PREFETCH, False)
                self._channel = fresh
                self._resume_later(parent, consumed_queues(parent.app), attempt + 1, again)
            except connection.connection_errors:
                raise
            except Exception:
                logger.exception("could not consume the control queues of %s again",
                                 ", ".join(map(repr, queues)))

        if parent.timer is not None:
            parent.timer.call_after(delay, resume)
        else:
            resume()

    def stop(self, parent: Any) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        channel, self._channel = self._channel, None
        if channel is not None:
            try:
                channel.close()
            except Exception:
                logger.debug("closing the control channel failed", exc_info=True)

    def shutdown(self, parent: Any) -> None:
        self.stop(parent)
        self._info_pool.shutdown(wait=False, cancel_futures=True)

    def on_message(self, parent: Any, message: amqp.Message, queue: str) -> None:
        try:
            self.handle(parent, message, queue)
        except Exception:  # a control message must never stop the worker
            logger.exception("control message %s could not be handled",
                             message.properties.get("message_id"))
        message.channel.basic_ack(message.delivery_tag)  # a request, not a job: never kept

    def handle(self, parent: Any, message: amqp.Message, queue: str) -> None:
        """One message of OJS ``queue``'s control queue."""
        try:
            kind, body = parse_control(message)
        except ValueError as exc:
            logger.warning("ignoring control message %s: %s",
                           message.properties.get("message_id"), exc)
            return
        if kind == HEARTBEAT:
            logger.debug("heartbeat of job %s from %s", body["job_id"], body.get("worker_id"))
            return
        user = message.properties.get("user_id")
        allowed = self.authorised(parent.app, user, queue)
        if kind == CANCEL:
            if not allowed:
                self.refuse(parent.app, queue, CANCEL, self.user_reason(user),
                            f"CANCEL of job {body['job_id']}: {self.who(user, queue)}")
                return
            logger.info("cancel of job %s of queue %r requested by broker user %r",
                        body["job_id"], queue, user)
            parent.app.control.broadcast("ojs_cancel", arguments={
                "job_id": body["job_id"], "reason": body.get("reason"),
                "cancelled_by": body.get("cancelled_by") or f"user:{user}",
                "terminate": bool(body.get("terminate")), "queue": queue})
            return
        reply_to = message.properties.get("reply_to")
        problem = reply_to_problem(reply_to)
        if problem is not None:
            self.refuse(parent.app, queue, INFO, "reply_to",
                        f"INFO for job {body['job_id']} dropped: {problem}")
            return
        if not allowed:
            self.refuse(parent.app, queue, INFO, self.user_reason(user),
                        f"INFO for job {body['job_id']}: {self.who(user, queue)}; "
                        f"answered {FORBIDDEN}")
        self.answer_later(parent.app, body["job_id"], reply_to,
                          message.properties.get("correlation_id"), queue, allowed)

    def authorised(self, app: Celery, user: str | None, queue: str) -> bool:
        """Whether broker user ``user`` (``user_id``, checked by the broker) may CANCEL
        and INFO ``queue``'s jobs: this worker's own user, or one ``ojs_control_users``
        lists for the queue."""
        if not user:
            return False
        return user == self.own_user or \
            user in app.amqp.binding.settings.control_users_of(queue)

    @staticmethod
    def user_reason(user: str | None) -> str:
        return "user" if user else "no_user_id"

    @staticmethod
    def who(user: str | None, queue: str) -> str:
        if not user:
            return "refused: the request has no user_id (the sender's broker user)"
        return (f"refused: broker user {user!r} is not authorised for queue {queue!r} "
                "(ojs_control_users)")

    def refuse(self, app: Celery, queue: str, kind: str, reason: str, text: str) -> None:
        """Log a refused request (a warning the first time for each kind, reason and
        queue, so a flood of them does not flood the log) and count it."""
        key = (kind, reason, queue)
        if key in self._refusals_logged:
            logger.debug("%s", text)
        else:
            self._refusals_logged.add(key)
            logger.warning("%s (further %s refusals for this reason on queue %r are counted "
                           "in ojs.control.refused and logged at debug level)", text,
                           kind.rsplit(".", 1)[-1].upper(), queue)
        settings = app.amqp.binding.settings
        OJSMetrics(settings.meter_provider).control_refused.add(1, {
            "queue": queue, "request": kind.rsplit(".", 1)[-1], "reason": reason})

    def answer_later(self, app: Celery, job_id: str, reply_to: str,
                     correlation_id: str | None, queue: str | None = None,
                     allowed: bool = True) -> bool:
        """Queue an INFO reply; ``False`` (and a warning) when the backlog is full."""
        if not self._info_slots.acquire(blocking=False):
            logger.warning("dropping INFO request for job %s: %d INFO requests are already "
                           "waiting on this worker", job_id, INFO_BACKLOG)
            return False

        def run() -> None:
            try:
                problem = self.answer(app, job_id, reply_to, correlation_id, queue, allowed)
                if problem is not None:
                    self.refuse(app, queue or "", INFO, "reply_queue",
                                f"INFO for job {job_id} dropped: {problem}")
            except Exception:
                logger.exception("INFO reply for job %s could not be sent", job_id)
            finally:
                self._info_slots.release()

        try:
            self._info_pool.submit(run)
        except RuntimeError:  # the pool was shut down (worker stopping)
            self._info_slots.release()
            return False
        return True

    @staticmethod
    def answer(app: Celery, job_id: str, reply_to: str, correlation_id: str | None,
               queue: str | None = None, allowed: bool = True) -> str | None:
        """INFO reply, on an INFO pool thread and a producer connection of its own (it waits
        for the other workers' answers), once ``reply_to`` proved the requester's own;
        why not (and nothing sent) when it did not.  A requester not ``allowed`` is told
        ``forbidden`` and nothing of the job."""
        with app.producer_or_acquire() as producer:
            problem = reply_queue_problem(producer.connection.connection, reply_to)
        if problem is not None:
            return problem
        if not allowed:
            answer = {"job_id": job_id, "state": FORBIDDEN, "reason": (
                "the requester's broker user (user_id) is not authorised for CANCEL "
                f"and INFO on queue {queue!r} (ojs_control_users)")}
        else:
            try:
                answer = job_info(app, job_id, queue=queue)
            except Exception:  # never a Python error text in an answer
                logger.exception("INFO for job %s failed", job_id)
                answer = {"job_id": job_id, "state": "unknown", "reason": ANSWER_FAILED}
        with app.producer_or_acquire() as producer:
            producer.publish(json.dumps(answer), exchange="", routing_key=reply_to,
                             correlation_id=correlation_id, content_type="application/json",
                             content_encoding="utf-8", serializer=None, retry=True)
        return None

    def beat(self, parent: Any, interval: float) -> None:
        """BEAT (section 5.7) for every job running longer than ``interval`` seconds."""
        channel = self._channel
        if channel is None:
            return
        binding = parent.app.amqp.binding
        now = time.time()
        visible_until = datetime.now(UTC) + timedelta(seconds=2 * interval)
        for request in list(worker_state.active_requests):
            message = request.message
            started = getattr(request, "time_start", None)
            if not isinstance(message, JobMessage) or not started or now - started < interval:
                continue
            delivery = message.ojs
            beat = control_message(HEARTBEAT, {
                "job_id": delivery.job_id, "worker_id": parent.hostname,
                "attempt": delivery.attempt, "visible_until": format_time(visible_until)})
            try:
                self._publish_beat(parent, channel, beat, delivery.queue)
            except Exception:
                logger.exception("could not publish the heartbeat of job %s", delivery.job_id)
            binding.hook.job_heartbeat(delivery.info(), parent.hostname, visible_until)

    @staticmethod
    def _publish_beat(parent: Any, channel: JobChannel, beat: amqp.Message, queue: str
                      ) -> None:
        """Publish one BEAT, confirmed.

        With an event loop (prefork, threads, solo) this timer runs in the loop, which
        owns the consumer connection: the control channel waits for the confirm there.
        Without one (gevent, eventlet: ``parent.hub is None``) the timer is a greenlet
        of its own while the consumer's greenlet reads that connection; a second reader
        of its socket fails (gevent: ``ConcurrentObjectUseError``, eventlet: "Second
        simultaneous read"), so the BEAT goes out on a pooled producer connection.
        """
        names = parent.app.amqp.binding.names
        args = (beat, names.direct_exchange, names.control_queue(queue))
        options = {"job_id": beat.properties["message_id"], "queue": queue}
        if parent.hub is not None:
            channel.publish_confirmed(*args, **options)
            return
        with parent.app.producer_or_acquire() as producer:
            pooled: JobChannel = producer.channel
            pooled.publish_confirmed(*args, **options)
