"""Inspect, replay and purge the dead letters of an OJS queue (``ojs.queue.dlx.{q}``).

Listing never consumes: messages are delivered to a consumer and left
unacknowledged, and closing the channel puts them back where they were.
A replay republishes the job to its queue (same id, attempt reset, error
history kept), waits for the broker's confirm, and only then acks the dead
letter: an interruption leaves the job in the DLQ, the job queue, or both
(at-least-once), never in neither.  Replaying every dead letter does the same a
window of jobs at a time (pipelined publishes, one ack for the window).
"""

from __future__ import annotations

import builtins
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import amqp
import kombu

from ...spec.dead_letter import (
    Why,
    job_id_of,
    key_of,
    read_body,
    task_id_of,
    text,
    why,
)
from ...spec.envelope import CONTENT_TYPE
from ...spec.errors import (
    DeadLetterNotFound,
    JobNackedError,
    OJSConfigurationError,
    QueueNameError,
)
from ...spec.failures import latest_death, reset_for_replay, without_failure_headers
from ...spec.naming import UNROUTABLE
from ..job_channel import JobChannel, JobConnection
from ..wire.drain import drain_until

T = TypeVar("T")

#: Dead letters a replay consumes, republishes (pipelined) and acks at a time.
REPLAY_WINDOW = 500
#: Windows the broker may deliver ahead: the next arrives while one is republished.
REPLAY_WINDOWS_AHEAD = 2
#: Longest wait for the next window of dead letters to arrive.
REPLAY_WAIT_S = 10.0


@dataclass(frozen=True)
class DeadLetter:
    """One dead letter, as found in the DLQ: whatever its body, it is read without
    raising (:mod:`ojs_kombu.spec.dead_letter`) and named by :attr:`key`."""

    #: the name the tools take: the job id, else ``sha256:`` and its body's digest
    key: str
    #: the OJS job id (``message_id``, else the envelope's ``id``), if any
    job_id: str | None
    #: the caller's Celery task id (``x_celery.id``, else the job id)
    task_id: str | None
    job_type: str | None
    queue: str
    body: bytes
    headers: dict[str, Any]
    #: the body as a JSON object, when it is one the tools can show (else ``None``)
    envelope: dict[str, Any] | None
    #: what makes it no readable OJS job message (empty for a job)
    problems: tuple[str, ...]
    content_type: str | None
    why: Why

    @property
    def error_code(self) -> str | None:
        return self.why.code

    @property
    def error_message(self) -> str | None:
        return self.why.message

    @property
    def error_type(self) -> str | None:
        return self.why.type

    @property
    def attempt(self) -> int | None:
        attempt = self.headers.get("x-ojs-attempt")
        return attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None

    @property
    def death_reason(self) -> str | None:
        """Why the broker dead-lettered it (``x-death``): ``rejected`` for a job a worker
        discarded with ``Basic.Nack`` (AMQP-009, ``ojs_dead_letter_mode="nack"``, the
        default), ``expired``, ``maxlen`` or ``delivery_limit``; ``None`` for a copy the
        worker published to the DLX with its error (``ojs_dead_letter_mode="republish"``,
        and every message that was not a valid job)."""
        death = latest_death(self.headers)
        return text(death.get("reason")) if death else None

    def names(self, ident: str) -> bool:
        """Whether ``ident`` names this dead letter: its key, job id or task id."""
        return ident in (self.key, self.job_id, self.task_id)

    @classmethod
    def from_message(cls, queue: str, message: amqp.Message) -> DeadLetter:
        body = message.body if isinstance(message.body, bytes) else str(message.body).encode()
        properties = message.properties
        headers = properties.get("application_headers")
        headers = dict(headers) if isinstance(headers, dict) else {}
        content_type = text(properties.get("content_type"))
        reading = read_body(body, content_type)
        envelope = reading.envelope
        job_id = job_id_of(properties.get("message_id"), envelope)
        job_type = text(properties.get("type")) or (envelope or {}).get("type")
        return cls(
            key=key_of(job_id, body), job_id=job_id, task_id=task_id_of(envelope, job_id),
            job_type=job_type if isinstance(job_type, str) else None, queue=queue, body=body,
            headers=headers, envelope=envelope, problems=reading.problems,
            content_type=content_type, why=why(headers, envelope))


