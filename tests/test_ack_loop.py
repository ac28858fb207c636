"""The transport's acks inside kombu's event loop (hub), over a socket stand-in.

What the worker relies on: acks made by the loop's callbacks reach the socket
in one write before the loop polls again; nothing collected stays unwritten
when the loop closes, when a job is delivered or before a blocking wait; a
lost connection fails an ack the way py-amqp does (a connection error Celery
handles), never with an error that stops the worker.
"""

from __future__ import annotations

import socket as stdlib_socket
import struct
import threading
from typing import Any

import pytest
from amqp.exceptions import RecoverableConnectionError
from amqp.method_framing import frame_writer
from kombu.asynchronous import Hub

from ojs_kombu.amqp.channel import Channel
from ojs_kombu.amqp.transport import Connection


class Socket:
    """What the connection writes, one entry per write."""

    connected = True

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.connected = False


def acks_in(data: bytes) -> list[tuple[int, bool]]:
    """``(delivery tag, multiple)`` of every ``Basic.Ack`` frame in ``data``."""
    found, offset = [], 0
    while offset < len(data):
        kind, _channel, size = struct.unpack_from(">BHI", data, offset)
        payload = data[offset + 7:offset + 7 + size]
        if kind == 1 and payload[:4] == struct.pack(">HH", 60, 80):
            tag, bits = struct.unpack_from(">QB", payload, 4)
            found.append((tag, bool(bits & 1)))
        offset += 8 + size
    return found


def connected(acks: str = "batched") -> tuple[Connection, Channel, Socket]:
    connection = Connection(host="127.0.0.1:1", ojs_acks=acks)
    socket = Socket()
    connection._transport = socket
    connection.frame_writer = frame_writer(connection, socket)
    channel = Channel(connection, 1)
    channel.is_open = True
    return connection, channel, socket


def deliver(channel: Channel, *tags: int, on_message: Any = None) -> None:
    channel.callbacks["ctag"] = on_message or (lambda message: None)
    for tag in tags:
        channel._on_basic_deliver("ctag", tag, False, "ojs.exchange.direct", "q",
                                  _Message())


class _Message:
    """What py-amqp's ``_on_basic_deliver`` needs of a message."""

    channel: Any = None
    delivery_info: Any = None


@pytest.fixture
def hub() -> Hub:
    hub = Hub()
    yield hub
    hub.close()


def test_acks_of_one_loop_iteration_go_out_in_one_write_before_the_next_poll(hub: Hub) -> None:
    connection, channel, socket = connected()
    deliver(channel, 1, 2, 3)
    connection.register_with_loop(hub)
    loop = hub.create_loop()
    for tag in (1, 2, 3):
        hub.call_soon(channel.basic_ack, tag)  # how Celery hands finished jobs' acks over
    next(loop)
    assert [acks_in(write) for write in socket.writes] == [[(1, False), (2, False), (3, False)]]


def test_multiple_mode_settles_a_finished_run_with_one_frame(hub: Hub) -> None:
    connection, channel, socket = connected("multiple")
    deliver(channel, 1, 2, 3)
    connection.register_with_loop(hub)
    loop = hub.create_loop()
    for tag in (2, 1):
        hub.call_soon(channel.basic_ack, tag)
    next(loop)
    assert [acks_in(write) for write in socket.writes] == [[(2, True)]]


def test_an_ack_from_another_thread_goes_out_at_once(hub: Hub) -> None:
    connection, channel, socket = connected()
    deliver(channel, 1)
    connection.register_with_loop(hub)
    thread = threading.Thread(target=channel.basic_ack, args=(1,))
    thread.start()
    thread.join()
    assert [acks_in(write) for write in socket.writes] == [[(1, False)]]


