"""Carrying out a delivery's outcome without ever blocking the worker's loop.

A retry republish, a dead letter and an early job's reschedule are published
with publisher confirms, and the delivery they replace is acked only once the
broker confirmed the copy (publish, confirm, then ack: the job is never
nowhere), by :mod:`ojs_kombu.amqp.publishing.ledger`.  Waiting for that confirm inside
the delivery handler would read the next deliveries inside the wait and
handle them nested in this one; so outcomes go out on a channel of their
own, :class:`OutcomeChannel`, and the confirm is handled when the loop reads
it, like any other frame.

Everything on that channel is pipelined (``Channel.Open``, ``Confirm.Select``
and declarations with ``nowait``): nothing here waits for a reply.  A copy the
broker nacks or returns, or one caught by a channel error, is published again
after the reconnection backoff (section 11.3), re-declaring its topology; its
delivery stays unacked meanwhile, so a worker that stops or loses its
connection leaves it to the broker, which delivers it again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from time import monotonic
from typing import Any

import amqp
from amqp import spec

from ..broker.declaring import NoWait
from ..broker.reconnect import DEFAULT_POLICY
from ..publishing.ledger import ConfirmLedger, Publish, Replaced
from ..wire.drain import drain_until
from ..wire.publish_frames import PublishFrames
from ..wire.py_amqp_seam import close_hook

logger = logging.getLogger(__name__)

#: Dead-letter log lines per second before they are summed up (a storm of poison
#: jobs must not drown the log, nor spend the worker's time writing it).
DEAD_LETTER_LOG_RATE = 10
#: Longest single read while waiting at close (each read first publishes the due ones).
CLOSE_POLL_S = 0.2


#: ``(channel, names, *args)`` topology declarations of :mod:`ojs_kombu.amqp.broker.topology`.
Declare = Callable[..., None]


@dataclass(slots=True, eq=False)
class PendingOutcome:
    """A copy of a delivered job on its way to the broker, and the delivery it replaces."""

    what: str  # "retry", "dead letter", "reschedule": for logs
    job_id: str
    queue: str
    message: amqp.Message
    exchange: str
    routing_key: str
    mandatory: bool
    #: the delivery, acked by the ledger once the broker confirmed this copy
    replaces: Replaced
    #: re-declares what the copy needs, through a declaring function (nowait)
    prepare: Callable[[Callable[..., None]], None] | None = None
    tries: int = 0
    on_settled: Callable[[], None] | None = field(default=None, repr=False)


@close_hook
class OutcomeChannel(amqp.Channel):
    """A confirm-mode channel that opens without waiting and never raises its close.

    A channel error on it (a declaration the broker refuses) is reported to its
    publisher instead of being raised into the loop that read it.
    """

    def __init__(self, connection: Any, on_closed: Callable[[int, str], None]) -> None:
        super().__init__(connection)
        self._on_closed = on_closed
        self.send_method(spec.Channel.Open, "s", ("",))
        self.is_open = True  # pipelined: the broker handles it before anything sent after
        self.send_method(spec.Confirm.Select, "b", (True,))

    def on_broker_close(self, reply_code: int, reply_text: str) -> None:
        """The broker closed the channel (py-amqp's ``_on_close``, :mod:`.py_amqp_seam`)."""
        self.send_method(spec.Channel.CloseOk)
        on_closed = self._on_closed
        self.collect()
        on_closed(reply_code, reply_text)


class DeadLetterLog:
    """One error line per dead letter, at most :data:`DEAD_LETTER_LOG_RATE` a second;
    the rest are counted and summed up in the next line."""

    def __init__(self, rate: int = DEAD_LETTER_LOG_RATE,
                 clock: Callable[[], float] = monotonic) -> None:
        self._rate = rate
        self._clock = clock
        self._window = -1.0
        self._logged = 0
        self._skipped = 0

    def __call__(self, job_id: str, queue: str, code: str, message: str) -> None:
        now = self._clock()
        if now - self._window >= 1.0:
            self._new_window(now)
        if self._logged < self._rate:
            self._logged += 1
            logger.error("dead-lettering job %s from queue %r: %s: %s", job_id, queue, code,
                         message)
        else:
            self._skipped += 1

    def flush(self) -> None:
        """Sum up the lines the last second left out, once it is over (each loop tick)."""
        if self._skipped:
            now = self._clock()
            if now - self._window >= 1.0:
                self._new_window(now)

    def _new_window(self, now: float) -> None:
        if self._skipped:
            logger.error("... and %d more jobs dead-lettered in the last %.0f s",
                         self._skipped, now - self._window)
        self._window, self._logged, self._skipped = now, 0, 0


class OutcomePublisher:
    """The outcomes of one connection's deliveries, published on their own channel and
    numbered by its :class:`~ojs_kombu.amqp.publishing.ledger.ConfirmLedger`, which acks each
    delivery once the broker confirmed its copy."""

    def __init__(self, connection: Any, frame_max: Callable[[], int]) -> None:
        self._connection = connection
        self._frame_max = frame_max
        self._channel: OutcomeChannel | None = None
        self._frames: PublishFrames | None = None
        self._ledger = ConfirmLedger(connection.write_frames, connection.ojs_write_lock)
        #: (due, outcome) waiting to be published again
        self._later: list[tuple[float, PendingOutcome]] = []
        self.log_dead_letter = DeadLetterLog()

    @property
    def in_flight(self) -> int:
        """Outcomes published or waiting to be, whose deliveries are not settled yet."""
        return self._ledger.outstanding + len(self._later)

    def publish(self, outcome: PendingOutcome) -> None:
        """Send ``outcome``'s copy; its delivery is acked when the broker confirms it.

        From the event loop's thread the copy is held and written with the others of
        the same loop iteration (:meth:`flush`): a storm of dead letters costs one
        write per socket read, not one per job.  The ledger numbers it in wire order
        either way (several threads or greenlets may publish at once)."""
        self._open()
        if outcome.prepare is not None:
            outcome.prepare(self.declare_nowait)
        frames = self._frames
        assert frames is not None  # set by _open
        message = outcome.message
        properties = message.properties
        data = frames.encode(outcome.exchange, outcome.routing_key, outcome.mandatory,
                             message.body, properties)
        self._ledger.publish(
            data, job_id=outcome.job_id, queue=outcome.queue, exchange=outcome.exchange,
            routing_key=outcome.routing_key, mandatory=outcome.mandatory, body=message.body,
            properties=properties,
            hold=self._connection.ojs_loop_thread == threading.get_ident(),
            item=outcome, on_settled=self._answered, replaces=outcome.replaces)

    def flush(self) -> None:
        """Write the publishes held in this loop iteration, in one write."""
        self._ledger.flush()

    def declare_nowait(self, declare: Declare, *args: Any) -> None:
        """Run a :mod:`ojs_kombu.amqp.broker.topology` declaration on the outcome channel,
        pipelined."""
        declare(NoWait(self._open()), self._connection.ojs.names, *args)

    def run_due(self) -> None:
        """Publish again the outcomes whose backoff is over, then write what was
        collected (from the loop, each tick)."""
        self.log_dead_letter.flush()
        if self._later:
            self._publish_due()
        self.flush()

    def _publish_due(self) -> None:
        now = monotonic()
        due = [item for item in self._later if item[0] <= now]
        if not due:
            return
        self._later = [item for item in self._later if item[0] > now]
        for _, outcome in due:
            if not outcome.replaces.current:
                continue  # its channel was reset: the broker delivers the job again
            try:
                self.publish(outcome)
            except self._connection.connection_errors:
                raise
            except Exception as exc:
                self._again(outcome, f"could not publish it again: {exc}")

    def wait_in_flight(self, limit: float) -> None:
        """Before the connection closes, read confirms for outcomes in flight for up to
        ``limit`` seconds, so their deliveries are acked; those still unsettled stay
        unacked and the broker delivers them again."""
        if not self.in_flight:
            return
        try:
            self.flush()
            drain_until(self._connection, lambda: not self.in_flight, limit,
                        poll=CLOSE_POLL_S)
        except Exception as exc:
            logger.warning("stopped waiting for %d retries or dead letters at close: %r",
                           self.in_flight, exc)
        if self.in_flight:
            logger.warning("%d jobs whose retry or dead letter was not confirmed by close "
                           "stay in their queues; the broker delivers them again",
                           self.in_flight)

    def reset(self) -> None:
        """The connection is gone: nothing left to settle (the broker redelivers)."""
        self._channel = None
        self._frames = None
        self._ledger.close()
        self._later.clear()

    # -- the broker's answers ---------------------------------------------

    def _open(self) -> OutcomeChannel:
        channel = self._channel
        if channel is None or not channel.is_open:
            channel = OutcomeChannel(self._connection, self._on_channel_closed)
            ledger = self._ledger
            channel.events["basic_ack"].add(ledger.ack)
            channel.events["basic_nack"].add(ledger.nack)
            channel.events["basic_return"].add(self._on_return)
            self._channel = channel
            self._frames = PublishFrames(channel.channel_id, self._frame_max())
            ledger.start()
        return channel

    def _answered(self, entry: Publish) -> None:
        outcome: PendingOutcome = entry.item
        if entry.returned is not None:
            self._connection.forget_topology(outcome.queue)
            self._again(outcome, f"returned by the broker ({entry.returned})")
        elif entry.nacked:
            self._again(outcome, "refused by the broker (Basic.Nack)")
        elif outcome.on_settled is not None:  # confirmed: the ledger acked the delivery
            outcome.on_settled()

    def _on_return(self, exc: Exception, exchange: str, routing_key: str,
                   message: amqp.Message) -> None:
        self._ledger.returned(exchange, routing_key, message, str(exc))

    def _on_channel_closed(self, reply_code: int, reply_text: str) -> None:
        self._channel = None
        lost = self._ledger.close()  # held frames were for the closed channel
        logger.error("the broker closed the channel of retries and dead letters (%s %s); "
                     "the %d jobs on it are published again", reply_code, reply_text,
                     len(lost))
        for entry in lost:
            self._again(entry.item, f"channel closed ({reply_code} {reply_text})")

    def _again(self, outcome: PendingOutcome, why: str) -> None:
        outcome.tries += 1
        delay = DEFAULT_POLICY.delay(min(outcome.tries, 8))
        logger.warning("job %s: the %s was %s; publishing it again in %.1f s (the job stays "
                       "in its queue meanwhile)", outcome.job_id, outcome.what, why, delay)
        self._later.append((monotonic() + delay, outcome))
