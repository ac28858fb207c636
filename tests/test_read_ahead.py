"""The read-ahead socket transport: fewer ``recv`` calls, the same frames, nothing stranded."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from typing import Any

import pytest
from amqp.exceptions import UnexpectedFrame
from kombu.asynchronous import Hub

from ojs_kombu.amqp.transport import Connection, Transport
from ojs_kombu.amqp.wire.read_ahead import ReadAheadTCPTransport


def frame(channel: int, payload: bytes, frame_type: int = 1) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + b"\xce"


FRAMES = [(1, 1, b"method-" + bytes([i]) * (10 + i)) for i in range(5)]
WIRE = b"".join(frame(channel, payload, kind) for kind, channel, payload in FRAMES)


class CountingTransport(ReadAheadTCPTransport):
    """Counts the ``recv`` calls it makes."""

    recvs = 0

    def attach(self, sock: socket.socket) -> None:
        self.sock = sock
        self._setup_transport()
        recv = sock.recv

        def counting_recv(n: int) -> bytes:
            self.recvs += 1
            return recv(n)

        self._quick_recv = counting_recv


@pytest.fixture
def pair() -> Iterator[tuple[CountingTransport, socket.socket]]:
    ours, broker = socket.socketpair()
    transport = CountingTransport("localhost:5672")
    transport.attach(ours)
    try:
        yield transport, broker
    finally:
        ours.close()
        broker.close()


def test_frames_that_arrived_together_take_one_recv(pair: Any) -> None:
    transport, broker = pair
    broker.sendall(WIRE)
    frames = [transport.read_frame() for _ in FRAMES]
    assert frames == FRAMES
    assert transport.recvs == 1  # py-amqp's exact reads: three per frame, 15 here
    assert not transport.holds_frames


def test_in_an_event_loop_it_reads_exactly_outside_the_loop_reader(pair: Any) -> None:
    """A blocking read from elsewhere (an RPC from a timer) must not leave whole frames
    in the process, where the loop, which waits on the socket, would never see them."""
    transport, broker = pair
    transport.in_event_loop = True
    broker.sendall(WIRE)
    assert transport.read_frame() == FRAMES[0]
    assert not transport.holds_frames
    assert transport.recvs == 3  # header, payload, end octet
    assert [transport.read_frame() for _ in FRAMES[1:]] == FRAMES[1:]


def test_a_frame_cut_by_a_timeout_is_completed_by_the_next_read(pair: Any) -> None:
    transport, broker = pair
    transport.sock.settimeout(0.05)
    broker.sendall(WIRE[:12])  # the header and part of the payload
    with pytest.raises(TimeoutError):
        transport.read_frame()
    assert transport._read_buffer == WIRE[:12]  # py-amqp put it back
    broker.sendall(WIRE[12:])
    assert [transport.read_frame() for _ in FRAMES] == FRAMES


def test_a_closed_socket_is_an_error_not_an_empty_frame(pair: Any) -> None:
    transport, broker = pair
    broker.sendall(WIRE[:5])
    broker.close()
    with pytest.raises(OSError, match="unexpectedly closed"):
        transport.read_frame()


class Loop:
    """The part of kombu's hub a reader uses."""

    def __init__(self) -> None:
        self.soon: list[tuple[Any, tuple[Any, ...]]] = []

    def call_soon(self, callback: Any, *args: Any) -> None:
        self.soon.append((callback, args))

    def run(self) -> None:
        while self.soon:
            callback, args = self.soon.pop(0)
            callback(*args)


class FakeConnection:
    """What kombu's loop reader needs of a py-amqp connection: each frame is a whole
    method here, read by ``blocking_read`` as py-amqp's reads it, with the socket's
    timeout set for the read."""

    def __init__(self, transport: ReadAheadTCPTransport) -> None:
        self.transport = transport
        self.connected = True
        self.frames: list[Any] = []

    def blocking_read(self, timeout: float | None = None) -> bool:
        with self.transport.having_timeout(timeout):
            self.frames.append(self.transport.read_frame())
        return True


def test_the_loop_reader_reads_ahead_and_leaves_no_whole_frame_behind(pair: Any) -> None:
    transport, broker = pair
    transport.in_event_loop = True
    connection = FakeConnection(transport)
    broker.sendall(WIRE + frame(1, b"half")[:6])  # five frames and the start of a sixth
    loop = Loop()
    reader = Transport.__new__(Transport)._make_reader(connection)
    reader(loop)  # what the hub calls when the socket is readable
    loop.run()
    assert connection.frames == FRAMES
    assert transport.recvs <= 3  # the frames, then the end of the bytes (a timeout)
    assert transport._read_buffer == frame(1, b"half")[:6]  # only the partial frame
    assert not transport.reading_for_loop


class Registered(FakeConnection):
    """What ``Transport.register_with_event_loop`` needs of an ojs_kombu connection."""

    ojs = type("Binding", (), {"settings": type("Settings", (), {"acks": "each"})})()
    ojs_outcomes = type("Outcomes", (), {"run_due": lambda self: None})()

    @property
    def sock(self) -> socket.socket:
        return self.transport.sock

    def join_loop_wake(self, wake: Any) -> None:
        self.transport.loop_wake = wake.wake


