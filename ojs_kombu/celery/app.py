"""Celery wiring: everything ``ojs_kombu.install(app)`` changes, in one place.

``install(app)``

* makes the app's AMQP layer an :class:`OJSAMQP`: every task queue becomes an
  OJS :class:`~ojs_kombu.amqp.entities.JobQueue` (configured, default and missing
  ones alike), and every broker connection carries the key of the app's OJS
  :class:`~ojs_kombu.spec.settings.Binding` to the ``ojs`` transport (a string: Celery
  reports transport options as JSON);
* makes Celery mint UUIDv7 task ids, so a task id *is* the OJS job id;
* makes :class:`~ojs_kombu.celery.task.OJSTask` the app's task base, so failed
  attempts are retried by the broker (where ``ojs_retry_semantics`` says they
  are retried: by default only where Celery would retry them);
* sets what OJS delivery semantics need once the configuration is loaded:
  ``task_acks_late=True`` (ack after success), ``task_acks_on_failure_or_timeout=False``
  (a failed job is nacked into its dead-letter queue, never acked and lost),
  and the ``ojs`` content type in ``accept_content`` (the pool reads envelopes);
* keeps pickle off: out of ``accept_content`` and ``result_accept_content``, and a
  ``pickle`` result or event serializer becomes ``json`` (with a warning each);
  :func:`check_app` refuses an app that sets it again;
* makes Celery's send path raise ``NonJSONArgumentError`` for arguments kombu's
  JSON encoder refuses, and hands ``ojs_max_job_bytes`` to the transport;
* adds consumer bootsteps for worker events, the control queues, reconnection
  reports and the dropped jobs of ``drop_oldest`` queues (``backpressure.dropped``);
* adds a worker bootstep that refuses to start a worker whose tasks, queues
  or ``ojs_*`` settings cannot be mapped onto OJS (the same checks are
  :func:`check_app`, for a project's own test suite).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import replace
from functools import partial
from typing import Any

import kombu
from celery import Celery, bootsteps
from celery.app.amqp import AMQP, Queues
from kombu import Queue
from kombu.exceptions import EncodeError
from kombu.utils.objects import cached_property

from ..amqp.binding import Binding, register_binding
from ..amqp.connection import BrokerConnection as ReconnectingConnection
from ..amqp.dead_letters import DeadLetterQueue, open_dead_letter_queue
from ..amqp.entities import JobQueue, extra_arguments, job_queue
from ..amqp.topology import OWNED_ARGUMENTS
from ..spec.encode import CELERY_JSON, MAX_JOB_BYTES_PROPERTY
from ..spec.envelope import CONTENT_TYPE, RetryPolicy
from ..spec.errors import NonJSONArgumentError, OJSConfigurationError
from ..spec.settings import BINDING_OPTION, OJSSettings
from .control import ControlQueues
from .dropped import DroppedJobs
from .events import WorkerEvents, build_events
from .publish import SendSettings
from .reconnect import ConsumerReconnections
from .serialization import SERIALIZER_NAME
from .task import RETRY_SEMANTICS, OJSTask, task_retry_policy, task_sets
from .task_ids import use_uuid7_task_ids

logger = logging.getLogger(__name__)

#: Stands for a repr a consumer computes (compared by identity, never sent).
_DEFERRED_REPR = "".join(("<deferred", ">"))
#: Where ``create_sent_event`` is among the positional arguments after id and name.
_SENT_EVENT_INDEX = 14

_INSTALLED_FLAG = "_ojs_kombu_installed"


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
        super().__init__(queues, *args, **kwargs)
        self._default_consume_from = {queue.name: queue for queue in self.values()}

    def __missing__(self, name: str) -> Queue:
        names = self.binding.names
        amqp_name = names.job_queue(names.ojs_queue(name))
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

    def _add(self, queue: Queue) -> Queue:
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
        raw = dict(queue.queue_arguments or {})
        owned = sorted(k for k in OWNED_ARGUMENTS if k in raw)
        if owned:
            raise OJSConfigurationError(
                f"queue {queue.name!r} sets {', '.join(owned)}: ojs_kombu owns dead-lettering "
                "of job queues (ojs.exchange.dlx, routing key = queue name); remove them"
            )
        arguments = extra_arguments(queue)
        self.binding.add_queue_arguments(ojs_name, arguments)
        return job_queue(self.binding.names, ojs_name, self.binding.declare_arguments(ojs_name))


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
        ``ojs_retry_semantics`` (:func:`~ojs_kombu.celery.task.task_retry_policy`)."""
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


