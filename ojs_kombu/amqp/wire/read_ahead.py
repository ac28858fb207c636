"""py-amqp's TCP transport, reading the socket ahead instead of frame part by frame part.

py-amqp asks ``recv`` for exactly the bytes its frame parser needs next: the
7-byte header, the payload, the end octet.  That is three system calls per
frame: nine per job a worker receives (``Basic.Deliver``, content header,
body) and three per publisher confirm a producer waits for.
:class:`ReadAheadTCPTransport` asks for up to :attr:`~ReadAheadTCPTransport.read_size`
bytes at once and parses the following frames from what it already holds.

Bytes held in the process are invisible to the event loop, which only wakes
for bytes in the socket.  kombu's loop reader handles one AMQP method per turn
of the loop and schedules itself again (``call_soon``), but the loop then polls
before it runs what was scheduled, and a poll with whole frames held and a quiet
socket waits for its timeout (up to 10 s, or for good when the broker waits
for the acks of the jobs those frames hold).  So a connection registered with an
event loop reads ahead only inside that reader (:class:`LoopReads`), and when
the reader stops with frames still held it makes the next poll return at once
(:class:`LoopWake`).  From anywhere else (a blocking RPC made from a timer, say)
it reads exactly, as py-amqp does.  A connection with no event loop (a
producer's) reads ahead always: every read it makes takes what is held first.
"""

from __future__ import annotations

import errno
import os
import sys
import weakref
from collections.abc import Callable
from contextlib import suppress
from struct import Struct
from typing import Any

from amqp.transport import TCPTransport

from .py_amqp_seam import read_hooks, socket_recv

_EMPTY = b""
#: ``(type, channel, size)`` of a frame header at an offset; then the payload, then 0xCE.
_FRAME_HEADER = Struct(">BHI").unpack_from
_FRAME_END = 0xCE
#: What an ``eventfd`` write adds (a native 8-byte integer); any byte for a pipe.
_ONE = (1).to_bytes(8, sys.byteorder)
#: The process's live loop wakes, for :func:`wake_loops`.
_LIVE: weakref.WeakSet[LoopWake] = weakref.WeakSet()


@read_hooks
class ReadAheadTCPTransport(TCPTransport):
    """:class:`amqp.transport.TCPTransport` that reads up to :attr:`read_size` bytes
    per ``recv`` (see the module docstring for when)."""

    #: Bytes asked of each ``recv`` when reading ahead.
    read_size = 65536

    #: Registered with an event loop: read ahead only inside its reader.
    in_event_loop = False
    #: Set by :class:`LoopReads` while the event loop's reader runs.
    reading_for_loop = False
    #: Makes the event loop's next poll return at once (:class:`LoopWake`).
    loop_wake: Callable[[], None] | None = None
    #: py-amqp's socket (``None`` once closed); py-amqp has no type hints.
    sock: Any

    _held = _EMPTY
    _offset = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pid = os.getpid()

    def close(self) -> None:
        """py-amqp's close, except in a forked child: there only this process's copy of
        the socket is closed.  py-amqp shuts the socket down first, which would end the
        parent's connection too, and kombu closes the connection pools a child
        inherits (a prefork pool process replaced after ``terminate`` did exactly that
        to the worker's connections)."""
        if self.sock is not None and os.getpid() != self._pid:
            with suppress(OSError):
                self.sock.close()
            self.sock = None
            self.connected = False
            return
        super().close()

    @property
    def unparsed(self) -> bytes:
        """What was read and not parsed: py-amqp's ``_read_buffer``, which it reads and
        restores when a read times out mid-frame (:func:`.py_amqp_seam.read_hooks`)."""
        return self._held[self._offset:]

    @unparsed.setter
    def unparsed(self, value: bytes) -> None:
        self._held, self._offset = value, 0

    def read_exact(self, n: int, initial: bool = False,
                   _errnos: tuple[int, ...] = (errno.EAGAIN, errno.EINTR)) -> bytes:
        """``n`` bytes, as py-amqp's ``_read`` returns them, from what is held first."""
        held, offset = self._held, self._offset
        end = offset + n
        if end <= len(held):  # already here: no system call
            self._offset = end
            return held[offset:end]
        rbuf = held[offset:]
        ahead = self.read_size if not self.in_event_loop or self.reading_for_loop else 0
        recv = socket_recv(self)
        try:
            while len(rbuf) < n:
                try:
                    chunk = recv(max(n - len(rbuf), ahead))
                except OSError as exc:
                    if exc.errno in _errnos:
                        if initial and self.raise_on_initial_eintr:
                            raise TimeoutError() from None
                        continue
                    raise
                if not chunk:
                    raise OSError("Server unexpectedly closed connection")
                rbuf += chunk
        except BaseException:
            self._held, self._offset = rbuf, 0
            raise
        self._held, self._offset = rbuf, n
        return rbuf[:n]

    @property
    def holds_frames(self) -> bool:
        """Bytes read from the socket and not parsed yet."""
        return self._offset < len(self._held)

    def held_frame(self) -> tuple[int, int, bytes] | None:
        """The next frame, ``(type, channel, payload)`` as :meth:`read_frame` returns it,
        when it is whole in what was read ahead; else ``None`` (and nothing consumed).

        :meth:`~ojs_kombu.amqp.transport.Connection.blocking_read` takes it without
        setting the socket's timeout (two system calls) or py-amqp's three reads: most
        frames a busy worker reads are already here.  A frame without its end octet is
        left to :meth:`read_frame`, which raises py-amqp's error for it."""
        held, start = self._held, self._offset + 7
        if len(held) <= start:
            return None
        frame_type, channel, size = _FRAME_HEADER(held, start - 7)
        end = start + size
        if len(held) <= end or held[end] != _FRAME_END:
            return None
        self._offset = end + 1
        return frame_type, channel, held[start:end]

    @property
    def holds_whole_frame(self) -> bool:
        """A whole frame read from the socket and not parsed yet: the next read needs no
        bytes from the socket."""
        held, offset = self._held, self._offset
        if len(held) - offset < 7:
            return False
        return len(held) - offset >= _FRAME_HEADER(held, offset)[2] + 8


