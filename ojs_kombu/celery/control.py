"""The worker side of CANCEL, BEAT and INFO (AMQP binding sections 5.6 to 5.8).

Each worker consumes ``ojs.queue.control.{q}`` for every queue it consumes.
Control queues are consumed competitively, so the worker that receives a
CANCEL broadcasts it to every worker (a Celery remote-control command built
on ``revoke``); the one holding the job stops it, and no worker starts it
later.  INFO is answered from what the workers know (asked by broadcast),
then from the result backend.  While a job runs longer than
``ojs_job_heartbeat`` seconds, its worker publishes ``ojs.control.heartbeat``
and emits ``job.heartbeat``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from typing import Any

import amqp
from celery import Celery, bootsteps
from celery.backends.base import DisabledBackend
from celery.signals import worker_process_init
from celery.worker import state as worker_state
from celery.worker.control import control_command

from ..amqp.broker.control import CANCEL, HEARTBEAT, INFO, control_message, parse_control
from ..amqp.consuming.delivery import JobMessage
from ..amqp.job_channel import JobChannel, JobConnection
from ..amqp.reconnect import DEFAULT_POLICY
from ..spec.times import format_time
from .events import consumed_queues
from .scheduled import recorded_scheduled_at

logger = logging.getLogger(__name__)

#: Why INFO answers ``unknown`` for a job no worker knows, when the app has no result backend.
NO_BACKEND = ("no worker holds this job or finished it recently, and the app has no result "
              "backend (result_backend) to ask: its state is unknown")
#: Why INFO answers ``unknown`` when the result backend could not be asked.
BACKEND_FAILED = ("no worker holds this job or finished it recently, and the result backend "
                  "did not answer (the answering worker's log has the error)")
#: Why INFO answers ``unknown`` when the answering worker failed to work the state out.
ANSWER_FAILED = "the answering worker could not work out the job's state (its log has the error)"
#: Celery result states -> OJS states (what INFO answers from the result backend).
BACKEND_STATES = {"SUCCESS": "completed", "FAILURE": "discarded", "RETRY": "retryable",
                  "REVOKED": "cancelled", "STARTED": "active"}


class _Recent(OrderedDict[str, Any]):
    """A small LRU of what this worker knows about jobs it no longer holds."""

    def __init__(self, size: int = 10_000) -> None:
        super().__init__()
        self.size = size
        self._lock = threading.Lock()

    def remember(self, key: str, value: Any) -> None:
        with self._lock:
            self[key] = value
            self.move_to_end(key)
            while len(self) > self.size:
                self.popitem(last=False)


#: job id -> (reason, cancelled_by) of cancellations seen by this worker
cancellations = _Recent()
#: job id -> {"state", "attempt", "worker_id"} of jobs this worker finished
outcomes = _Recent()


@control_command(args=[("job_id", str), ("reason", str), ("cancelled_by", str),
                       ("terminate", bool)])
def ojs_cancel(state: Any, job_id: str, reason: str | None = None,
               cancelled_by: str | None = None, terminate: bool = False) -> dict[str, Any]:
    """Cancel ``job_id`` on this worker (and keep it from starting here later)."""
    from celery.worker.control import revoke

    cancellations.remember(job_id, (reason, cancelled_by))
    held = _held(job_id)
    # By its OJS id or its Celery task id: a job not here yet is kept from starting by
    # either (JobRequest.revoked), one held here is revoked by its task id.
    revoke(state, job_id, terminate=terminate, signal="SIGTERM")
    if held is not None and held[1].id != job_id:
        cancellations.remember(held[1].id, (reason, cancelled_by))
        revoke(state, held[1].id, terminate=terminate, signal="SIGTERM")
    if held is not None and held[0] == "active" and not terminate:
        pool = getattr(state.consumer, "pool", None)
        _ask_to_stop(held[1], pool)
        _end_after_grace(state, held[1].id, held[1], pool)
    if held is None:
        logger.info("cancel of job %s: not on this worker now; it will not start here", job_id)
    return {"ok": f"job {job_id} cancelled", "held": held}


@control_command(args=[("job_id", str)])
def ojs_job_info(state: Any, job_id: str) -> dict[str, Any] | None:
    """What this worker knows of ``job_id``: held now, or finished recently."""
    held = _held(job_id)
    if held is not None:
        request = held[1]
        message = request.message
        attempt = message.ojs.attempt if isinstance(message, JobMessage) else None
        answer = {"state": "active" if held[0] == "active" else "available",
                  "worker_id": state.consumer.hostname, "attempt": attempt}
        ids = job_ids_of(request)
        if len(ids) > 1:  # asked by either id: the answer names both
            answer["job_id"], answer["task_id"] = ids[1], ids[0]
        if request.id in unstoppable:
            answer["cancel"] = unstoppable[request.id]
        return answer
    return outcomes.get(job_id)


#: job id -> why a CANCEL could not stop it (its pool cannot end a running job)
unstoppable = _Recent()
#: Celery's pool modules -> the names ``celery worker -P`` takes
POOL_NAMES = {"thread": "threads"}


def can_end_running_jobs(pool: Any) -> bool:
    """Whether ``pool`` can end one running job: Celery's prefork, gevent and eventlet
    pools can (``terminate_job``), its threads and solo pools cannot."""
    from celery.concurrency.base import BasePool
    from celery.concurrency.prefork import TaskPool as PreforkPool

    return isinstance(pool, PreforkPool) or (
        pool is not None and type(pool).terminate_job is not BasePool.terminate_job)


def _end_after_grace(state: Any, job_id: str, request: Any, pool: Any) -> None:
    """The default attempt of AMQP-019: a job still running ``ojs_cancel_grace`` seconds
    after its CANCEL is ended as Celery's terminate ends it, and reported cancelled
    (``job.cancelled``, INFO, ``REVOKED``)."""
    grace = state.consumer.app.amqp.binding.settings.cancel_grace
    if grace is None:
        return
    if not can_end_running_jobs(pool):
        kind = type(pool).__module__.rsplit(".", 1)[-1]
        why = (f"requested: the {POOL_NAMES.get(kind, kind)} pool cannot end a running job; "
               "it runs to its end unless the task checks self.ojs.cancelled")
        unstoppable.remember(job_id, why)
        message = request.message
        if isinstance(message, JobMessage):
            message.ojs.info().cancel = why  # the job's later events say it too
        logger.warning("cancel of job %s: %s", job_id, why)
        return

    def end_if_still_running() -> None:
        held = _held(job_id)
        if held is not None and held[0] == "active" and held[1] is request:
            logger.warning("cancel of job %s: still running %ss after the cancel; ending it "
                           "(ojs_cancel_grace)", job_id, grace)
            from celery.worker.control import revoke

            revoke(state, job_id, terminate=True, signal="SIGTERM")

    state.consumer.timer.call_after(grace, end_if_still_running)


#: Set in a prefork pool process when its running job was cancelled (cooperatively);
#: cleared by :class:`~ojs_kombu.celery.task.OJSTask` as each job starts.
cancel_requested = threading.Event()
COOPERATIVE_SIGNAL = signal.SIGUSR2


def _ask_to_stop(request: Any, pool: Any) -> None:
    """Cooperative cancel of a job running in a prefork pool process: signal the process,
    whose handler sets :data:`cancel_requested` for ``self.ojs.cancelled`` to see.

    Only a prefork pool's ``worker_pid`` is a process: the gevent and eventlet pools
    report the ``id()`` of the job's greenlet there (``os.kill`` would fail, or hit an
    unrelated process), and their jobs see the revoke in the worker's own memory."""
    from celery.concurrency.prefork import TaskPool as PreforkPool

    pid = getattr(request, "worker_pid", None)
    if pid and pid != os.getpid() and isinstance(pool, PreforkPool):
        try:
            os.kill(pid, COOPERATIVE_SIGNAL)
        except OSError:
            logger.debug("pool process %s is gone", pid)


