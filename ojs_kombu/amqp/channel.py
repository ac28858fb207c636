"""The ``ojs`` transport's channel: py-amqp's channel hooks, handing OJS work to its rooms.

* publish: an encoded job (:meth:`Channel.publish_job`, what Celery's task
  sender :mod:`ojs_kombu.celery.task_sender` and ``ojs-kombu enqueue`` call;
  batches :meth:`Channel.publish_jobs`), or a message another producer sent
  with a Celery ``task`` header (:meth:`Channel.basic_publish`), is published
  as an OJS job with confirms (:class:`~ojs_kombu.amqp.publishing.publisher.JobPublisher`);
  other messages pass through untouched;
* consume (:meth:`Channel.basic_consume`): deliveries of ``ojs.queue.{q}`` are
  validated before kombu sees them (:class:`~ojs_kombu.amqp.consuming.receiver.JobReceiver`)
  and their outcomes carried out (:mod:`ojs_kombu.amqp.consuming.settle`);
* acks: every delivery that needs one is known
  (:class:`~ojs_kombu.amqp.wire.acks.PendingAcks`), and those made in the worker's
  event loop are written once per loop iteration (:mod:`ojs_kombu.amqp.wire.loop_acks`).

What the rest of ojs_kombu uses of it is :class:`ojs_kombu.amqp.job_channel.JobChannel`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from time import monotonic, sleep
from typing import Any

import amqp
from amqp import spec
from kombu.transport import pyamqp

from ..spec.backoff import backoff
from ..spec.encode import OutgoingJob
from ..spec.errors import QueueNameError
from ..spec.failures import JobFailure, Outcome
from .binding import Binding
from .consuming.receiver import JobReceiver
from .consuming.settle import retry_and_wait, settle
from .job_channel import JobConnection, JobDelivery
from .publishing.batch import BATCH_WINDOW, publish_batch
from .publishing.publisher import JobPublisher
from .wire.acks import PendingAcks, ack_frames
from .wire.py_amqp_seam import channel_hooks, confirms_selected, publish_unconfirmed

#: How long an exclusive queue's declaration waits for the broker to let go of the
#: same queue held by this client's previous connection (Celery's pidbox queue after
#: a reconnect): RabbitMQ 4.3 keeps the queue of a connection on a node killed with
#: ``kill -9`` locked until the cluster has cleaned up after that node.
EXCLUSIVE_LOCK_WAIT_S = 30.0

#: Celery's remote-control (``{hostname}.celery.pidbox``, ``{oid}.reply.celery.pidbox``)
#: and event (``celeryev.{id}``) queue names: queues consumed by the connection that
#: declares them (:meth:`Channel.queue_declare`).
CONNECTION_OWN_QUEUE = re.compile(r"\.pidbox$|^celeryev\.")

#: True while a command whose queue names are Celery queue names runs (``celery purge``).
_CELERY_QUEUE_NAMES: ContextVar[bool] = ContextVar("ojs_celery_queue_names", default=False)


@contextmanager
def celery_queue_names() -> Iterator[None]:
    """Within it, ``queue_purge`` on an ``ojs`` channel takes Celery queue names
    (``celery``, ``email``) to mean their job queues.  Celery's ``celery purge`` runs
    inside it (:mod:`ojs_kombu.celery.purge`): it passes the names of the app's queue
    table, or ``-Q``'s; every other caller's names are AMQP queue names."""
    token = _CELERY_QUEUE_NAMES.set(True)
    try:
        yield
    finally:
        _CELERY_QUEUE_NAMES.reset(token)


@channel_hooks
class Channel(pyamqp.Channel):
    """pyamqp channel that maps Celery task messages onto OJS jobs."""

    connection: JobConnection

    #: Bumped whenever the channel is reset: a delivery tag from an earlier
    #: generation must not be settled on it.
    generation = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ojs_publisher = JobPublisher(self)
        self.ojs_receiver = JobReceiver(self)
        self._ojs_reset()

    def _ojs_reset(self) -> None:
        self.generation += 1
        self.ojs_publisher.reset()
        self.ojs_receiver.reset()
        #: every delivery that needs an ack, and the acks the event loop collected
        self.ojs_acks = PendingAcks()

    def on_revive(self) -> None:
        """kombu revives the channel (py-amqp's ``_do_revive``, :mod:`.py_amqp_seam`)."""
        self._ojs_reset()

    @property
    def ojs(self) -> Binding:
        connection = self.connection
        if connection is None:  # closed with its connection (py-amqp's collect)
            # recoverable: kombu's ensure() reconnects and gives the producer a new channel
            raise amqp.exceptions.RecoverableConnectionError(
                "the channel was closed with its connection")
        return connection.ojs

    # -- publish (ojs_kombu.amqp.publishing.publisher) ------------------------------------

    def basic_publish(
        self,
        msg: amqp.Message,
        exchange: str = "",
        routing_key: str = "",
        mandatory: bool = False,
        immediate: bool = False,
        timeout: float | None = None,
        confirm_timeout: float | None = None,
        **kwargs: Any,
    ) -> Any:
        publisher = self.ojs_publisher
        headers = msg.properties.get("application_headers")
        if headers and "task" in headers:
            return publisher.publish_task(msg, headers, exchange, routing_key, timeout,
                                          confirm_timeout)
        if self.connection.ojs_confirm_all:
            return publisher.publish_other(msg, exchange, routing_key, mandatory, timeout,
                                           confirm_timeout)
        with publisher.ledger.lock:  # numbered and written as one step
            publisher.count_unconfirmed()
            return publish_unconfirmed(self, msg, exchange, routing_key, mandatory, immediate,
                                       timeout)

    def confirm_select(self, nowait: bool = False) -> None:
        """py-amqp's, remembered so that its own confirmed publish never selects again."""
        super().confirm_select(nowait)
        confirms_selected(self)

    def publish_job(self, job: OutgoingJob, *, timeout: float | None = None,
                    confirm_timeout: float | None = None) -> None:
        """Publish one encoded job, confirmed and ``mandatory``, and return once the
        broker took it: every ``apply_async`` and ``send_task`` (through
        :meth:`basic_publish`) and ``ojs-kombu enqueue`` end here."""
        self.ojs_publisher.publish_job(job, timeout=timeout, confirm_timeout=confirm_timeout)

    def publish_jobs(self, jobs: Sequence[OutgoingJob], *, confirm_timeout: float | None = None,
                     window: int = BATCH_WINDOW,
                     meanwhile: Callable[[], None] | None = None) -> None:
        """Batch PUSH (section 5): :func:`ojs_kombu.amqp.publishing.batch.publish_batch`."""
        publish_batch(self.ojs_publisher, self.ojs, self.connection, jobs,
                      confirm_timeout=confirm_timeout, window=window, meanwhile=meanwhile)

    def publish_confirmed(self, message: amqp.Message, exchange: str, routing_key: str, *,
                          job_id: str, queue: str, mandatory: bool = True,
                          timeout: float | None = None, confirm_timeout: float | None = None,
                          measure: bool = True, replaces: int | None = None) -> None:
        """Publish with ``mandatory=True`` and wait for the broker's confirm (AMQP-014..016)."""
        self.ojs_publisher.publish_confirmed(
            message, exchange, routing_key, job_id=job_id, queue=queue, mandatory=mandatory,
            timeout=timeout, confirm_timeout=confirm_timeout, measure=measure,
            replaces=replaces)

    def publish_many_confirmed(self, messages: list[tuple[amqp.Message, str, str]],
                               confirm_timeout: float | None = None, *,
                               mandatory: bool = False,
                               replaces: Sequence[int] | None = None) -> list[bool]:
        """Pipelined publishes and one wait for all their confirms."""
        return self.ojs_publisher.publish_many_confirmed(messages, confirm_timeout,
                                                         mandatory=mandatory, replaces=replaces)

    def queue_declare(self, queue: str = "", passive: bool = False, durable: bool = False,
                      exclusive: bool = False, auto_delete: bool = True, nowait: bool = False,
                      arguments: dict[str, Any] | None = None, *args: Any, **kwargs: Any) -> Any:
        """py-amqp's ``Queue.Declare``; an exclusive queue still held by another
        connection (405 ``RESOURCE_LOCKED``) is asked for again, with the one backoff, for
        up to :data:`EXCLUSIVE_LOCK_WAIT_S`: after a reconnect the broker may not yet
        have let go of the previous connection's queue, and Celery's worker stops on
        that error.  A queue still locked then (another worker of the same node name)
        raises as before.  py-amqp reopens the channel the broker closed.

        A named non-exclusive auto-delete queue asked for as transient (a client's own,
        as Celery 5.5 declares them) is not declared transient: RabbitMQ 4.x refuses a
        transient non-exclusive queue once ``transient_nonexcl_queues`` is denied (541,
        which closes the connection), and Celery's worker then reconnected for ever
        without starting.  Remote-control and event queues (``*.pidbox``,
        ``celeryev.*``: one connection's own) are declared exclusive, as Celery 5.6+
        declares them (``control_queue_exclusive``, ``event_queue_exclusive``), so that
        the broker deletes them with their connection, even when that connection's node
        dies; any other (the ``rpc://`` result queue) durable, as Celery 5.7 declares it,
        usable from every connection.  Auto-delete and any ``x-expires`` still apply."""
        if queue and auto_delete and not (durable or exclusive or passive):
            if CONNECTION_OWN_QUEUE.search(queue):
                exclusive = True
            else:
                durable = True
        deadline = monotonic() + EXCLUSIVE_LOCK_WAIT_S
        attempt = 0
        while True:
            try:
                return super().queue_declare(queue, passive, durable, exclusive, auto_delete,
                                             nowait, arguments, *args, **kwargs)
            except amqp.exceptions.ResourceLocked:
                attempt += 1
                remaining = deadline - monotonic()
                if not exclusive or passive or remaining <= 0:
                    raise
                sleep(min(backoff(0.25, 2.0, attempt), remaining))

    # -- consume (ojs_kombu.amqp.consuming.receiver) --------------------------------------

    def basic_qos(self, prefetch_size: int, prefetch_count: int, a_global: bool,
                  *args: Any, **kwargs: Any) -> Any:
        self.ojs_receiver.qos(prefetch_count)
        return super().basic_qos(prefetch_size, prefetch_count, a_global, *args, **kwargs)

    def basic_consume(self, queue: str = "", consumer_tag: str = "", no_local: bool = False,
                      no_ack: bool = False, exclusive: bool = False, nowait: bool = False,
                      callback: Callable[[amqp.Message], Any] | None = None,
                      *args: Any, **kwargs: Any) -> Any:
        if callback is not None:
            callback = self.ojs_receiver.consume(queue, no_ack, callback, args, kwargs)
        return super().basic_consume(queue, consumer_tag, no_local, no_ack, exclusive, nowait,
                                     callback, *args, **kwargs)

    def message_to_python(self, raw_message: amqp.Message) -> Any:
        return (self.ojs_receiver.job_message(raw_message)
                or self.Message(raw_message, channel=self))

    @property
    def ojs_prefetch_count(self) -> int:
        return self.ojs_receiver.prefetch_count

    @property
    def ojs_consumed_queues(self) -> set[str]:
        return self.ojs_receiver.consumed_queues

    def ojs_unacked(self) -> list[str]:
        """The OJS queue of each job delivery not yet settled (``ojs_kombu.events.metrics``)."""
        return self.ojs_receiver.unacked()

    # -- outcomes (sections 5.4, 5.5, 8, 9: ojs_kombu.amqp.consuming.settle) -----------------

    def settle_job(self, delivery: JobDelivery, delivery_tag: int, outcome: Outcome,
                   on_settled: Callable[[], None] | None = None) -> None:
        """Carry out a decided outcome for one delivery of this channel; never waits."""
        settle(self, delivery, delivery_tag, outcome, on_settled)

    def retry_job(self, delivery: JobDelivery, delivery_tag: int, failure: JobFailure,
                  delay_s: float, timeout: float | None = None) -> int:
        """Retry ``delivery`` and wait for the broker's confirm of the copy; returns the
        delay queue's delay in ms."""
        return retry_and_wait(self, delivery, delivery_tag, failure, delay_s, timeout)

    # -- acks (ojs_kombu.amqp.wire.loop_acks) -----------------------------------------

    def on_deliver(self, consumer_tag: str, delivery_tag: int) -> None:
        """Before py-amqp hands a ``Basic.Deliver`` to its consumer (:mod:`.py_amqp_seam`)."""
        if consumer_tag not in (self.no_ack_consumers or ()):
            self.ojs_acks.delivered(delivery_tag)
        connection = self.connection
        if connection is not None and connection.ojs_jobs_run_in_loop:
            # With the solo pool the job runs right here: the acks collected so far
            # go first, so a finished job's ack never waits for the next job.
            connection.flush_acks_in_loop()

    def basic_get(self, queue: str = "", no_ack: bool = False, argsig: str = "Bsb"
                  ) -> amqp.Message | None:
        message = super().basic_get(queue, no_ack, argsig)
        if message is not None and not no_ack:
            self.ojs_acks.delivered(message.delivery_tag)
        return message

    def basic_nack(self, delivery_tag: int, multiple: bool = False, requeue: bool = False) -> None:
        """``Basic.Nack`` (py-amqp only sends ``Basic.Reject``)."""
        connection = self.connection
        if connection is not None:
            connection.flush_acks_in_loop()  # a multiple nack must not overtake an ack
        self.send_method(spec.Basic.Nack, "Lbb", (delivery_tag, multiple, requeue))
        self.ojs_acks.settled(delivery_tag, multiple)
        queue = self.ojs_receiver.settled(delivery_tag)
        if queue is not None:
            self.ojs.hook.message_nacked(queue)

    def basic_ack(self, delivery_tag: int, multiple: bool = False, argsig: str = "Lb") -> None:
        """From the event loop's thread the ack is collected and written with the others of
        the same loop iteration (:meth:`Connection.flush_acks`); elsewhere at once."""
        connection = self.connection
        if connection is None:  # closed: py-amqp raises its connection error
            return super().basic_ack(delivery_tag, multiple, argsig)
        queue = self.ojs_receiver.settled(delivery_tag)
        if queue is not None:
            connection.ojs.hook.message_acked(queue)
        if connection.ojs_loop_acks.collect(self, delivery_tag, multiple):
            return None
        super().basic_ack(delivery_tag, multiple, argsig)
        self.ojs_acks.settled(delivery_tag, multiple)
        return None

    def basic_reject(self, delivery_tag: int, requeue: bool, argsig: str = "Lb") -> None:
        """Rejections go out as ``Basic.Nack(multiple=false)`` (AMQP-009)."""
        self.basic_nack(delivery_tag, multiple=False, requeue=requeue)

    def flush_acks(self) -> None:
        """Write the collected acks, in one write (from the event loop's thread only:
        the write does not take py-amqp's frame lock)."""
        connection = self.connection
        if self.ojs_acks and connection is not None:
            frames = self.ojs_acks.take(connection.ojs.settings.acks == "multiple")
            connection.write_frames(ack_frames(self.channel_id, frames))

    # -- the rest ------------------------------------------------------------------

    def queue_purge(self, queue: str = "", nowait: bool = False) -> Any:
        """Purge the queue named, as on ``amqp://``, whatever the shape of the call
        (``queue_purge('pq')``, ``Queue('pq').purge()``).  Only while Celery's ``celery
        purge`` runs (:func:`celery_queue_names`, wired by ``install()``) are names the
        app's Celery queue names: ``email`` is then the job queue ``ojs.queue.email``
        when it exists."""
        if _CELERY_QUEUE_NAMES.get():
            queue = self._celery_queue(queue)
        return super().queue_purge(queue, nowait)

    def _celery_queue(self, queue: str) -> str:
        """The job queue of Celery queue name ``queue`` if it exists, else ``queue``."""
        names = self.ojs.names
        with suppress(QueueNameError, amqp.exceptions.NotFound):
            ojs_queue = names.ojs_queue(queue)
            if names.job_queue(ojs_queue) != queue:
                self.connection.queue_depth(ojs_queue)  # NotFound: no such job queue
                return names.job_queue(ojs_queue)
        return queue

    def close(self, *args: Any, **kwargs: Any) -> Any:
        connection = self.connection
        if self.is_open and connection is not None and connection.transport is not None:
            if self.ojs_acks:
                self.flush_acks()
            self.flush_confirms()
            return connection.closing_within(super().close, *args, **kwargs)
        return super().close(*args, **kwargs)

    def flush_confirms(self) -> None:
        """Wait for the confirms of the jobs published without waiting on this channel
        (:mod:`ojs_kombu.amqp.publishing.deferred`); what was not accepted is logged, or given to
        ``ojs_on_publish_error``."""
        deferred = self.ojs_publisher.deferred
        if deferred.outstanding:
            deferred.flush(raise_errors=False)
