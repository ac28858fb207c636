"""Celery's queue table under ojs_kombu: every task queue is an OJS job queue.

Configured, default and missing queues alike become
:class:`~ojs_kombu.amqp.broker.entities.JobQueue` objects (``email`` ->
``ojs.queue.email``), and their extra arguments join the app's
:class:`~ojs_kombu.amqp.binding.Binding`, which declares them on the broker.
"""

from __future__ import annotations

import inspect
from typing import Any

from celery.app.amqp import Queues
from kombu import Queue

from ..amqp.binding import Binding
from ..amqp.broker.entities import JobQueue, extra_arguments, job_queue
from ..amqp.broker.topology import OWNED_ARGUMENTS
from ..spec.errors import OJSConfigurationError
from .celery_seam import queues_hooks, set_default_consume_from

#: Celery's ``Queues.__init__`` parameters, whose order differs between Celery versions.
_QUEUES_SIGNATURE = inspect.signature(Queues.__init__)


@queues_hooks
class OJSQueues(Queues):
    """Celery's queue table, holding OJS job queues only.

    Keyed by the names the app gives its queues (``celery``, ``email``), as in
    Celery (whose commands, such as ``celery purge``, pass the keys on); the
    values are job queues (``ojs.queue.email``).  Lookups also accept the OJS
    name (``default``) and the AMQP name.  ``consume_from`` is keyed by AMQP
    name, as Celery's ``select`` and ``deselect`` (``worker -Q/-X``) key it.
    """

    def __init__(self, queues: Any = None, *args: Any, binding: Binding, **kwargs: Any) -> None:
        self.binding = binding
        # task_queue_max_priority is the binding's max_priority (OJSSettings.from_options),
        # which skips quorum queues: Celery would add it to every queue's arguments.
        # Celery 5.5 and 5.6 pass it by position, 5.7 by name.
        bound = _QUEUES_SIGNATURE.bind(self, queues, *args, **kwargs)
        bound.arguments["max_priority"] = None
        super().__init__(*bound.args[1:], **bound.kwargs)
        set_default_consume_from(self, {queue.name: queue for queue in self.values()})

    def __missing__(self, name: str) -> Queue:
        names = self.binding.names
        amqp_name = names.job_queue(names.ojs_queue(name))
        queue: Queue
        for queue in dict.values(self):
            if queue.name == amqp_name:
                return queue
        if not self.create_missing:
            raise KeyError(name)
        self[name] = queue = self.new_missing(name)
        return queue

    def new_missing(self, name: str) -> JobQueue:
        ojs_name = self.binding.names.ojs_queue(name)
        return job_queue(self.binding.names, ojs_name, self.binding.declare_arguments(ojs_name))

    def add_queue(self, queue: Queue) -> Queue:
        """Celery's ``Queues._add`` (:mod:`.celery_seam`): every queue becomes a job queue."""
        self[queue.name] = job = self._as_job_queue(queue)
        return job

    def __setitem__(self, name: str, queue: Queue) -> None:
        super().__setitem__(name, queue)
        if isinstance(queue, JobQueue):
            self.binding.add_queue_arguments(queue.ojs_queue, extra_arguments(queue))

    def _as_job_queue(self, queue: Queue) -> JobQueue:
        if isinstance(queue, JobQueue):
            return queue
        if not queue.durable or queue.auto_delete or queue.exclusive:
            raise OJSConfigurationError(
                f"queue {queue.name!r}: OJS job queues are durable, not exclusive and not "
                "auto-delete (AMQP-003); drop durable=False/auto_delete/exclusive"
            )
        ojs_name = self.binding.names.ojs_queue(queue.name)
        # kombu sets queue_arguments from Queue.attrs at run time; its hints omit it
        raw = dict(getattr(queue, "queue_arguments", None) or {})
        owned = sorted(k for k in OWNED_ARGUMENTS if k in raw)
        if owned:
            raise OJSConfigurationError(
                f"queue {queue.name!r} sets {', '.join(owned)}: ojs_kombu owns dead-lettering "
                "of job queues (ojs.exchange.dlx, routing key = queue name); remove them"
            )
        arguments = extra_arguments(queue)
        self.binding.add_queue_arguments(ojs_name, arguments)
        return job_queue(self.binding.names, ojs_name, self.binding.declare_arguments(ojs_name))
