"""The worker side of CANCEL, BEAT and INFO (AMQP binding sections 5.6 to 5.8).

Each worker consumes ``ojs.queue.control.{q}`` for every queue it consumes
(:mod:`ojs_kombu.celery.control_queues`).
Control queues are consumed competitively, so the worker that receives a
CANCEL broadcasts it to every worker (a Celery remote-control command built
on ``revoke``); the one holding the job stops it, and no worker starts it
later.  INFO is answered from what the workers know (asked by broadcast),
then from the result backend.  While a job runs longer than
``ojs_job_heartbeat`` seconds, its worker publishes ``ojs.control.heartbeat``
and emits ``job.heartbeat``.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections import OrderedDict
from typing import Any, NamedTuple

from celery import Celery
from celery.backends.base import DisabledBackend
from celery.signals import worker_process_init
from celery.worker import state as worker_state
from celery.worker.control import control_command

from ..amqp.consuming.delivery import JobMessage
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
            if key in self:  # a new key goes to the end anyway
                self.move_to_end(key)
            self[key] = value
            while len(self) > self.size:
                self.popitem(last=False)


class JobRecord(NamedTuple):
    """What INFO answers of a job this worker holds or finished; a tuple, not the answer's
    dict, because :data:`outcomes` holds 10,000 of them (3.5 MiB as dicts, 2.7 as these)."""

    state: str
    attempt: int | None
    worker_id: str
    cancel: Any = None
    job_id: str | None = None
    task_id: str | None = None
    queue: str | None = None  # the job's OJS queue: INFO answers only asks through it

    @classmethod
    def of(cls, state: str, attempt: int | None, worker_id: str, ids: tuple[str, ...],
           queue: str | None = None) -> JobRecord:
        """The record of the job of ``ids`` (:func:`job_ids_of`) of OJS ``queue``: with a
        CANCEL its pool could not carry out, and with both ids when its OJS id differs
        from its task id (INFO is asked by either)."""
        job_id, task_id = (ids[1], ids[0]) if len(ids) > 1 else (None, None)
        return cls(state, attempt, worker_id, unstoppable.get(ids[0]), job_id, task_id, queue)

    def answer(self) -> dict[str, Any]:
        answer: dict[str, Any] = {"state": self.state, "attempt": self.attempt,
                                  "worker_id": self.worker_id}
        if self.cancel is not None:  # a CANCEL its pool could not carry out
            answer["cancel"] = self.cancel
        if self.job_id is not None:  # asked by either id: the answer names both
            answer["job_id"], answer["task_id"] = self.job_id, self.task_id
        return answer


#: job id -> (reason, cancelled_by, queue) of cancellations seen by this worker; a
#: ``queue`` (a CANCEL from a control queue) cancels only a job of that OJS queue
cancellations = _Recent()
#: job id -> :class:`JobRecord` of jobs this worker finished (bounded: an idle
#: worker's memory grows by this record's ~2.7 MiB over its first 10,000 jobs, then stays)
outcomes = _Recent()


def queue_of(request: Any) -> str | None:
    """The OJS queue of a job held by this worker (``None``: not an OJS job)."""
    message = request.message
    return message.ojs.queue if isinstance(message, JobMessage) else None


@control_command(args=[("job_id", str), ("reason", str), ("cancelled_by", str),
                       ("terminate", bool), ("queue", str)])
def ojs_cancel(state: Any, job_id: str, reason: str | None = None,
               cancelled_by: str | None = None, terminate: bool = False,
               queue: str | None = None) -> dict[str, Any]:
    """Cancel ``job_id`` on this worker (and keep it from starting here later); with
    ``queue`` (a CANCEL that came through that queue's control queue) only a job of
    that OJS queue: a job held here is checked now, one not here yet when it arrives
    (:meth:`~ojs_kombu.celery.request.JobRequest.revoked`)."""
    from celery.worker.control import revoke

    held = _held(job_id)
    if queue is not None and held is not None and queue_of(held[1]) != queue:
        logger.warning("cancel of job %s refused: it is not a job of queue %r", job_id, queue)
        return {"refused": f"job {job_id} is not a job of queue {queue!r}"}
    cancellations.remember(job_id, (reason, cancelled_by, queue))
    if held is None and queue is not None:
        logger.info("cancel of job %s: not on this worker now; it will not start here",
                    job_id)
        return {"ok": f"job {job_id} cancelled", "held": None}
    # By its OJS id or its Celery task id: a job not here yet is kept from starting by
    # either (JobRequest.revoked), one held here is revoked by its task id.
    revoke(state, job_id, terminate=terminate, signal="SIGTERM")
    if held is not None and held[1].id != job_id:
        cancellations.remember(held[1].id, (reason, cancelled_by, queue))
        revoke(state, held[1].id, terminate=terminate, signal="SIGTERM")
    if held is not None and held[0] == "active" and not terminate:
        pool = getattr(state.consumer, "pool", None)
        _ask_to_stop(held[1], pool)
        _end_after_grace(state, held[1].id, held[1], pool)
    if held is None:
        logger.info("cancel of job %s: not on this worker now; it will not start here", job_id)
    return {"ok": f"job {job_id} cancelled", "held": held}


@control_command(args=[("job_id", str), ("queue", str)])
def ojs_job_info(state: Any, job_id: str, queue: str | None = None) -> dict[str, Any] | None:
    """What this worker knows of ``job_id``: held now, or finished recently; with
    ``queue``, only as a job of that OJS queue (an INFO asked through its control
    queue learns nothing of another queue's jobs)."""
    held = _held(job_id)
    if held is not None and queue in (None, queue_of(held[1])):
        request = held[1]
        message = request.message
        attempt = message.ojs.attempt if isinstance(message, JobMessage) else None
        return JobRecord.of("active" if held[0] == "active" else "available", attempt,
                            state.consumer.hostname, job_ids_of(request)).answer()
    finished = outcomes.get(job_id)
    if finished is None or queue not in (None, finished.queue):
        return None
    return finished.answer()


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


def job_info(app: Celery, job_id: str, timeout: float = 1.0, queue: str | None = None
             ) -> dict[str, Any]:
    """The OJS state of ``job_id``: from the workers, then the result backend (``scheduled``
    with ``scheduled_at`` for a delayed job its producer recorded; ``unknown``, with a
    reason, when there is none or it cannot be asked).  With ``queue``, a job the workers
    know of another OJS queue, or that the result backend records in another queue
    (``result_extended``), is ``not_found``.  Never raises: what went wrong is in this
    worker's log, the answer says where to look."""
    arguments = {"job_id": job_id} if queue is None else {"job_id": job_id, "queue": queue}
    try:
        replies = app.control.broadcast("ojs_job_info", arguments=arguments,
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
        if queue is not None and not _recorded_in(app, result, queue):
            return {"job_id": job_id, "state": "not_found"}
        scheduled_at = recorded_scheduled_at(state, result.info if state == "PENDING" else None)
        if scheduled_at is not None:  # recorded by its producer: it waits in the schedule
            return {"job_id": job_id, "state": "scheduled", "scheduled_at": scheduled_at}
    except Exception:
        logger.exception("INFO for job %s: the result backend could not be asked", job_id)
        return {"job_id": job_id, "state": "unknown", "reason": BACKEND_FAILED}
    if state in BACKEND_STATES:
        return {"job_id": job_id, "state": BACKEND_STATES[state]}
    return {"job_id": job_id, "state": "not_found"}


def _recorded_in(app: Celery, result: Any, queue: str) -> bool:
    """Whether the result backend's record of ``result`` may be of a job of OJS
    ``queue``: it names no queue (``result_extended`` off) or names this one."""
    try:
        recorded = result.queue
    except (AttributeError, NotImplementedError):
        return True
    if not recorded:
        return True
    return bool(app.amqp.binding.names.ojs_queue(str(recorded)) == queue)