class LoopWake:
    """A file descriptor of the event loop's own that makes its next poll return at once.

    kombu's hub has no public way to say "do not block in the next poll"; a
    readable descriptor is one.  :meth:`wake` writes to it (once until the loop
    has read it); the loop reads it and does nothing else: the reader that left
    the frames held has already scheduled itself.  An ``eventfd`` where the OS has
    one, else a pipe.
    """

    def __init__(self, loop: Any) -> None:
        self._loop = loop
        self._pending = False
        if hasattr(os, "eventfd"):
            self._read_fd = self._write_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        else:  # pragma: no cover - platforms without eventfd
            self._read_fd, self._write_fd = os.pipe()
            os.set_blocking(self._read_fd, False)
            os.set_blocking(self._write_fd, False)
        loop.add_reader(self._read_fd, self._woken)
        loop.on_close.add(self._on_loop_closed)
        _LIVE.add(self)

    @property
    def closed(self) -> bool:
        return self._read_fd < 0

    def wake(self) -> None:
        if not self._pending and self._write_fd >= 0:
            self._pending = True
            with suppress(BlockingIOError):  # already readable: one wake is enough
                os.write(self._write_fd, _ONE)

    def _woken(self) -> None:
        with suppress(BlockingIOError):
            os.read(self._read_fd, 8)
        self._pending = False

    def _on_loop_closed(self, _loop: Any) -> None:
        self.close(closing=True)

    def close(self, closing: bool = False) -> None:
        """Leave the loop and close the descriptor (with the connection or the loop).
        ``closing``: the loop is running its ``on_close`` callbacks, whose set must not
        change under it (kombu before 5.7 iterates the set itself, not a copy)."""
        if self._read_fd < 0:
            return
        if not closing:
            self._loop.on_close.discard(self._on_loop_closed)
        with suppress(Exception):
            self._loop.remove_reader(self._read_fd)
        for fd in {self._read_fd, self._write_fd}:
            with suppress(OSError):
                os.close(fd)
        self._read_fd = self._write_fd = -1


def wake_loops() -> None:
    """Make the next poll of every event loop an ``ojs`` connection of this process
    reads from return at once.  Safe in a signal handler (a write to a descriptor):
    Celery's warm shutdown only sets a flag its loop reads after a poll returns, and
    kombu's hub may poll for up to 10 s."""
    for wake in list(_LIVE):
        wake.wake()


class LoopReads:
    """``connection`` as kombu's event-loop reader (``Transport._make_reader``) sees it:
    each of the reader's ``drain_events(timeout=0)`` may read ahead, and a read that
    leaves whole frames held wakes the loop (``wake``), so that its next poll does not
    wait for bytes that are already here (the transport's ``loop_wake``).  kombu's
    reader keeps its own loop and error handling; only the flag and the wake are added
    here."""

    __slots__ = ("_connection",)

    def __init__(self, connection: Any) -> None:
        self._connection = connection

    @property
    def connected(self) -> bool:
        return self._connection.connected

    def drain_events(self, timeout: float | None = None) -> None:
        """Read frames until one method is whole, as py-amqp's ``drain_events`` (the
        connection's own adds nothing in the hub, whose tick does the rest)."""
        connection = self._connection
        transport = connection.transport
        transport.reading_for_loop = True
        try:
            while not connection.blocking_read(timeout):
                pass
        finally:
            transport.reading_for_loop = False
            if transport.loop_wake is not None and transport.holds_whole_frame:
                transport.loop_wake()