def test_closing_the_loop_writes_what_was_collected_and_later_acks_go_out_at_once() -> None:
    hub = Hub()
    connection, channel, socket = connected()
    deliver(channel, 1, 2)
    connection.register_with_loop(hub)
    channel.basic_ack(1)  # collected (this is the loop's thread); nobody ticks any more
    assert socket.writes == []
    hub.close()  # Celery's shutdown, or hub.reset() after a connection error
    assert [acks_in(write) for write in socket.writes] == [[(1, False)]]
    assert connection.ojs_loop_thread is None and connection.flush_acks not in hub.on_tick
    channel.basic_ack(2)
    assert acks_in(socket.writes[-1]) == [(2, False)]


def test_with_the_solo_pool_a_delivery_writes_the_collected_acks_first(hub: Hub) -> None:
    """With the solo pool the job runs inside the delivery: the acks of jobs that
    already finished must not wait for it."""
    connection, channel, socket = connected()
    connection.ojs_jobs_run_in_loop = True  # what the Celery wiring sets for the solo pool
    deliver(channel, 1)
    connection.register_with_loop(hub)
    channel.basic_ack(1)
    seen: list[int] = []
    deliver(channel, 2, on_message=lambda message: seen.append(len(socket.writes)))
    assert seen == [1] and acks_in(socket.writes[0]) == [(1, False)]


def test_with_a_pool_of_its_own_acks_wait_for_the_tick_not_for_deliveries(hub: Hub) -> None:
    """threads/prefork: a delivery only hands the job over, so the acks collected in
    the iteration keep going out together at the tick."""
    connection, channel, socket = connected()
    deliver(channel, 1)
    connection.register_with_loop(hub)
    channel.basic_ack(1)
    deliver(channel, 2)
    assert socket.writes == []
    connection.flush_acks()
    assert acks_in(socket.writes[0]) == [(1, False)]


def test_a_nack_never_overtakes_a_collected_ack(hub: Hub) -> None:
    connection, channel, socket = connected()
    deliver(channel, 1, 2)
    connection.register_with_loop(hub)
    channel.basic_ack(1)
    channel.basic_nack(2, requeue=False)
    assert acks_in(socket.writes[0]) == [(1, False)]
    assert len(socket.writes) == 2  # then the nack


def test_closing_the_connection_writes_collected_acks_first(hub: Hub) -> None:
    connection, channel, socket = connected()
    deliver(channel, 1)
    connection.register_with_loop(hub)
    channel.basic_ack(1)
    with pytest.raises(Exception):  # noqa: B017 - the stand-in cannot finish a Close handshake
        connection.close()
    assert acks_in(socket.writes[0]) == [(1, False)]


def test_an_ack_after_the_connection_was_dropped_raises_py_amqps_connection_error(
        hub: Hub) -> None:
    """kombu's ``ack_log_error`` logs a connection error and the worker goes on; any other
    error would leave the event loop and stop the worker."""
    connection, channel, _socket = connected()
    deliver(channel, 1)
    connection.register_with_loop(hub)
    channel.connection = None  # what kombu's collect() leaves after a connection loss
    with pytest.raises(RecoverableConnectionError):
        channel.basic_ack(1)
    with pytest.raises(RecoverableConnectionError):
        channel.basic_nack(1)
    channel.flush_acks()  # nothing to write it to, and no error


def test_each_mode_leaves_the_loop_alone() -> None:
    from kombu import Connection as KombuConnection

    from ojs_kombu.amqp.transport import Transport

    connection, channel, socket = connected("each")
    hub = Hub()
    ends = stdlib_socket.socketpair()
    socket.sock = ends[0]  # type: ignore[attr-defined]  # the loop watches it for reading
    transport = Transport(KombuConnection("ojs://"))
    transport.register_with_event_loop(connection, hub)
    try:
        assert connection.ojs_loop_thread is None
        deliver(channel, 1)
        channel.basic_ack(1)
        assert acks_in(socket.writes[0]) == [(1, False)]
    finally:
        hub.close()
        for end in ends:
            end.close()