def install(app: Celery) -> Celery:
    """Make ``app`` publish and consume OJS jobs; call it right after creating the app.

    The broker URL selects the transport (``ojs://user:pass@host:5672/vhost``);
    ``install`` wires the rest.  Idempotent.
    """
    if getattr(app, _INSTALLED_FLAG, False):
        return app
    if "amqp" in app.__dict__ and not isinstance(app.__dict__["amqp"], OJSAMQP):
        raise OJSConfigurationError(
            f"ojs_kombu.install({app.main!r}) ran after the app's AMQP layer was created; "
            "call it right after Celery(...), before the app sends or consumes anything"
        )
    app.amqp_cls = OJSAMQP
    if app.task_cls == Celery.task_cls:
        app.task_cls = f"{OJSTask.__module__}:OJSTask"
    use_uuid7_task_ids()
    app.on_after_configure.connect(_configure, sender=app, weak=False)
    if app.configured:
        _configure(app)
    app.steps["worker"].add(OJSPreflight)
    app.steps["consumer"].add(WorkerEvents)
    app.steps["consumer"].add(ControlQueues)
    app.steps["consumer"].add(DroppedJobs)
    app.steps["consumer"].add(ConsumerReconnections)
    app.steps["consumer"].add(InlineJobAcks)
    setattr(app, _INSTALLED_FLAG, True)
    return app


def _configure(sender: Celery, **_: Any) -> None:
    conf = sender.conf
    if conf.broker_heartbeat == 120:  # Celery's default; the binding recommends 60 s (11.1)
        conf.broker_heartbeat = 60
    if conf.beat_scheduler == "celery.beat:PersistentScheduler":
        conf.beat_scheduler = "ojs_kombu.celery.beat:OJSScheduler"
    conf.task_acks_late = True
    conf.task_acks_on_failure_or_timeout = False
    _remove_pickle(conf)
    accept = list(conf.accept_content or [])
    if SERIALIZER_NAME not in accept and CONTENT_TYPE not in accept:
        accept.append(SERIALIZER_NAME)
    conf.accept_content = accept
    if conf.task_serializer not in ("json", CELERY_JSON):
        logger.warning(
            "task_serializer is %r: ojs_kombu publishes JSON only, so tasks sent with it "
            "will raise UnsupportedSerializerError", conf.task_serializer,
        )


#: What Celery's ``accept_content`` names pickle by (serializer name, content type).
PICKLE_NAMES = ("pickle", "application/x-python-serialize")


def _pickle_settings(conf: Any) -> list[str]:
    """The settings of ``conf`` that would make this process unpickle something."""
    found = []
    for setting in ("accept_content", "result_accept_content"):
        value = conf.get(setting)
        names = [value] if isinstance(value, str) else list(value or ())
        if any(name in PICKLE_NAMES for name in names):
            found.append(setting)
    found += [setting for setting in ("result_serializer", "event_serializer")
              if conf.get(setting) in PICKLE_NAMES]
    return found


def _remove_pickle(conf: Any) -> None:
    """Pickle stays off: out of ``accept_content`` (tasks, and Celery's remote control,
    whose mailbox accepts the same list) and ``result_accept_content``; results and
    monitoring events are written as JSON instead (their readers accept JSON)."""
    for setting in _pickle_settings(conf):
        value = conf.get(setting)
        if setting.endswith("_serializer"):
            conf[setting] = "json"
            logger.warning("%s is %r: ojs_kombu never unpickles anything, so it is set to "
                           "'json'; set it to 'json' yourself to silence this warning",
                           setting, value)
            continue
        names = [value] if isinstance(value, str) else list(value)
        conf[setting] = [name for name in names if name not in PICKLE_NAMES] or ["json"]
        logger.warning("%s contains pickle (%r): ojs_kombu never unpickles anything (a "
                       "pickled message runs code), so it was removed; remove it from your "
                       "configuration to silence this warning", setting, value)


