"""AMQP-028: publishing from 16 threads through one Celery app never shares a channel."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from celery import Celery

from .conftest import wait_until

THREADS = 16
PER_THREAD = 40


def test_sixteen_threads_publish_through_one_app(app: Celery, worker: Any) -> None:
    """Every job confirmed, consumed exactly once, and no frame errors: a channel
    shared across threads would interleave frames and break the connection."""
    in_use: dict[int, int] = {}  # channel -> the thread publishing on it right now
    shared: list[int] = []
    errors: list[BaseException] = []
    ids: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(THREADS)

    def publisher(n: int) -> None:
        start.wait()
        for i in range(PER_THREAD):
            try:
                with app.producer_or_acquire() as producer:
                    channel = id(producer.channel)
                    with lock:
                        if channel in in_use:
                            shared.append(channel)
                        in_use[channel] = threading.get_ident()
                    try:
                        result = app.tasks["math.add"].apply_async((n, i), queue="default",
                                                                   producer=producer)
                    finally:
                        with lock:
                            in_use.pop(channel, None)
            except BaseException as exc:
                with lock:
                    errors.append(exc)
                return
            with lock:
                ids.append(result.id)

    threads = [threading.Thread(target=publisher, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    assert shared == []  # the producer pool hands a channel to one thread at a time
    assert len(ids) == THREADS * PER_THREAD  # apply_async returns after the confirm
    wait_until(lambda: all(app.calls.count(job) >= 1 for job in ids), 120,
               "every job to run")
    runs = Counter(call["id"] for call in app.calls.all() if call["id"] in set(ids))
    assert set(runs.values()) == {1}