class WatchedHub(Hub):
    """kombu's hub, whose polls are watched: a poll that would wait (nothing ready on
    any descriptor) while whole frames are held is recorded and not waited for."""

    def __init__(self, transport: ReadAheadTCPTransport) -> None:
        super().__init__()
        self.stranded = 0
        poll = self.poller.poll

        def watched(timeout: float | None) -> Any:
            events = poll(0)
            if not events and transport.holds_whole_frame:
                self.stranded += 1  # the real loop would sleep up to `timeout` here
            return events

        self.poller.poll = watched  # type: ignore[method-assign]

    def turn(self, times: int) -> None:
        loop = self.create_loop()
        for _ in range(times):
            next(loop)


def run_in_hub(transport: CountingTransport, connection: Registered) -> WatchedHub:
    hub = WatchedHub(transport)
    Transport.__new__(Transport).register_with_event_loop(connection, hub)
    assert transport.in_event_loop
    return hub


def test_the_loop_never_waits_on_the_socket_while_whole_frames_are_held(pair: Any) -> None:
    """kombu's reader handles one method per turn and schedules itself; the hub polls
    before it runs what was scheduled.  Frames read ahead must make that poll return at
    once, or a worker whose prefetched jobs all arrived in one read stalls (the broker
    sends nothing more until those jobs are acked)."""
    transport, broker = pair
    connection = Registered(transport)
    hub = run_in_hub(transport, connection)
    try:
        broker.sendall(WIRE)  # all five frames arrive in one read
        hub.turn(len(FRAMES) * 2 + 2)
        assert connection.frames == FRAMES
        assert hub.stranded == 0
        assert transport.recvs <= 3
    finally:
        hub.close()


def test_registering_with_a_loop_reads_what_is_already_held(pair: Any) -> None:
    """Frames read ahead before the connection joined the loop (consumer set-up) would
    wait for the next bytes on the socket; registration schedules a read for them."""
    transport, broker = pair
    broker.sendall(WIRE)
    assert transport.read_frame() == FRAMES[0]
    assert transport.holds_frames
    connection = Registered(transport)
    hub = run_in_hub(transport, connection)
    try:
        hub.turn(len(FRAMES) * 2)
        assert connection.frames == FRAMES[1:]
        assert hub.stranded == 0
    finally:
        hub.close()


class TimedSocket(socket.socket):
    """Counts how often the socket's timeout is set (a system call each time)."""

    timeouts_set = 0

    def settimeout(self, value: float | None) -> None:
        self.timeouts_set += 1
        super().settimeout(value)


@pytest.fixture
def connection() -> Iterator[tuple[Connection, socket.socket, list[Any]]]:
    """An ojs_kombu connection reading from a socket whose other end is the broker's;
    each frame it reads is appended to the list."""
    ours, broker = socket.socketpair()
    timed = TimedSocket(ours.family, ours.type, 0, ours.detach())
    transport = CountingTransport("localhost:5672")
    transport.attach(timed)
    connection = Connection(host="localhost:5672")
    connection.transport = transport
    frames: list[Any] = []
    connection.on_inbound_frame = lambda frame: frames.append(frame) or True
    try:
        yield connection, broker, frames
    finally:
        timed.close()
        broker.close()


def test_frames_read_ahead_are_handled_without_touching_the_socket(connection: Any) -> None:
    conn, broker, frames = connection
    broker.sendall(WIRE)
    for _ in FRAMES:
        conn.blocking_read(timeout=1)
    assert frames == FRAMES
    assert conn.transport.recvs == 1
    assert conn.transport.sock.timeouts_set == 2  # set and restored for the first read only


def test_a_frame_held_only_in_part_is_completed_from_the_socket(connection: Any) -> None:
    conn, broker, frames = connection
    broker.sendall(WIRE[:12])
    with pytest.raises(TimeoutError):
        conn.blocking_read(timeout=0.05)
    broker.sendall(WIRE[12:])
    for _ in FRAMES:
        conn.blocking_read(timeout=1)
    assert frames == FRAMES


def test_a_held_frame_without_its_end_octet_is_py_amqps_error(connection: Any) -> None:
    conn, broker, frames = connection
    broker.sendall(WIRE[:-1] + b"\x00" + WIRE)
    for _ in FRAMES[:-1]:
        conn.blocking_read(timeout=1)
    with pytest.raises(UnexpectedFrame):
        conn.blocking_read(timeout=1)
    assert frames == FRAMES[:-1]


def test_a_warm_shutdown_wakes_the_loop_at_once(pair: Any) -> None:
    """Celery's SIGTERM handler sends ``worker_shutting_down`` and sets the flag its
    loop reads between polls; kombu's hub may poll for up to 10 s before it reads it.
    With ojs_kombu installed, the loop of an ``ojs`` connection is woken by it: the
    next poll has a descriptor ready and returns without waiting."""
    from celery.signals import worker_shutting_down

    import ojs_kombu  # noqa: F401  (what install() users import)

    transport, _broker = pair
    hub = run_in_hub(transport, Registered(transport))
    try:
        hub.turn(2)
        assert hub.poller.poll(0) == []  # idle: this poll would sleep
        worker_shutting_down.send(sender="celery@host", sig="SIGTERM", how="Warm",
                                  exitcode=0)
        assert hub.poller.poll(0) != []  # woken: it returns at once
        hub.turn(1)
        assert hub.poller.poll(0) == []  # the wake was read; nothing else changed
    finally:
        hub.close()
