"""Where events go: an AMQP topic exchange, a JSON Lines file, a webhook.

Every sink delivers on a thread of its own from a bounded buffer, so a slow
or failing sink never fails a job or holds it up: when the buffer is full the
event is dropped, counted and logged.  Guarantee (events spec section 9.1):
**best-effort**.  AMQP publishes are confirmed and webhook posts retried while
the process runs, but a full buffer, a crash or a restart loses the events in
flight.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import os
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..spec.backoff import backoff
from . import wire
from .models import Event, EventDraft

#: What a sink is handed: an event, or the draft of one.
AnyEvent = Event | EventDraft

logger = logging.getLogger("ojs_kombu.events")

_STOP = object()

#: Bumped in every forked child: a sink compares it with the one its thread was
#: started in (cheaper per event than ``os.getpid()``, a system call).
_PROCESS = [0]


def _forked_child() -> None:
    _PROCESS[0] += 1


os.register_at_fork(after_in_child=_forked_child)


class BackgroundSink:
    """Base of the sinks: hand-off in O(1), delivery on a daemon thread.

    The hand-off is a ``deque`` append plus, at most, setting an event that is
    not set yet: the emitting thread (a job's pool thread) never takes a lock
    the delivery thread holds, and the delivery thread wakes once per batch,
    not once per event, so it does not make the worker's threads hand the GIL
    around for every event.
    """

    name = "sink"

    #: Takes an :class:`~ojs_kombu.events.models.EventDraft` in place of an
    #: :class:`Event` (see :meth:`EventBus.publish_draft`).  The built-in sinks
    #: only serialise, which a draft does as well, on the sink's thread; a
    #: subclass that needs the :class:`Event` itself leaves this ``False``.
    takes_drafts = False

    #: Most events handed to :meth:`deliver_batch` at once.
    batch_size = 200
    #: Seconds the thread keeps collecting after the first event of a batch (0: take
    #: only what is already buffered), so a busy process sends fewer, bigger batches.
    linger = 0.0

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self.delivered = 0
        self.failed = 0
        self.dropped = 0
        self._lock = threading.Lock()
        self._process = -1
        self._buffer: deque[Any] = deque()
        #: Set when the buffer may hold something the thread has not seen.
        self._wake = threading.Event()
        #: Ends a linger early: a full batch is waiting, or a flush or close.
        self._hurry = threading.Event()
        self._thread: threading.Thread | None = None
        self._in_hand = 0

    @property
    def pending(self) -> int:
        """Events handed over and not yet delivered (or failed)."""
        return sum(1 for item in tuple(self._buffer) if not _is_marker(item)) + self._in_hand

    def __call__(self, event: AnyEvent) -> None:
        self._ensure_thread()
        buffer = self._buffer
        if len(buffer) >= self.capacity:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                logger.warning("%s: buffer of %d events is full; %d event(s) dropped",
                               self.name, self.capacity, self.dropped)
            return
        buffer.append(event)
        if not self._wake.is_set():
            self._wake.set()
        if self.linger and len(buffer) >= self.batch_size and not self._hurry.is_set():
            self._hurry.set()

    def deliver(self, event: AnyEvent) -> None:
        raise NotImplementedError

    def forked(self) -> None:
        """In a forked child: forget what belongs to the parent (never close it)."""

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every event handed over so far was handled; ``False`` on timeout."""
        if self._thread is None or not self._thread.is_alive():
            return self.pending == 0
        done = threading.Event()
        self._mark(done)  # handled in order, after every earlier event
        return done.wait(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what is buffered and stop the thread; the next event starts a new one."""
        thread = self._thread
        if thread is not None and thread.is_alive():
            self.flush(timeout)
            self._mark(_STOP)
            thread.join(timeout)
        with self._lock:
            self._thread, self._process = None, -1

    def _mark(self, marker: Any) -> None:
        """Queue a flush or stop marker behind every event so far, ending any linger."""
        self._buffer.append(marker)
        self._hurry.set()
        self._wake.set()

    def _ensure_thread(self) -> None:
        if self._process == _PROCESS[0] and self._thread is not None:
            return
        with self._lock:
            if self._process != _PROCESS[0]:  # new process (fork) or closed: fresh thread
                if self._process != -1:
                    self.forked()
                    self._buffer = deque()
                    self._wake, self._hurry = threading.Event(), threading.Event()
                self._process = _PROCESS[0]
                self._thread = threading.Thread(target=self._run, name=f"ojs-{self.name}",
                                                daemon=True)
                self._thread.start()

    def deliver_batch(self, events: list[AnyEvent]) -> None:
        for event in events:
            try:
                self.deliver(event)
                self.delivered += 1
            except Exception:
                self.failed += 1
                logger.exception("%s could not deliver event %s (%s)", self.name,
                                 event.id, event.type)

    def _take(self) -> tuple[list[AnyEvent], Any]:
        """Up to ``batch_size`` events from the front, and the marker that ended them."""
        buffer = self._buffer
        events: list[AnyEvent] = []
        while buffer and len(events) < self.batch_size:
            item = buffer.popleft()
            if _is_marker(item):
                return events, item
            events.append(item)
        return events, None

    def _run(self) -> None:
        buffer = self._buffer
        while True:
            self._wake.wait()
            self._wake.clear()  # anything appended from now on sets it again
            while buffer:
                if self.linger and len(buffer) < self.batch_size:
                    # Clear first, then look: a marker or a full batch that arrives
                    # from here on sets _hurry again and ends the wait.
                    self._hurry.clear()
                    if not any(_is_marker(item) for item in tuple(buffer)):
                        self._hurry.wait(self.linger)
                events, marker = self._take()
                self._in_hand = len(events)
                try:
                    if events:
                        self.deliver_batch(events)
                finally:
                    self._in_hand = 0
                if marker is _STOP:
                    return
                if marker is not None:
                    marker.set()


def _is_marker(item: Any) -> bool:
    return item is _STOP or isinstance(item, threading.Event)


class FileSink(BackgroundSink):
    """One JSON object per line, appended to ``path``."""

    name = "file sink"
    takes_drafts = True

    def __init__(self, path: str | os.PathLike[str], capacity: int = 10_000) -> None:
        super().__init__(capacity)
        self.path = Path(path)
        self._file: Any = None

    def forked(self) -> None:
        self._file = None

    def deliver(self, event: AnyEvent) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("ab")
        self._file.write(event.to_json() + b"\n")
        self._file.flush()


class WebhookSink(BackgroundSink):
    """HTTP POST of each event (events spec section 6.5).

    ``Content-Type: application/json``; with a ``secret``,
    ``X-OJS-Signature: sha256=<hex HMAC-SHA256 of the body>``.  A 5xx answer
    or a network error is retried with exponential backoff (0.5 s, 1 s, 2 s ...)
    up to ``max_retries`` times; a 4xx answer is not retried.
    """

    name = "webhook sink"
    takes_drafts = True

    def __init__(self, url: str, secret: str | None = None, timeout: float = 30.0,
                 max_retries: int = 5, backoff: float = 0.5, capacity: int = 10_000) -> None:
        super().__init__(capacity)
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"webhook url must be http(s), not {url!r}")
        self.url = url
        self.secret = secret
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff

    def signature(self, body: bytes) -> str:
        assert self.secret is not None
        digest = hmac.new(self.secret.encode(), body, hashlib.sha256).hexdigest()
        return f"sha256={digest}"

    def deliver(self, event: AnyEvent) -> None:
        body = event.to_json()
        headers = {"Content-Type": "application/json", "User-Agent": "ojs-kombu"}
        if self.secret:
            headers["X-OJS-Signature"] = self.signature(body)
        for attempt in range(self.max_retries + 1):
            request = urllib.request.Request(self.url, data=body, headers=headers,
                                             method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    response.read()
                return
            except urllib.error.HTTPError as exc:
                if exc.code < 500 or attempt == self.max_retries:
                    raise
            except (urllib.error.URLError, TimeoutError, ConnectionError):
                if attempt == self.max_retries:
                    raise
            time.sleep(backoff(self.backoff, math.inf, attempt + 1))


class AMQPSink(BackgroundSink):
    """Publishes events, confirmed, to a durable topic exchange (routing key: the event type).

    Bind a queue with ``job.*``, ``worker.#`` or an exact type to receive them.
    With ``batch_size`` > 1 (the default, 500) the thread collects events for up
    to ``batch_ms`` milliseconds or ``batch_size`` events, whichever comes
    first, and publishes one ``application/cloudevents-batch+json`` message (a
    JSON array of events) per event type of that batch (see
    :mod:`ojs_kombu.events.wire`): a busy worker's two or three events per job
    cost the broker a few persistent messages per flush instead of one each.
    ``batch_size=1`` publishes one ``application/json`` message per event.
    """

    name = "AMQP event sink"
    takes_drafts = True
    #: Seconds before the first retry of a failed publish; doubled for each next one.
    retry_delay = 0.5

    def __init__(self, connect: Callable[[], Any], exchange: str, capacity: int = 10_000,
                 max_retries: int = 3, batch_size: int = 500, batch_ms: float = 50.0) -> None:
        super().__init__(capacity)
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"AMQP event sink batch_size must be an integer >= 1, "
                             f"not {batch_size!r}")
        if (not isinstance(batch_ms, int | float) or isinstance(batch_ms, bool)
                or not 0 <= batch_ms <= 60_000):
            raise ValueError(f"AMQP event sink batch_ms must be a number of milliseconds "
                             f"in 0..60000, not {batch_ms!r}")
        self.connect = connect
        self.exchange = exchange
        self.max_retries = max_retries
        self.batched = batch_size > 1
        if self.batched:
            self.batch_size = batch_size
            self.linger = batch_ms / 1000
        self._connection: Any = None
        self._channel: Any = None

    def deliver(self, event: AnyEvent) -> None:
        self.deliver_batch([event])

    def messages(self, events: list[AnyEvent]) -> list[tuple[Any, str, str]]:
        """``(message, exchange, routing key)`` for each message carrying ``events``."""
        import amqp

        stamp = int(time.time())
        if not self.batched:
            return [(amqp.Message(
                event.to_json(), content_type=wire.SINGLE_CONTENT_TYPE,
                content_encoding="utf-8", message_id=event.id, type=event.type,
                delivery_mode=2, app_id="ojs", timestamp=stamp), self.exchange, event.type)
                for event in events]
        return [(amqp.Message(
            wire.encode_batch(event.to_dict() for event in group),
            content_type=wire.BATCH_CONTENT_TYPE, content_encoding="utf-8",
            message_id=group[0].id, type=event_type, delivery_mode=2, app_id="ojs",
            timestamp=stamp, application_headers={wire.COUNT_HEADER: len(group)}),
            self.exchange, event_type) for event_type, group in wire.split_batches(events)]

    def deliver_batch(self, events: list[AnyEvent]) -> None:
        """Pipelined publishes and one wait for all confirms; retried as a whole.

        The counters count events: a message's events are delivered or failed together."""
        messages = self.messages(events)
        counts = [1] * len(events) if not self.batched else [
            m.properties["application_headers"][wire.COUNT_HEADER] for m, _, _ in messages]
        for attempt in range(self.max_retries + 1):
            try:
                accepted = self._open().publish_many_confirmed(messages)
                for ok, count in zip(accepted, counts, strict=True):
                    if ok:
                        self.delivered += count
                    else:
                        self.failed += count
                return
            except Exception:
                self._reset()
                if attempt == self.max_retries:
                    self.failed += len(events)
                    logger.exception("%s could not deliver %d events", self.name, len(events))
                    return
                time.sleep(backoff(self.retry_delay, math.inf, attempt + 1))

    def forked(self) -> None:
        self._connection = self._channel = None

    def _open(self) -> Any:
        if self._channel is None:
            from amqp.exceptions import AccessRefused

            self._connection = self.connect()
            self._connection.ensure_connection(max_retries=1)
            channel = self._connection.connection.channel()
            try:
                channel.exchange_declare(self.exchange, "topic", durable=True,
                                         auto_delete=False)
            except AccessRefused:
                # a scoped worker's user may not declare shared exchanges: the operator
                # did (``ojs-kombu topology declare``); check it exists, on a new
                # channel (the refusal closed this one)
                channel = self._connection.connection.channel()
                channel.exchange_declare(self.exchange, "topic", durable=True,
                                         auto_delete=False, passive=True)
            self._channel = channel
        return self._channel

    def _reset(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            try:
                connection.release()
            except Exception:
                logger.debug("closing the event connection failed", exc_info=True)

    def close(self, timeout: float = 10.0) -> None:
        super().close(timeout)
        self._reset()
