"""``apply_async`` of a plain call, straight onto the OJS channel.

Celery sends a task through ``Celery.send_task``, ``AMQP.send_task_message``
and kombu's ``Producer.publish``: protocol v2 headers, a JSON body, a producer
from the pool (revived on every acquire), a retry wrapper; the ``ojs``
transport then parses that body again to build the OJS job.  A call that
needs nothing only that path does gets the same OJS job from
:class:`~ojs_kombu.celery.batch.JobEncoder` (the batch's encoder) and goes to
:meth:`ojs_kombu.amqp.channel.Channel.publish_job` on a channel of the app's
broker connections, under Celery's publish retry policy: the same message,
confirm, events, metrics and errors, for about a third less CPU per call.

A call goes through Celery's own path, unchanged, when any of
:func:`direct_refusal`'s conditions holds: eager mode, ``task-sent`` events,
receivers of ``before_task_publish``/``after_task_publish`` (tracing
instrumentation connects them), options outside the batch's set (callbacks,
canvas, ``headers``, ``exchange``/``routing_key``, ``producer``, ``shadow``,
``retry_policy`` ...), a ``task_routes`` function (a mapping is fine), a
custom ``shadow_name`` or pydantic arguments, a
non-JSON serializer or compression, a parent task (the call runs inside a
worker), or arguments that only kombu's JSON encoder can write.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from celery import Celery
from celery.app.routes import MapRoute
from celery.app.task import Task
from celery.backends.base import BaseBackend
from celery.result import AsyncResult
from celery.signals import after_task_publish, before_task_publish

from ..amqp.job_channel import JobChannel
from ..amqp.transport import Transport
from ..spec.errors import NonJSONArgumentError
from ..spec.naming import is_job_id
from .batch import JobEncoder, unsupported_options

try:  # Celery >= 5.6: set while a worker publishes a finished task's callbacks
    from celery.app.amqp import _callback_publish_retry
except ImportError:  # pragma: no cover
    _callback_publish_retry = None


@dataclass(frozen=True)
class SendSettings:
    """What Celery's task sender reads from the configuration once, when it is built
    (``AMQP._create_task_sender``), read as once for the direct path."""

    #: Why no call can be direct (``None``: calls can be).
    refusal: str | None
    retry: bool
    retry_policy: dict[str, Any]

    @classmethod
    def from_conf(cls, conf: Any) -> SendSettings:
        refusal = None
        if conf.task_protocol != 2:
            refusal = f"task_protocol {conf.task_protocol}"
        elif conf.task_compression:
            refusal = f"task_compression {conf.task_compression!r}"
        return cls(refusal, bool(conf.task_publish_retry),
                   dict(conf.task_publish_retry_policy or {}))


class _NothingToRevive:
    """``Connection.ensure`` revives its object on the new channel; ``publish`` reads
    the connection's channel itself."""

    def revive(self, channel: Any) -> None:
        pass


_NOTHING_TO_REVIVE = _NothingToRevive()


def direct_refusal(task: Task, app: Celery, task_id: Any, options: Mapping[str, Any]
                   ) -> str | None:
    """Why this ``apply_async`` call must go through Celery's send path (``None``: it
    need not).  ``options`` are the call's own, without ``task_id``."""
    conf = app.conf
    if conf.task_always_eager:
        return "task_always_eager"
    if conf.task_send_sent_event:
        return "task_send_sent_event"
    if before_task_publish.receivers or after_task_publish.receivers:
        return "before/after_task_publish receivers"
    sender = getattr(app.amqp, "ojs_send_settings", None)
    if sender is None:
        return "the app is not installed (ojs_kombu.install)"
    if sender.refusal:
        return sender.refusal
    unknown = unsupported_options(options)
    if unknown:
        return f"option(s) {', '.join(unknown)}"
    unknown = unsupported_options(task._get_exec_options())
    if unknown:
        return f"task option(s) {', '.join(unknown)}"
    if task_id is not None and not (isinstance(task_id, str) and is_job_id(task_id)):
        return "task_id is not a UUIDv7"  # Celery's path raises the precise error
    if any(not isinstance(route, MapRoute) for route in app.amqp.router.routes):
        return "a task_routes function (it may read every option of the call)"
    if getattr(task.shadow_name, "__func__", None) is not Task.shadow_name:
        return "shadow_name"
    if getattr(task, "_dump_pydantic_arguments", None) is not None:
        return "pydantic arguments"
    if _callback_publish_retry is not None and _callback_publish_retry.get():
        return "a worker publishing callbacks"
    if app.current_worker_task is not None:
        return "called from a running task (parent and root ids, trail)"
    return None


def apply_async_direct(task: Task, args: Any, kwargs: Any, task_id: str | None,
                       options: dict[str, Any]) -> AsyncResult | None:
    """Publish the call as Celery would; ``None`` when it must take Celery's path after all
    (an argument only kombu's encoder can write, a broker transport other than ``ojs``,
    a result backend that declares reply queues)."""
    app = task._get_app()
    # The pool Celery's producers take their connections from (acquiring one does not
    # connect); its default channel is the one a producer of that connection would
    # publish on.  Its transport is checked first, so a broker that is not ``ojs``
    # costs no encoding.
    connection = app.pool.acquire(block=True)
    try:
        if not isinstance(connection.transport, Transport):
            return None
        encoder = JobEncoder(app)
        if task_id is not None:
            options = {**options, "task_id": task_id}
        try:
            job = encoder.encode_call(task.name, args, kwargs, options)
        except NonJSONArgumentError:
            return None
        wants_result = encoder.wants_result[0]
        if wants_result and type(task.backend).on_task_call is not BaseBackend.on_task_call:
            return None  # it declares what replies need (the rpc backend) through a producer
        sender = app.amqp.ojs_send_settings

        def publish() -> None:  # reads the channel anew after a reconnection
            channel: JobChannel = connection.default_channel
            channel.publish_job(job)

        with connection._reraise_as_library_errors():
            if sender.retry:
                # As kombu's Producer.publish: the policy also bounds the reconnects
                # of ``default_channel``.
                connection.transport_options.update(sender.retry_policy)
                connection.ensure(_NOTHING_TO_REVIVE, publish, **sender.retry_policy)()
            else:
                publish()
    finally:
        connection.release()
    result = task.AsyncResult(job.job_id)
    result.ignored = not wants_result
    return result
