"""``app.amqp`` under ojs_kombu: the app's OJS binding, its queues, connections and sender.

Every broker connection carries the key of the app's OJS
:class:`~ojs_kombu.amqp.binding.Binding` to the ``ojs`` transport (a string:
Celery reports transport options as JSON).  The task sender is Celery's own,
publishing OJS jobs (:mod:`ojs_kombu.celery.task_sender`).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from functools import partial
from typing import Any

import kombu
from celery.app.amqp import AMQP
from celery.exceptions import WorkerShutdown
from kombu.connection import is_connection
from kombu.pools import ProducerPool
from kombu.utils.functional import ChannelPromise
from kombu.utils.objects import cached_property

from ..amqp.binding import Binding, register_binding
from ..amqp.broker.connection import BrokerConnection as ReconnectingConnection
from ..amqp.broker.entities import declare_job_queues
from ..spec.envelope import RetryPolicy
from ..spec.errors import TopologyPermissionError
from ..spec.settings import BINDING_OPTION, OJSSettings
from .batch import origin_nodename
from .celery_seam import amqp_hooks, producer_pool
from .events import build_events
from .queues import OJSQueues
from .retries import task_retry_policy
from .task_sender import job_task_sender

logger = logging.getLogger(__name__)

#: Stands for a repr a consumer computes (compared by identity, never sent).
_DEFERRED_REPR = "".join(("<deferred", ">"))
#: Where ``create_sent_event`` is among the positional arguments after id and name.
_SENT_EVENT_INDEX = 14
#: ... and where ``origin`` is.
_ORIGIN_INDEX = 21


class TaskProducer(kombu.Producer):
    """kombu's producer for the app's producer pool.

    The pool revives a producer on every acquire, and kombu's ``revive`` binds a
    copy of the producer's exchange to the new channel each time.  A task
    producer's exchange is the nameless default one, which is never declared
    nor published through as an object (the sender names the exchange of every
    publish), so it stays unbound; a named exchange is bound as kombu does.
    """

    def revive(self, channel: Any) -> None:
        if (self.exchange is not None and self.exchange.name) or not is_connection(channel):
            super().revive(channel)
            return
        # kombu declares ``__connection__ = None`` with no other type
        self.__connection__ = channel  # type: ignore[assignment]
        self._channel = ChannelPromise(lambda: channel.default_channel)


@amqp_hooks
class OJSAMQP(AMQP):
    """``app.amqp`` under ojs_kombu."""

    @cached_property
    def binding(self) -> Binding:
        settings = OJSSettings.from_options(self.app.conf, source="Celery config (app.conf)")
        binding = Binding.from_settings(settings, tasks=lambda: self.app.tasks,
                                        retry_policy_for=self._retry_policy_for)
        return replace(binding, events=build_events(self.app, settings, binding.names))

    def _retry_policy_for(self, task_name: str) -> RetryPolicy | None:
        """The policy a job of ``task_name`` states in its envelope, under the app's
        ``ojs_retry_semantics`` (:func:`~ojs_kombu.celery.retries.task_retry_policy`)."""
        task = self.app.tasks.get(task_name)
        if task is None:
            return None
        return task_retry_policy(task, self.binding.settings.retry_semantics)

    @property
    def queues_cls(self) -> Any:
        return partial(OJSQueues, binding=self.binding)

    @cached_property
    def binding_key(self) -> str:
        """The binding's name in transport options, which Celery reports as JSON."""
        return register_binding(self.binding, self.app.main or "celery")

    def Connection(self, *args: Any, transport_options: Any = None, **kwargs: Any
                   ) -> kombu.Connection:
        options = dict(transport_options or {})
        options[BINDING_OPTION] = self.binding_key
        return ReconnectingConnection(*args, **{**kwargs, "transport_options": options})

    BrokerConnection = Connection
    Producer = TaskProducer

    def TaskConsumer(self, channel: Any, queues: Any = None, accept: Any = None,
                     **kw: Any) -> Any:
        """Celery's task consumer, with the topology of all its job queues declared at
        once first (:func:`~ojs_kombu.amqp.broker.entities.declare_job_queues`).  A broker user
        that may not declare it stops the worker: one line, exit status 1 (no retry
        would grant the permission)."""
        queues = queues or list(self.queues.consume_from.values())
        try:
            declare_job_queues(channel, queues)
        except TopologyPermissionError as exc:
            logger.critical("worker cannot start: TopologyPermissionError: %s", exc)
            raise WorkerShutdown(1) from None
        return super().TaskConsumer(channel, queues=queues, accept=accept, **kw)

    @property
    def producer_pool(self) -> ProducerPool:
        if producer_pool(self) is None:
            super().producer_pool.Producer = TaskProducer  # producers are made on demand
        return producer_pool(self)

    publisher_pool = producer_pool  # Celery's alias, read first by some callers

    def wrap_task_sender(self, sender: Any) -> Any:
        """Celery's task sender, publishing OJS jobs (:mod:`ojs_kombu.celery.task_sender`;
        Celery's ``_create_task_sender``, :mod:`.celery_seam`)."""
        return job_task_sender(sender, self.binding, self.app)

    def as_task_v1(self, task_id: str, name: str, *args: Any, **kwargs: Any) -> Any:
        """``task_protocol=1``: the task message is written in protocol 2, which an OJS
        job maps (a protocol-1 message would be dead-lettered as not a job, and a caller
        waiting on its result would wait for ever).  Celery passes the same arguments
        to both writers, and its workers read either protocol."""
        return self.as_task_v2(task_id, name, *args, **kwargs)

    def as_task_v2(self, task_id: str, name: str, *args: Any, **kwargs: Any) -> Any:
        """Celery's task message, without the ``argsrepr``/``kwargsrepr`` it would compute
        and with the process's ``origin`` worked out once.

        A consumer rebuilds them from the envelope's ``args`` and ``kwargs``, so
        they need not travel (nor be computed on every publish); ones the caller
        passes (to hide secrets from logs) travel as given, and so do both when
        the app sends Celery's ``task-sent`` events, which show them.
        """
        sent_event = (args[_SENT_EVENT_INDEX] if len(args) > _SENT_EVENT_INDEX
                      else kwargs.get("create_sent_event"))
        if not sent_event:
            for key in ("argsrepr", "kwargsrepr"):
                if kwargs.get(key) is None:
                    kwargs[key] = _DEFERRED_REPR
        if len(args) <= _ORIGIN_INDEX and not kwargs.get("origin"):
            kwargs["origin"] = origin_nodename()
        message = super().as_task_v2(task_id, name, *args, **kwargs)
        headers = message.headers
        for key in ("argsrepr", "kwargsrepr"):
            if headers.get(key) is _DEFERRED_REPR:
                del headers[key]
        return message
