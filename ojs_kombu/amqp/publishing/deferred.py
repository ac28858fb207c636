"""Confirmed publishes without the wait: ``ojs_publish_confirms = "deferred"`` (AMQP-014).

Every job is still published in confirm mode and every confirm is still read;
only the caller no longer waits for it.  The publish returns once the job is
written, and its confirm is read when it has arrived: by the channel's next
publishes (every :data:`COLLECT_EVERY` publishes, one read that does not wait
takes every confirm that arrived meanwhile), when the window is full (at most
``ojs_unconfirmed_window`` jobs a channel has written and not seen confirmed),
and by :meth:`DeferredConfirms.flush` (``ojs_kombu.flush_confirms()``, the
channel's and the connection's close, a worker's shutdown, the process's exit).

A job the broker refuses (``Basic.Nack``: a full ``reject-publish`` queue) is
written again with backoff until ``ojs_confirm_timeout`` seconds after its
first publish.  A job the broker returns (unroutable), one still refused after
that time, and one whose channel closed before its confirm (it may or may not
be enqueued) is reported: to ``ojs_on_publish_error`` when the app gives one,
else raised, all of them in one :class:`DeferredPublishError`, by the
channel's next publish or flush.  A process that dies with jobs in the window
can lose them: the window bounds how many.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from time import monotonic
from typing import Any, Protocol

import amqp

from ...spec.errors import (
    DeferredPublishError,
    JobNackedError,
    JobPublishError,
    PublishConfirmTimeout,
    UnroutableJobError,
)
from ...spec.settings import OJSSettings
from .ledger import Publish

logger = logging.getLogger(__name__)

#: First wait before a refused job is written again; doubled each time up to the max.
RESEND_FIRST_S = 0.05
RESEND_MAX_S = 2.0
#: Longest single read while a flush waits (re-sends become due meanwhile).
FLUSH_POLL_S = 0.05
#: Publishes between two reads of the confirms that arrived meanwhile: one read (one
#: system call) takes them all, where a read per publish costs one each.
COLLECT_EVERY = 32
#: Jobs a :class:`DeferredPublishError`'s message names (``errors`` holds them all).
SHOWN_ERRORS = 5

_LIVE: weakref.WeakSet[DeferredConfirms] = weakref.WeakSet()
_exit_hook = threading.Lock()
_exit_registered = False


class DeferringPublisher(Protocol):
    """What :class:`DeferredConfirms` uses of its channel's
    :class:`~ojs_kombu.amqp.publishing.publisher.JobPublisher`."""

    @property
    def settings(self) -> OJSSettings: ...

    def confirm_mode(self) -> None: ...

    def send(self, message: amqp.Message, exchange: str, routing_key: str, mandatory: bool,
             timeout: float | None, *, job_id: str, queue: str, hold: bool = False,
             item: Any = None, on_settled: Callable[[Publish], None] | None = None
             ) -> Publish:
        """Publish through the channel's
        :class:`~ojs_kombu.amqp.publishing.ledger.ConfirmLedger`."""

    def read_arrived(self, timeout: float) -> None:
        """Read and handle one incoming method; :class:`TimeoutError` when none came in
        ``timeout`` seconds (``0``: none has arrived)."""

    def forget_topology(self, queue: str) -> None: ...


@dataclass(slots=True, eq=False)
class Unconfirmed:
    """A job written and not yet confirmed, kept to be written again or reported."""

    job_id: str
    queue: str
    message: amqp.Message
    exchange: str
    routing_key: str
    mandatory: bool
    first_sent: float
    tries: int = 0


class DeferredConfirms:
    """The jobs one channel published without waiting, until the broker confirmed them."""

    def __init__(self, publisher: DeferringPublisher) -> None:
        self._publisher = publisher
        self._sent: dict[Publish, Unconfirmed] = {}
        self._settled: list[Publish] = []
        self._later: list[tuple[float, Unconfirmed]] = []
        self._failed: list[JobPublishError] = []
        self._writes = 0
        #: the thread that published last (a channel is used by one thread at a time)
        self.thread: int | None = None

    @property
    def outstanding(self) -> int:
        """Jobs written or waiting to be written again, not yet confirmed."""
        return len(self._sent) + len(self._later)

    def publish(self, message: amqp.Message, exchange: str, routing_key: str, *,
                job_id: str, queue: str, mandatory: bool, timeout: float | None) -> None:
        """Write the job and return; read the confirms that have arrived meanwhile, and
        wait for some only when the window is full.  Raises what earlier jobs left to
        report first (:class:`DeferredPublishError`; this job is then not sent)."""
        self.raise_reported()
        self.thread = threading.get_ident()
        self._write(Unconfirmed(job_id, queue, message, exchange, routing_key, mandatory,
                                monotonic()), timeout)
        _register(self)
        self._writes += 1
        if self._later or self._writes % COLLECT_EVERY == 0:
            self.collect()
        settings = self._publisher.settings
        window = settings.unconfirmed_window
        if self.outstanding > window and not self._read_until(
                lambda: self.outstanding <= window, settings.confirm_timeout):
            raise PublishConfirmTimeout(
                f"job {job_id} (queue {queue!r}) was written, but {self.outstanding} jobs "
                f"of this channel have had no confirm within {settings.confirm_timeout}s "
                f"(ojs_unconfirmed_window={window}): the broker stopped confirming",
                job_id=job_id, queue=queue)

    def collect(self) -> None:
        """Handle the confirms that have arrived, without waiting for any."""
        read = self._publisher.read_arrived
        for _ in range(len(self._sent) + 8):  # bounded: at most a read per publish
            try:
                read(0)
            except TimeoutError:
                break
        self._settle()

    def flush(self, limit: float | None = None, *, raise_errors: bool = True) -> None:
        """Wait until every job written was confirmed (re-sending refused ones), at
        most ``limit`` seconds (default ``ojs_confirm_timeout``); those left are
        reported unconfirmed.  Then raise what is left to report (``raise_errors``)
        or log it."""
        if self._sent or self._later:
            limit = self._publisher.settings.confirm_timeout if limit is None else limit
            try:
                done = self._read_until(lambda: not self.outstanding, limit)
            except Exception as exc:  # the connection is gone: nothing more to read
                logger.warning("stopped waiting for %d publisher confirms: %r",
                               self.outstanding, exc)
                done = False
            if not done:
                self._unconfirmed(f"no confirm within {limit}s", give_up_later=True)
        if raise_errors:
            self.raise_reported()
        elif self._failed:
            failed, self._failed = self._failed, []
            logger.error("%s", _combined(failed))

    def channel_lost(self) -> None:
        """The channel was reset: jobs written on it are unknown to the new one.  Jobs
        waiting to be written again are written on the new channel."""
        self._settled.clear()
        self._unconfirmed("its channel closed before the broker confirmed it",
                          give_up_later=False)

    def raise_reported(self) -> None:
        if self._failed:
            failed, self._failed = self._failed, []
            raise _combined(failed)

    # -- inside ------------------------------------------------------------------

    def _write(self, item: Unconfirmed, timeout: float | None) -> None:
        publisher = self._publisher
        publisher.confirm_mode()
        pending = publisher.send(item.message, item.exchange, item.routing_key,
                                 item.mandatory, timeout, job_id=item.job_id,
                                 queue=item.queue, on_settled=self._on_settled)
        self._sent[pending] = item

    def _on_settled(self, pending: Publish) -> None:
        self._settled.append(pending)

    def _read_until(self, done: Callable[[], bool], limit: float) -> bool:
        deadline = monotonic() + limit
        read = self._publisher.read_arrived
        while True:
            self._settle()
            if done():
                return True
            remaining = deadline - monotonic()
            if remaining <= 0:
                return False
            with suppress(TimeoutError):
                read(min(FLUSH_POLL_S, remaining))

    def _settle(self) -> None:
        if self._settled:
            settled, self._settled = self._settled, []
            now = monotonic()
            limit = self._publisher.settings.confirm_timeout
            for pending in settled:
                item = self._sent.pop(pending, None)
                if item is None:
                    continue
                if pending.returned is not None:
                    self._publisher.forget_topology(item.queue)  # re-declared next time
                    self._report(UnroutableJobError(
                        f"job {item.job_id} for queue {item.queue!r} was returned by the "
                        f"broker ({pending.returned}): no queue is bound to "
                        f"{item.exchange!r} with routing key {item.routing_key!r}; it was "
                        "not enqueued", job_id=item.job_id, queue=item.queue))
                elif pending.nacked:
                    if now - item.first_sent >= limit:
                        self._report(JobNackedError(
                            f"job {item.job_id} for queue {item.queue!r} was refused by the "
                            f"broker (Basic.Nack) for {limit}s, {item.tries + 1} times; it "
                            "was not enqueued", job_id=item.job_id, queue=item.queue))
                    else:
                        item.tries += 1
                        delay = min(RESEND_FIRST_S * 2 ** (item.tries - 1), RESEND_MAX_S)
                        self._later.append((now + delay, item))
        if self._later:
            self._write_due()

    def _write_due(self) -> None:
        now = monotonic()
        due = [item for when, item in self._later if when <= now]
        if due:
            self._later = [(when, item) for when, item in self._later if when > now]
            for index, item in enumerate(due):
                try:
                    self._write(item, None)
                except BaseException:
                    self._later += [(now, rest) for rest in due[index:]]
                    raise

    def _unconfirmed(self, why: str, *, give_up_later: bool) -> None:
        lost, self._sent = list(self._sent.values()), {}
        for item in lost:
            self._report(PublishConfirmTimeout(
                f"job {item.job_id} (queue {item.queue!r}): {why}; it may or may not be "
                "enqueued", job_id=item.job_id, queue=item.queue))
        if give_up_later:
            later, self._later = self._later, []
            for _, item in later:  # the flush is over: never written again
                self._report(JobNackedError(
                    f"job {item.job_id} for queue {item.queue!r} was refused by the broker "
                    f"(Basic.Nack) {item.tries} times by the end of the flush; it was not "
                    "enqueued", job_id=item.job_id, queue=item.queue))

    def _report(self, error: JobPublishError) -> None:
        callback = self._publisher.settings.on_publish_error
        if callback is None:
            self._failed.append(error)
            return
        try:
            callback(error)
        except Exception:
            logger.exception("ojs_on_publish_error raised for job %s", error.job_id)


def _combined(errors: list[JobPublishError]) -> DeferredPublishError:
    unconfirmed = tuple(e.job_id or "" for e in errors if isinstance(e, PublishConfirmTimeout))
    rejected = {e.job_id or "": str(e) for e in errors
                if not isinstance(e, PublishConfirmTimeout)}
    shown = "; ".join(str(e) for e in errors[:SHOWN_ERRORS])
    if len(errors) > SHOWN_ERRORS:
        shown += f"; and {len(errors) - SHOWN_ERRORS} more (see .errors)"
    return DeferredPublishError(
        f"{len(errors)} jobs published without waiting were not accepted: {shown}",
        errors=tuple(errors), rejected=rejected, unconfirmed=unconfirmed)


def _register(confirms: DeferredConfirms) -> None:
    global _exit_registered
    _LIVE.add(confirms)
    if not _exit_registered:
        with _exit_hook:
            if not _exit_registered:
                atexit.register(flush_confirms, every_thread=True, raise_errors=False)
                _exit_registered = True


def flush_confirms(timeout: float | None = None, *, every_thread: bool = False,
                   raise_errors: bool = True) -> None:
    """Wait for the confirms of every job this thread's channels published without
    waiting (``every_thread``: every channel of the process, as at exit, when no other
    thread publishes any more).  Raises :class:`DeferredPublishError` for the jobs that
    were not accepted (unless ``ojs_on_publish_error`` took them, or ``raise_errors``
    is false: then they are logged)."""
    me = threading.get_ident()
    errors: list[JobPublishError] = []
    for confirms in list(_LIVE):
        if not every_thread and confirms.thread != me:
            continue
        try:
            confirms.flush(timeout, raise_errors=raise_errors)
        except DeferredPublishError as exc:
            errors += exc.errors
    if errors:
        raise _combined(errors)


def flush_on_signal(**_: Any) -> None:
    """A Celery signal receiver (worker shutdown): flush every channel, log failures."""
    flush_confirms(every_thread=True, raise_errors=False)
