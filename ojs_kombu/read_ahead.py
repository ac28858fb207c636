"""py-amqp's TCP transport, reading the socket ahead instead of frame part by frame part.

py-amqp asks ``recv`` for exactly the bytes its frame parser needs next: the
7-byte header, the payload, the end octet.  That is three system calls per
frame: nine per job a worker receives (``Basic.Deliver``, content header,
body) and three per publisher confirm a producer waits for.
:class:`ReadAheadTCPTransport` asks for up to :attr:`~ReadAheadTCPTransport.read_size`
bytes at once and parses the following frames from what it already holds.

Bytes held in the process are invisible to the event loop, which only wakes
for bytes in the socket.  kombu's loop reader keeps reading until a read finds
no whole frame (``socket.timeout``), so nothing it reads ahead stays behind;
a connection registered with an event loop therefore reads ahead only inside
that reader (:class:`LoopReads`) and reads exactly, as py-amqp does, from
anywhere else (a blocking RPC made from a timer, say).  A connection with no
event loop (a producer's) reads ahead always: every read it makes takes what
is held first.
"""

from __future__ import annotations

import errno
import os
from contextlib import suppress
from typing import Any

from amqp.transport import TCPTransport

_EMPTY = b""


class ReadAheadTCPTransport(TCPTransport):
    """:class:`amqp.transport.TCPTransport` that reads up to :attr:`read_size` bytes
    per ``recv`` (see the module docstring for when)."""

    #: Bytes asked of each ``recv`` when reading ahead.
    read_size = 65536

    #: Registered with an event loop: read ahead only inside its reader.
    in_event_loop = False
    #: Set by :class:`LoopReads` while the event loop's reader runs.
    reading_for_loop = False

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

    # py-amqp reads and restores ``_read_buffer`` (what was read and not parsed)
    # when a read times out mid-frame; here it is ``_held`` from ``_offset`` on.
    @property  # type: ignore[override]
    def _read_buffer(self) -> bytes:
        return self._held[self._offset:]

    @_read_buffer.setter
    def _read_buffer(self, value: bytes) -> None:
        self._held, self._offset = value, 0

    def _read(self, n: int, initial: bool = False,
              _errnos: tuple[int, ...] = (errno.EAGAIN, errno.EINTR)) -> bytes:
        held, offset = self._held, self._offset
        end = offset + n
        if end <= len(held):  # already here: no system call
            self._offset = end
            return held[offset:end]
        rbuf = held[offset:]
        ahead = self.read_size if not self.in_event_loop or self.reading_for_loop else 0
        recv = self._quick_recv
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


class LoopReads:
    """``connection`` as kombu's event-loop reader (``Transport._make_reader``) sees it:
    each of the reader's ``drain_events(timeout=0)`` may read ahead.  kombu's reader
    keeps its own loop (rescheduling itself until a read times out) and error handling;
    only the flag is added here."""

    __slots__ = ("_connection",)

    def __init__(self, connection: Any) -> None:
        self._connection = connection

    @property
    def connected(self) -> bool:
        return self._connection.connected

    def drain_events(self, timeout: float | None = None) -> Any:
        transport = self._connection.transport
        transport.reading_for_loop = True
        try:
            return self._connection.drain_events(timeout=timeout)
        finally:
            transport.reading_for_loop = False