@worker_process_init.connect(weak=False)
def _install_cancel_handler(**_: Any) -> None:
    signal.signal(COOPERATIVE_SIGNAL, lambda *_: cancel_requested.set())


def job_ids_of(request: Any) -> tuple[str, ...]:
    """The ids a job held by this worker answers to: its Celery task id, and its OJS id
    when that differs (:func:`~ojs_kombu.spec.job_ids.job_id_for`)."""
    message = request.message
    job_id = message.ojs.job_id if isinstance(message, JobMessage) else None
    return (request.id,) if job_id in (None, request.id) else (request.id, job_id)


def _held(job_id: str) -> tuple[str, Any] | None:
    """``("active" | "reserved", request)`` of the job ``job_id`` (either id) held here."""
    for request in list(worker_state.active_requests):
        if job_id in job_ids_of(request):
            return "active", request
    for request in list(worker_state.reserved_requests):
        if job_id in job_ids_of(request):
            return "reserved", request
    return None


def job_info(app: Celery, job_id: str, timeout: float = 1.0) -> dict[str, Any]:
    """The OJS state of ``job_id``: from the workers, then the result backend (``scheduled``
    with ``scheduled_at`` for a delayed job its producer recorded; ``unknown``, with a
    reason, when there is none or it cannot be asked).  Never raises: what went
    wrong is in this worker's log, the answer says where to look."""
    try:
        replies = app.control.broadcast("ojs_job_info", arguments={"job_id": job_id},
                                        reply=True, timeout=timeout) or []
    except Exception:
        logger.exception("INFO for job %s: the other workers could not be asked", job_id)
        replies = []
    known = [answer for reply in replies if isinstance(reply, dict)
             for answer in reply.values() if isinstance(answer, dict)]
    for wanted in ("active", "available", "completed", "discarded", "cancelled", "retryable"):
        for answer in known:
            if answer.get("state") == wanted:
                return {"job_id": job_id, **answer}
    try:
        backend = app.backend
        if isinstance(backend, DisabledBackend):  # nothing else to ask: say so
            return {"job_id": job_id, "state": "unknown", "reason": NO_BACKEND}
        result = app.AsyncResult(job_id)
        try:
            state = result.state
        except NotImplementedError:  # a backend that cannot look results up
            state = "PENDING"
        scheduled_at = recorded_scheduled_at(state, result.info if state == "PENDING" else None)
        if scheduled_at is not None:  # recorded by its producer: it waits in the schedule
            return {"job_id": job_id, "state": "scheduled", "scheduled_at": scheduled_at}
    except Exception:
        logger.exception("INFO for job %s: the result backend could not be asked", job_id)
        return {"job_id": job_id, "state": "unknown", "reason": BACKEND_FAILED}
    if state in BACKEND_STATES:
        return {"job_id": job_id, "state": BACKEND_STATES[state]}
    return {"job_id": job_id, "state": "not_found"}


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

    def start(self, parent: Any) -> None:
        binding = parent.app.amqp.binding
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
            callback=lambda message, p=parent: self.on_message(p, message),
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

    def on_message(self, parent: Any, message: amqp.Message) -> None:
        try:
            self.handle(parent, message)
        except Exception:  # a control message must never stop the worker
            logger.exception("control message %s could not be handled",
                             message.properties.get("message_id"))
        message.channel.basic_ack(message.delivery_tag)

    def handle(self, parent: Any, message: amqp.Message) -> None:
        try:
            kind, body = parse_control(message)
        except ValueError as exc:
            logger.warning("ignoring control message %s: %s",
                           message.properties.get("message_id"), exc)
        else:
            if kind == CANCEL:
                parent.app.control.broadcast("ojs_cancel", arguments={
                    "job_id": body["job_id"], "reason": body.get("reason"),
                    "cancelled_by": body.get("cancelled_by"),
                    "terminate": bool(body.get("terminate"))})
            elif kind == INFO:
                reply_to = message.properties.get("reply_to")
                if reply_to:
                    self.answer_later(parent.app, body["job_id"], reply_to,
                                      message.properties.get("correlation_id"))
            elif kind == HEARTBEAT:
                logger.debug("heartbeat of job %s from %s", body["job_id"],
                             body.get("worker_id"))

    def answer_later(self, app: Celery, job_id: str, reply_to: str,
                     correlation_id: str | None) -> bool:
        """Queue an INFO reply; ``False`` (and a warning) when the backlog is full."""
        if not self._info_slots.acquire(blocking=False):
            logger.warning("dropping INFO request for job %s: %d INFO requests are already "
                           "waiting on this worker", job_id, INFO_BACKLOG)
            return False

        def run() -> None:
            try:
                self.answer(app, job_id, reply_to, correlation_id)
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
    def answer(app: Celery, job_id: str, reply_to: str, correlation_id: str | None) -> None:
        """INFO reply, on an INFO pool thread and a producer connection of its own (it waits
        for the other workers' answers)."""
        try:
            answer = job_info(app, job_id)
        except Exception:  # never a Python error text in an answer
            logger.exception("INFO for job %s failed", job_id)
            answer = {"job_id": job_id, "state": "unknown", "reason": ANSWER_FAILED}
        with app.producer_or_acquire() as producer:
            producer.publish(json.dumps(answer), exchange="", routing_key=reply_to,
                             correlation_id=correlation_id, content_type="application/json",
                             content_encoding="utf-8", serializer=None, retry=True)

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