#: Completes a dead letter's ``why`` from a record kept beside the broker.
Explain = Callable[[DeadLetter], DeadLetter]


def own_queue(message: amqp.Message) -> str | None:
    """The OJS queue a dead letter belongs to: ``x-ojs-queue``, else its envelope's
    ``queue``, else the routing key it died with."""
    headers = message.properties.get("application_headers") or {}
    queue = text(headers.get("x-ojs-queue"))
    if queue is None:
        body = message.body if isinstance(message.body, bytes) else str(message.body).encode()
        envelope = read_body(body, CONTENT_TYPE).envelope
        queue = text(envelope.get("queue")) if envelope is not None else None
    if queue is None:
        death = latest_death(headers)
        keys = death.get("routing-keys") if death else None
        queue = text(keys[0]) if isinstance(keys, list) and keys else None
    return queue


class DeadLetterQueue:
    """The DLQ of one OJS queue, on an ``ojs://`` kombu connection.

    ``queue="unroutable"`` opens ``ojs.queue.dlx.unroutable``: the dead letters of every
    queue whose own DLQ was missing; each is listed, and replayed, with its own queue.

    ``explain``, if given, completes the ``why`` of each dead letter :meth:`list` and
    :meth:`get` return, from what is kept beside the broker (the Celery wiring reads
    the app's result backend: :func:`ojs_kombu.celery.dead_letters.explained`).
    """

    def __init__(self, connection: kombu.Connection, queue: str,
                 explain: Explain | None = None) -> None:
        self._connection = connection
        self._explain = explain
        transport_connection = connection.connection  # connects if needed
        if not isinstance(transport_connection, JobConnection):
            raise OJSConfigurationError("dead-letter queues need an ojs:// connection")
        self._amqp = transport_connection
        self.names = transport_connection.ojs.names
        self.unroutable = queue == UNROUTABLE
        if self.unroutable:
            self.queue, self.dlq = UNROUTABLE, self.names.dlx_unroutable_queue
            return
        self.queue = self.names.ojs_queue(queue)
        self.dlq = self.names.dead_letter_queue(self.queue)
        transport_connection.ensure_topology(self.queue)

    def __len__(self) -> int:
        return self._with_channel(lambda ch: ch.queue_declare(self.dlq, passive=True)
                                  .message_count)

    def list(self, limit: int | None = None, *, bodies: bool = True) -> list[DeadLetter]:
        """Up to ``limit`` dead letters, oldest first; none is removed.  ``bodies=False``
        keeps what they say (ids, why, problems, headers) without their bodies and
        envelopes, so that listing huge dead letters takes no more memory than one."""
        def browse(channel: JobChannel) -> list[DeadLetter]:
            found = []
            for message in self._browse(channel):
                dead = self._explained(self._dead_letter(message))
                found.append(dead if bodies else replace(dead, body=b"", envelope=None))
                if limit is not None and len(found) >= limit:
                    break
            return found
        return self._with_channel(browse)

    def get(self, ident: str) -> DeadLetter:
        """The dead letter ``ident`` names (its key, job id or Celery task id); raises
        :class:`DeadLetterNotFound`."""
        return self._explained(self._with_channel(lambda channel: self._find(channel, ident)[1]))

    def replay(self, ident: str) -> str:
        """Put the dead letter ``ident`` names back on its queue and return its key;
        raises :class:`DeadLetterNotFound`."""
        def replay_one(channel: JobChannel) -> str:
            message, _ = self._find(channel, ident)
            return self._replay(channel, message)
        return self._with_channel(replay_one)

    def replay_all(self, progress: Callable[[str], None] | None = None) -> builtins.list[str]:
        """Replay every dead letter present when called; returns the job ids, in order
        (:meth:`replay_each` keeps none)."""
        replayed: builtins.list[str] = []

        def step(job_id: str) -> None:
            replayed.append(job_id)
            if progress is not None:
                progress(job_id)

        self.replay_each(step)
        return replayed

    def replay_each(self, progress: Callable[[str], None],
                    stop: Callable[[], bool] | None = None) -> int:
        """Replay every dead letter present when called, calling ``progress`` with each
        job id; returns how many were replayed.

        Streams: :data:`REPLAY_WINDOW` dead letters at a time are consumed,
        republished pipelined (mandatory, confirmed), while
        the broker already delivers the next window (a prefetch of two), so memory
        does not grow with the queue and the rate is a batch's, not one round trip
        per job.  ``progress`` is called once a job's window is
        replayed; ``stop()`` true ends the replay between windows.  Each dead letter
        is acked by the channel's confirm ledger once the broker confirmed its copy:
        a job the broker refuses or returns keeps its dead letter and stops the
        replay after its window (:class:`JobNackedError`)."""
        def replay_every(channel: JobChannel) -> int:
            present = channel.queue_declare(self.dlq, passive=True).message_count
            done = 0
            if not present:
                return done
            if not self.unroutable:
                self._amqp.ensure_topology(self.queue)
            channel.basic_qos(0, min(REPLAY_WINDOWS_AHEAD * REPLAY_WINDOW, present), False)
            arrived: builtins.list[amqp.Message] = []

            def arrived_at_least(count: int) -> Callable[[], bool]:
                return lambda: len(arrived) >= count
            consumer = channel.basic_consume(self.dlq, no_ack=False, callback=arrived.append)
            try:
                while done < present and not (stop is not None and stop()):
                    want = min(REPLAY_WINDOW, present - done)
                    drain_until(self._amqp, arrived_at_least(want), REPLAY_WAIT_S)
                    if not arrived:
                        break  # the rest was taken by someone else meanwhile
                    batch, arrived[:] = arrived[:want], arrived[want:]
                    for job_id in self._replay_batch(channel, batch):
                        done += 1
                        progress(job_id)
            finally:
                if channel.is_open:
                    channel.basic_cancel(consumer)
            return done
        return self._with_channel(replay_every)

    def _replay_batch(self, channel: JobChannel, batch: builtins.list[amqp.Message]
                      ) -> builtins.list[str]:
        """Republish ``batch`` pipelined; the confirm ledger acks each dead letter once
        the broker confirmed its copy, so a refused one stays and none is doubled."""
        messages, job_ids = [], []
        for message in batch:
            job_id, queue, replayed = self._replayed_copy(message)
            if queue != self.queue:  # a dead letter of ``unroutable`` goes to its own queue
                self._amqp.ensure_topology(queue)
            job_ids.append(job_id)
            messages.append((replayed, self.names.direct_exchange, queue))
        accepted = channel.publish_many_confirmed(
            messages, mandatory=True, replaces=[message.delivery_tag for message in batch])
        refused = [job_id for job_id, ok in zip(job_ids, accepted, strict=True) if not ok]
        if refused:
            self._amqp.forget_topology(self.queue)
            raise JobNackedError(
                f"the broker refused or returned job {refused[0]} replayed to "
                f"{self.names.job_queue(self.queue)!r}; it stays in {self.dlq!r} with the "
                f"{len(refused) - 1} other(s) of this batch it refused "
                f"({len(batch) - len(refused)} of this batch were replayed)",
                job_id=refused[0], queue=self.queue)
        return job_ids

    def delete(self, ident: str) -> DeadLetter:
        """Remove the dead letter ``ident`` names for good and return it; raises
        :class:`DeadLetterNotFound`.  The others stay where they were."""
        def delete_one(channel: JobChannel) -> DeadLetter:
            message, dead = self._find(channel, ident)
            channel.basic_ack(message.delivery_tag)
            return dead
        return self._with_channel(delete_one)

    def _find(self, channel: JobChannel, ident: str) -> tuple[amqp.Message, DeadLetter]:
        """The first dead letter ``ident`` names, left unacknowledged on ``channel``."""
        for message in self._browse(channel):
            dead = self._dead_letter(message)
            if dead.names(ident):
                return message, dead
        raise DeadLetterNotFound(f"no dead letter with key, job id or task id {ident!r} in "
                                 f"{self.dlq!r}")

    def purge(self) -> int:
        """Delete every dead letter; returns how many there were."""
        return self._with_channel(lambda channel: channel.queue_purge(self.dlq) or 0)

    def _explained(self, dead: DeadLetter) -> DeadLetter:
        return dead if self._explain is None else self._explain(dead)

    def _dead_letter(self, message: amqp.Message) -> DeadLetter:
        if not self.unroutable:
            return DeadLetter.from_message(self.queue, message)
        named = own_queue(message) or ""
        try:
            return DeadLetter.from_message(self.names.ojs_queue(named), message)
        except QueueNameError as exc:  # listed with why; a replay raises it
            dead = DeadLetter.from_message(named, message)
            return replace(dead, problems=(*dead.problems, f"its own queue: {exc}"))

    def _replay(self, channel: JobChannel, message: amqp.Message) -> str:
        job_id, queue, replayed = self._replayed_copy(message)
        self._amqp.ensure_topology(queue)
        channel.publish_confirmed(replayed, self.names.direct_exchange, queue,
                                  job_id=job_id, queue=queue, replaces=message.delivery_tag)
        return job_id

    def _replayed_copy(self, message: amqp.Message) -> tuple[str, str, amqp.Message]:
        """The dead letter's key, its OJS queue (each its own for ``unroutable``), and
        the message that puts the job back on that queue."""
        dead = self._dead_letter(message)
        if self.unroutable:
            self.names.ojs_queue(dead.queue)  # QueueNameError: nowhere to put it back
        if dead.envelope is not None and not dead.problems:
            body, headers = reset_for_replay(dead.envelope, dead.headers)
        else:  # not an OJS job (dead-lettered as malformed): replay it as it came
            body, headers = dead.body, without_failure_headers(dead.headers)
        properties = dict(message.properties)
        properties["application_headers"] = headers
        return dead.key, dead.queue, amqp.Message(body, **properties)

    def _browse(self, channel: JobChannel) -> Iterator[amqp.Message]:
        """Every message present now, unacknowledged (closing the channel requeues them).

        Streamed a window at a time: a consumer with a prefetch of one window takes it
        (pipelined, not one ``Basic.Get`` round trip each) and is cancelled; the window
        stays unacknowledged on the channel, so the next consumer gets the next one.
        (A channel-wide prefetch raised as it goes would need no new consumer, but
        quorum queues refuse consumers on such channels.)"""
        present = channel.queue_declare(self.dlq, passive=True).message_count
        arrived: deque[amqp.Message] = deque()
        seen = 0
        while seen < present:
            window = min(REPLAY_WINDOW, present - seen)
            channel.basic_qos(0, window, False)
            consumer = channel.basic_consume(self.dlq, no_ack=False, callback=arrived.append)
            try:
                for _ in range(window):
                    if not arrived and not drain_until(self._amqp, lambda: bool(arrived),
                                                       REPLAY_WAIT_S):
                        return  # the rest was taken by someone else meanwhile
                    seen += 1
                    yield arrived.popleft()
            finally:
                if channel.is_open:
                    channel.basic_cancel(consumer)

    def _with_channel(self, work: Callable[[JobChannel], T]) -> T:
        channel = self._amqp.channel()
        try:
            return work(channel)
        finally:
            if channel.is_open:
                channel.close()

    def close(self) -> None:
        self._connection.release()


@contextmanager
def open_dead_letter_queue(connection: kombu.Connection, queue: str,
                           explain: Explain | None = None) -> Iterator[DeadLetterQueue]:
    dlq = DeadLetterQueue(connection, queue, explain)
    try:
        yield dlq
    finally:
        dlq.close()
