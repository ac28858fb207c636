"""A side of the parts whose worker is a subprocess (green drains, dedup drain).

Plain Celery on a queue of its own, or ojs_kombu under a prefix of its own
(``prefix`` not ``None``): its publishing app, the broker names its jobs use,
the fill of its queue before a drain, and the cleanup of everything it and
its workers declared.  The parts build the app (``green_app``, ``dedup_app``)
and name the task; the worker subprocess imports the same app module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from admin import delete_swept
from celery import Celery

import ojs_kombu

#: Jobs per ``enqueue_many`` call when filling an ojs_kombu side's queue.
FILL_BATCH = 1000


class Admin(Protocol):
    """The part of ``admin.Broker`` the worker-subprocess parts use."""

    vhost: str

    def depth(self, queue: str) -> int | None: ...

    def purge(self, queue: str) -> None: ...

    def delete(self, queues: list[str], exchanges: list[str]) -> None: ...


class WorkerSide:
    """A side's publishing app and the broker names its jobs and worker use."""

    def __init__(self, key: str, app: Celery, task_name: str, queue: str,
                 prefix: str | None) -> None:
        self.key, self.app, self.queue, self.prefix = key, app, queue, prefix
        self.task = app.tasks[task_name]
        self.amqp_queue = app.amqp.binding.names.job_queue(queue) if prefix else queue

    def declare(self) -> None:
        if self.prefix:
            ojs_kombu.declare_topology(self.app, [self.queue])
            return
        with self.app.connection_for_write() as connection:
            self.app.amqp.queues[self.queue](connection.default_channel).declare()

    def fill(self, n: int, signature: Callable[[int], Any] | None = None) -> None:
        """``n`` jobs into the empty queue: ojs_kombu in confirmed batches (each job
        ``signature(i)``, default ``task.s(i)``), plain Celery with one ``apply_async``
        each (no confirms: the fastest way it has)."""
        if self.prefix:
            make = signature or self.task.s
            for done in range(0, n, FILL_BATCH):
                ojs_kombu.enqueue_many(self.app, [make(i) for i in
                                                  range(done, min(done + FILL_BATCH, n))])
            return
        with self.app.producer_or_acquire() as producer:
            for i in range(n):
                self.task.apply_async((i,), producer=producer)

    def cleanup(self, broker: Admin) -> None:
        """Delete what the side and its workers declared (OJS: everything under its prefix)."""
        self.app.close()
        if not self.prefix:
            broker.delete([self.queue], [self.queue])
            return
        prefix = f"{self.prefix}."
        delete_swept(broker, broker.vhost, [self.amqp_queue], [],
                     lambda name: name.startswith(prefix))
