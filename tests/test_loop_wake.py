"""A callback scheduled on the worker's event loop from another thread (the threads
pool's acks and settles) runs at once, not at the loop's next timeout: kombu 5.7's
hub wakes itself, ojs_kombu wakes kombu 5.5's and 5.6's (``kombu_seam``); and a
closed loop stops being the process's loop, as kombu 5.7's does."""

from __future__ import annotations

import os
import threading

from kombu.asynchronous import Hub, get_event_loop, set_event_loop
from kombu.asynchronous.timer import Timer

from ojs_kombu.amqp.wire.kombu_seam import forget_loop_on_close, wake_on_foreign_call_soon
from ojs_kombu.amqp.wire.read_ahead import LoopWake

#: Half the hub's longest poll (10 s): a callback that waits for the timeout misses it.
DEADLINE_S = 5.0


def run_loop(hub: Hub, stop: threading.Event, registered: threading.Event) -> None:
    wake_on_foreign_call_soon(hub, lambda: LoopWake(hub))  # from the loop's thread
    registered.set()
    loop = hub.create_loop()
    while not stop.is_set():
        next(loop)


def test_a_call_soon_from_another_thread_runs_before_the_polls_timeout() -> None:
    hub = Hub(Timer(max_interval=10.0))  # as Celery's worker makes it
    hub.timer.call_after(60, lambda: None)  # nothing due sooner: the poll waits 10 s
    quiet, _writer = os.pipe()  # a socket that never speaks: the loop polls, not sleeps
    hub.add_reader(quiet, lambda: None)
    stop, registered, ran = threading.Event(), threading.Event(), threading.Event()
    thread = threading.Thread(target=run_loop, args=(hub, stop, registered), daemon=True)
    thread.start()
    try:
        assert registered.wait(DEADLINE_S)
        for _ in range(3):  # each time, not only the first
            ran.clear()
            hub.call_soon(ran.set)
            assert ran.wait(DEADLINE_S), "the loop slept through a call_soon from a thread"
    finally:
        stop.set()
        hub.call_soon(lambda: None)
        thread.join(15)
        hub.close()
        os.close(quiet)
        os.close(_writer)


def test_a_closed_loop_is_no_longer_the_process_loop() -> None:
    """Celery's worker makes its own hub (with its own timer) only when there is no
    current loop: after a worker's hub closed, the next worker in the process must
    not get it (kombu 5.5 and 5.6 kept it; its timer was the first worker's)."""
    hub = Hub(Timer(max_interval=10.0))
    set_event_loop(hub)
    try:
        forget_loop_on_close(hub)
        forget_loop_on_close(hub)  # each connection registers: once is enough
        hub.close()
        assert get_event_loop() is None, "a closed hub stayed the process's event loop"
    finally:
        set_event_loop(None)


def test_closing_another_loop_leaves_the_current_one() -> None:
    old, current = Hub(Timer()), Hub(Timer())
    forget_loop_on_close(old)
    set_event_loop(current)
    try:
        old.close()
        assert get_event_loop() is current
    finally:
        current.close()
        set_event_loop(None)
