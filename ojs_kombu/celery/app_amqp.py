"""``app.amqp`` under ojs_kombu: the app's OJS binding, its queues, connections and sender.

Every broker connection carries the key of the app's OJS
:class:`~ojs_kombu.amqp.binding.Binding` to the ``ojs`` transport (a string:
Celery reports transport options as JSON); the task sender raises
``NonJSONArgumentError`` for arguments kombu's JSON encoder refuses and hands
``ojs_max_job_bytes`` to the transport.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

import kombu
from celery.app.amqp import AMQP
from kombu.exceptions import EncodeError
from kombu.utils.objects import cached_property

from ..amqp.binding import Binding, register_binding
from ..amqp.connection import BrokerConnection as ReconnectingConnection
from ..spec.encode import CELERY_JSON, MAX_JOB_BYTES_PROPERTY
from ..spec.envelope import RetryPolicy
from ..spec.errors import NonJSONArgumentError
from ..spec.settings import BINDING_OPTION, OJSSettings
from ..spec.unique import IDEMPOTENCY_OPTION, UNIQUE_OPTION
from .dedup_store import store_for
from .events import build_events
from .publish import SendSettings
from .queues import OJSQueues
from .retries import task_retry_policy

#: Stands for a repr a consumer computes (compared by identity, never sent).
_DEFERRED_REPR = "".join(("<deferred", ">"))
#: Where ``create_sent_event`` is among the positional arguments after id and name.
_SENT_EVENT_INDEX = 14


class OJSAMQP(AMQP):
    """``app.amqp`` under ojs_kombu."""

    @cached_property
    def binding(self) -> Binding:
        settings = OJSSettings.from_options(self.app.conf, source="Celery config (app.conf)")
        binding = Binding.from_settings(settings, tasks=lambda: self.app.tasks,
                                        retry_policy_for=self._retry_policy_for)
        return replace(binding, events=build_events(self.app, settings, binding.names))

    @cached_property
    def ojs_send_settings(self) -> SendSettings:
        """Read once, as Celery's task sender reads the same settings once."""
        return SendSettings.from_conf(self.app.conf)

    def _retry_policy_for(self, task_name: str) -> RetryPolicy | None:
        """The policy a job of ``task_name`` states in its envelope, under the app's
        ``ojs_retry_semantics`` (:func:`~ojs_kombu.celery.retries.task_retry_policy`)."""
        task = self.app.tasks.get(task_name)
        if task is None:
            return None
        return task_retry_policy(task, self.binding.settings.retry_semantics)

    @property
    def queues_cls(self) -> Any:  # type: ignore[override]
        return partial(OJSQueues, binding=self.binding)

    @cached_property
    def binding_key(self) -> str:
        """The binding's name in transport options, which Celery reports as JSON."""
        return register_binding(self.binding, self.app.main or "celery")

    def Connection(self, *args: Any, transport_options: Any = None, **kwargs: Any
                   ) -> kombu.Connection:
        options = dict(transport_options or {})
        options[BINDING_OPTION] = self.binding_key
        return ReconnectingConnection(*args, transport_options=options, **kwargs)

    BrokerConnection = Connection

    def _create_task_sender(self) -> Any:
        """Celery's task sender, without kombu's per-publish declare of the queue.

        The ``ojs`` transport declares a job queue's whole OJS topology on the
        first publish to it (once per connection) and again after a return, so
        kombu's ``maybe_declare`` of the queue object on every ``apply_async``
        only repeated that check, through a fresh retry wrapper each time.  An
        explicit ``declare=[...]`` option is still honoured.
        """
        send = super()._create_task_sender()
        conf = self.app.conf
        max_job_bytes = self.binding.settings.max_job_bytes

        def send_task_message(producer: Any, name: str, message: Any, *,
                              declare: Any = None, **options: Any) -> Any:
            # The transport reads the size bound from the message's properties.
            options[MAX_JOB_BYTES_PROPERTY] = max_job_bytes
            if options.get(UNIQUE_OPTION) or options.get(IDEMPOTENCY_OPTION):
                store_for(self.binding.settings)  # DedupNotConfigured without ojs_dedup_url
            try:
                return send(producer, name, message,
                            declare=[] if declare is None else declare, **options)
            except EncodeError as exc:
                serializer = options.get("serializer") or conf.task_serializer
                if serializer not in ("json", CELERY_JSON):
                    raise
                headers = getattr(message, "headers", None) or {}
                raise NonJSONArgumentError(
                    f"task {name!r}: an argument is not a JSON-native value ({exc}); OJS "
                    "args/kwargs carry only strings, numbers, booleans, null, arrays and "
                    "objects", job_id=headers.get("id"),
                ) from exc

        return send_task_message

    def as_task_v2(self, task_id: str, name: str, *args: Any, **kwargs: Any) -> Any:
        """Celery's task message, without the ``argsrepr``/``kwargsrepr`` it would compute.

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
        message = super().as_task_v2(task_id, name, *args, **kwargs)
        headers = message.headers
        for key in ("argsrepr", "kwargsrepr"):
            if headers.get(key) is _DEFERRED_REPR:
                del headers[key]
        return message