def check_app(app: Celery) -> dict[str, str]:
    """Check that ``app`` can run under ojs_kombu; return ``{task name: OJS type}``.

    Raises the :class:`~ojs_kombu.spec.errors.OJSConfigurationError` subclass that
    names the first problem: pickle in ``accept_content``/``result_accept_content``
    or as the result or event serializer (set again after ``install()`` removed
    it), an unknown or invalid ``ojs_*`` setting, a queue that cannot be an OJS
    queue, a task without a valid OJS type, or two tasks claiming one type.
    """
    app.finalize(auto=True)
    insisting = _pickle_settings(app.conf)
    if insisting:
        raise OJSConfigurationError(
            f"{', '.join(insisting)} name(s) pickle: ojs_kombu.install() removes it (a pickled "
            "message runs code in the worker), but it was set again after the app was "
            "configured; remove 'pickle' from accept_content/result_accept_content and use "
            "'json' as result_serializer/event_serializer")
    binding = app.amqp.binding
    queues = app.amqp.queues
    # Bad ojs_queues / argument combinations fail here, before any warning is logged.
    binding.warn_unbounded(q.ojs_queue for q in queues.values() if isinstance(q, JobQueue))
    types = binding.job_types.validate()
    for name, task in app.tasks.items():
        for semantics in RETRY_SEMANTICS:  # raises RetryPolicyError for an invalid ojs_retry
            task_retry_policy(task, semantics)
        _check_acks(name, task)
        if not isinstance(task, OJSTask) and not name.startswith("celery."):
            logger.warning(
                "task %r does not derive from the app's Task (ojs_kombu.OJSTask): its "
                "failures are dead-lettered without OJS retries; derive its base class "
                "from app.Task", name)
    return types


def _check_acks(name: str, task: Any) -> None:
    """Per-task ack options that would ack a job before it succeeded lose it."""
    if getattr(task, "acks_late", True) is False:
        raise OJSConfigurationError(
            f"task {name!r} sets acks_late=False: an OJS job is acked only after it ran "
            "(a failed one is retried or dead-lettered); remove the option")
    for option in ("acks_on_failure_or_timeout", "acks_on_failure", "acks_on_timeout"):
        if getattr(task, option, None) is True and task_sets(task, option):
            raise OJSConfigurationError(
                f"task {name!r} sets {option}=True: a failed OJS job is retried or "
                "dead-lettered, never acked and dropped; remove the option")


class OJSPreflight(bootsteps.Step):
    """Worker bootstep: a worker that cannot speak OJS does not start."""

    name = "ojs_kombu.preflight"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        check_app(parent.app)
        super().__init__(parent, **kwargs)


class InlineJobAcks(bootsteps.StartStopStep):
    """Consumer bootstep: with the ``solo`` pool a job runs inside its delivery, in the
    event loop, so the transport writes the acks it collected before each delivery
    (a finished job's ack never waits for the next job; see :mod:`ojs_kombu.amqp.acks`)."""

    name = "ojs_kombu.inline_job_acks"
    requires = ("celery.worker.consumer.connection:Connection",)

    def start(self, parent: Any) -> None:
        from celery.concurrency.solo import TaskPool as SoloPool

        connection = getattr(parent.connection, "connection", None)
        if hasattr(connection, "ojs_jobs_run_in_loop"):
            connection.ojs_jobs_run_in_loop = isinstance(parent.pool, SoloPool)


def declare_topology(app: Celery, queues: Iterable[str] | None = None) -> list[str]:
    """Eagerly declare the OJS topology of ``queues`` (default: every queue of the app).

    Idempotent; returns the OJS queue names declared.  Raises
    :class:`~ojs_kombu.spec.errors.TopologyConflictError` when the broker holds a
    queue with different arguments.
    """
    table = app.amqp.queues
    selected = [table[name] for name in queues] if queues is not None else list(table.values())
    ojs_names = [q.ojs_queue for q in selected if isinstance(q, JobQueue)]
    with app.connection_for_write() as connection:
        connection.ensure_connection(max_retries=1)
        for name in ojs_names:
            connection.connection.ensure_topology(name)
    return ojs_names


def dead_letter_queue(app: Celery, queue: str) -> AbstractContextManager[DeadLetterQueue]:
    """The dead letters of ``queue``: ``with dead_letter_queue(app, "email") as dlq: ...``.

    ``dlq.list()``, ``dlq.get(job_id)``, ``dlq.replay(job_id)``,
    ``dlq.replay_all()``, ``dlq.purge()``, ``len(dlq)``.
    """
    connection = app.connection_for_write()
    connection.ensure_connection(max_retries=1)
    return open_dead_letter_queue(connection, queue)
