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
import json
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import amqp
import kombu

from ...spec.errors import DeadLetterNotFound, JobNackedError, OJSConfigurationError
from ...spec.failures import reset_for_replay, without_failure_headers
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
    """One dead-lettered job, as found in the DLQ."""

    job_id: str
    job_type: str | None
    queue: str
    body: bytes
    headers: dict[str, Any]
    envelope: dict[str, Any] | None

    @property
    def error_code(self) -> str | None:
        return self.headers.get("x-ojs-error-code")

    @property
    def error_message(self) -> str | None:
        return self.headers.get("x-ojs-error-message")

    @property
    def attempt(self) -> int | None:
        return self.headers.get("x-ojs-attempt")

    @property
    def death_reason(self) -> str | None:
        """Why the broker dead-lettered it (``x-death``): ``rejected`` for a job the worker
        discarded with ``Basic.Nack`` (AMQP-009, the default), ``expired``, ``maxlen`` or
        ``delivery_limit``; ``None`` for a copy the worker republished with its error
        (``ojs_dead_letter_mode="republish"``, and every message that was not a valid job).

        A nacked job keeps the message as it was delivered: its ``x-ojs-error-*`` headers
        and its envelope's ``errors`` are those of the earlier attempts; the last
        attempt's error is in the ``job.discarded`` event and the result backend.
        """
        deaths = self.headers.get("x-death")
        if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict):
            reason = deaths[0].get("reason")
            return str(reason) if reason is not None else None
        return None

    @classmethod
    def from_message(cls, queue: str, message: amqp.Message) -> DeadLetter:
        body = message.body if isinstance(message.body, bytes) else str(message.body).encode()
        try:
            envelope = json.loads(body)
        except ValueError:
            envelope = None
        if not isinstance(envelope, dict):
            envelope = None
        properties = message.properties
        return cls(
            job_id=str(properties.get("message_id") or (envelope or {}).get("id") or ""),
            job_type=properties.get("type") or (envelope or {}).get("type"),
            queue=queue,
            body=body,
            headers=dict(properties.get("application_headers") or {}),
            envelope=envelope,
        )


def own_queue(message: amqp.Message) -> str | None:
    """The OJS queue a dead letter belongs to: ``x-ojs-queue``, else its envelope's
    ``queue``, else the routing key it died with."""
    headers = message.properties.get("application_headers") or {}
    queue = headers.get("x-ojs-queue")
    if not isinstance(queue, str):
        try:
            envelope = json.loads(message.body)
        except ValueError:
            envelope = None
        queue = envelope.get("queue") if isinstance(envelope, dict) else None
    if not isinstance(queue, str):
        deaths = headers.get("x-death")
        keys = deaths[0].get("routing-keys") if isinstance(deaths, list) and deaths \
            and isinstance(deaths[0], dict) else None
        queue = keys[0] if isinstance(keys, list) and keys else None
    return queue.decode() if isinstance(queue, bytes) else queue


class DeadLetterQueue:
    """The DLQ of one OJS queue, on an ``ojs://`` kombu connection.

    ``queue="unroutable"`` opens ``ojs.queue.dlx.unroutable``: the dead letters of every
    queue whose own DLQ was missing; each is listed, and replayed, with its own queue.
    """

    def __init__(self, connection: kombu.Connection, queue: str) -> None:
        self._connection = connection
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

    def list(self, limit: int | None = None) -> list[DeadLetter]:
        """Up to ``limit`` dead letters, oldest first; none is removed."""
        def browse(channel: JobChannel) -> list[DeadLetter]:
            found = []
            for message in self._browse(channel):
                found.append(self._dead_letter(message))
                if limit is not None and len(found) >= limit:
                    break
            return found
        return self._with_channel(browse)

    def get(self, job_id: str) -> DeadLetter:
        """The dead letter of ``job_id``; raises :class:`DeadLetterNotFound`."""
        def find(channel: JobChannel) -> DeadLetter:
            for message in self._browse(channel):
                if message.properties.get("message_id") == job_id:
                    return self._dead_letter(message)
            raise DeadLetterNotFound(f"no dead letter with job id {job_id} in {self.dlq!r}")
        return self._with_channel(find)

    def replay(self, job_id: str) -> None:
        """Put ``job_id`` back on its queue; raises :class:`DeadLetterNotFound`."""
        def replay_one(channel: JobChannel) -> None:
            for message in self._browse(channel):
                if message.properties.get("message_id") == job_id:
                    self._replay(channel, message)
                    return
            raise DeadLetterNotFound(f"no dead letter with job id {job_id} in {self.dlq!r}")
        self._with_channel(replay_one)

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

    def delete(self, job_id: str) -> DeadLetter:
        """Remove the dead letter of ``job_id`` for good and return it; raises
        :class:`DeadLetterNotFound`.  The others stay where they were."""
        def delete_one(channel: JobChannel) -> DeadLetter:
            for message in self._browse(channel):
                if message.properties.get("message_id") == job_id:
                    channel.basic_ack(message.delivery_tag)
                    return self._dead_letter(message)
            raise DeadLetterNotFound(f"no dead letter with job id {job_id} in {self.dlq!r}")
        return self._with_channel(delete_one)

    def purge(self) -> int:
        """Delete every dead letter; returns how many there were."""
        return self._with_channel(lambda channel: channel.queue_purge(self.dlq) or 0)

    def _dead_letter(self, message: amqp.Message) -> DeadLetter:
        queue = self.queue
        if self.unroutable:
            queue = self.names.ojs_queue(own_queue(message) or "")
        return DeadLetter.from_message(queue, message)

    def _replay(self, channel: JobChannel, message: amqp.Message) -> str:
        job_id, queue, replayed = self._replayed_copy(message)
        self._amqp.ensure_topology(queue)
        channel.publish_confirmed(replayed, self.names.direct_exchange, queue,
                                  job_id=job_id, queue=queue, replaces=message.delivery_tag)
        return job_id

    def _replayed_copy(self, message: amqp.Message) -> tuple[str, str, amqp.Message]:
        """The job id, its OJS queue (each its own for ``unroutable``), and the message
        that puts the job back on that queue."""
        dead = self._dead_letter(message)
        if dead.envelope is not None:
            body, headers = reset_for_replay(dead.envelope, dead.headers)
        else:  # not an OJS job (dead-lettered as malformed): replay it as it came
            body, headers = dead.body, without_failure_headers(dead.headers)
        properties = dict(message.properties)
        properties["application_headers"] = headers
        return dead.job_id, dead.queue, amqp.Message(body, **properties)

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
def open_dead_letter_queue(connection: kombu.Connection, queue: str) -> Iterator[DeadLetterQueue]:
    dlq = DeadLetterQueue(connection, queue)
    try:
        yield dlq
    finally:
        dlq.close()
