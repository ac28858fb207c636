"""Celery's task sender under ojs_kombu: the one way a task message becomes an OJS job.

``apply_async``, ``send_task``, canvas, ``Task.retry`` with new arguments and
beat all publish through Celery's ``send_task_message``: its
``before_task_publish``/``after_task_publish`` signals (tracing instrumentation
connects them), ``task-sent`` events and publish retry policy are Celery's.
On an ``ojs`` connection the producer it publishes through is a
:class:`JobProducer`: when Celery publishes a task message (after
``before_task_publish``, before any connection is used) it writes the OJS job
from Celery's ``(args, kwargs, embed)`` and headers as they are, in one JSON
encoding (:func:`ojs_kombu.amqp.publishing.publisher.encode_task`, which raises the
``JobEncodeError`` family), and publishes it on the producer's channel
(:meth:`ojs_kombu.amqp.channel.Channel.publish_job`, confirmed) under the
call's retry policy, through ``Connection.ensure`` as kombu's
``Producer.publish`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Celery
from kombu import Producer
from kombu.exceptions import EncodeError

from ..amqp.binding import Binding
from ..amqp.broker.entities import JobQueue
from ..amqp.job_channel import JobChannel
from ..amqp.publishing.publisher import encode_task
from ..amqp.transport import Transport
from ..spec.encode import CELERY_CALL, CELERY_JSON
from ..spec.errors import NonJSONArgumentError
from ..spec.unique import IDEMPOTENCY_OPTION, UNIQUE_OPTION
from .celery_seam import clear_chord_done_marker
from .dedup_store import store_for
from .scheduled import forget_scheduled, record_scheduled, scheduled_at_of, wants_record

#: Celery's ``send_task_message(producer, name, message, **options)``.
SendTaskMessage = Callable[..., Any]
_JSON = ("json", CELERY_JSON)


class JobProducer:
    """kombu's producer as Celery's task sender sees it on an ``ojs`` connection.

    A JSON task message (no compression) is published as its OJS job; every
    other publish (``task-sent`` events, other serializers) and every other
    attribute is the producer's own.
    """

    __slots__ = ("binding", "producer")

    def __init__(self, producer: Producer, binding: Binding) -> None:
        self.producer = producer
        self.binding = binding

    def __getattr__(self, name: str) -> Any:
        return getattr(self.producer, name)

    def publish(self, body: Any, *, headers: dict[str, Any] | None = None,
                serializer: str | None = None, compression: str | None = None,
                exchange: Any = None, routing_key: str | None = None, retry: bool = False,
                retry_policy: dict[str, Any] | None = None, declare: Any = None,
                timeout: float | None = None, confirm_timeout: float | None = None,
                **properties: Any) -> Any:
        if not headers or "task" not in headers or serializer not in _JSON or compression:
            return self.producer.publish(
                body, headers=headers, serializer=serializer, compression=compression,
                exchange=exchange, routing_key=routing_key, retry=retry,
                retry_policy=retry_policy, declare=declare, timeout=timeout,
                confirm_timeout=confirm_timeout, **properties)
        job = encode_task(self.binding, body, CELERY_CALL, properties, headers,
                          getattr(exchange, "name", exchange) or "", routing_key or "")
        producer = self.producer

        # The job's own queue is left out: the transport declares its whole OJS
        # topology on the first publish (and again after a return), so kombu's
        # maybe_declare of it on every publish would only repeat that check.
        entities = [entity for entity in declare or ()
                    if not (isinstance(entity, JobQueue) and entity.ojs_queue == job.queue)]

        def publish_job() -> None:
            channel: JobChannel = producer.channel  # a new one after a reconnection
            for entity in entities:
                producer.maybe_declare(entity)
            channel.publish_job(job, timeout=timeout, confirm_timeout=confirm_timeout)

        if retry:  # as kombu's Producer.publish: the policy also bounds the reconnects
            connection = producer.connection
            connection.transport_options.update(retry_policy or {})
            connection.ensure(producer, publish_job, **(retry_policy or {}))()
        else:
            publish_job()


def job_task_sender(send: SendTaskMessage, binding: Binding, app: Celery) -> SendTaskMessage:
    """Celery's ``send`` publishing through a :class:`JobProducer` on ``ojs`` connections,
    recording a delayed job as scheduled (``PENDING`` with its ``scheduled_at``) in the
    result backend first (:mod:`ojs_kombu.celery.scheduled`).

    ``declare`` is Celery's (the task's queue, as for any app), so the publish
    signals and the tracing that reads them see what a plain Celery app shows
    (``messaging.destination_kind``: ``queue``); the producer leaves the job's
    own queue to the transport (:class:`JobProducer`).  On another transport
    nothing is declared.
    """
    default_serializer = app.conf.task_serializer

    def send_task_message(producer: Any, name: str, message: Any, **options: Any) -> Any:
        if isinstance(producer.connection.transport, Transport):
            producer = JobProducer(producer, binding)
        elif options.get("declare") is None:
            # Another transport (Flower's own amqp:// connection) cannot declare a job
            # queue (JobQueue.declare refuses): the message goes out undeclared, as a
            # plain Celery message the OJS worker dead-letters.
            options["declare"] = []
        if options.get(UNIQUE_OPTION) or options.get(IDEMPOTENCY_OPTION):
            store_for(binding.settings)  # DedupNotConfigured without ojs_dedup_url
        headers = getattr(message, "headers", None) or {}
        if headers.get("group_index") == 0 and headers.get("group") and _chord_header(message):
            clear_chord_done_marker(app.backend, headers["group"])
        recorded = _record_if_scheduled(app, headers)
        try:
            return send(producer, name, message, **options)
        except BaseException as exc:
            if recorded:
                forget_scheduled(app, [recorded])
            if isinstance(exc, EncodeError) and \
                    (options.get("serializer") or default_serializer) in _JSON:
                # Celery's JSON of a message another transport would take
                raise non_json_argument(name, exc, headers.get("id")) from exc
            raise

    return send_task_message


def non_json_argument(name: str, exc: EncodeError, job_id: str | None) -> NonJSONArgumentError:
    """What a publish raises for kombu's JSON ``EncodeError`` of a task's arguments."""
    return NonJSONArgumentError(
        f"task {name!r}: an argument is not a JSON-native value ({exc}); OJS "
        "args/kwargs carry only strings, numbers, booleans, null, arrays and "
        "objects", job_id=job_id)


def _chord_header(message: Any) -> bool:
    """Whether ``message`` is a header task of a chord (its body names the chord's body)."""
    body = getattr(message, "body", None)
    return isinstance(body, tuple) and len(body) == 3 and isinstance(body[2], dict) \
        and body[2].get("chord") is not None


def _record_if_scheduled(app: Celery, headers: dict[str, Any]) -> str | None:
    """The id of the job recorded as scheduled before its publish, if it is one."""
    scheduled_at = scheduled_at_of(headers)
    job_id = headers.get("id")
    if scheduled_at is None or not isinstance(job_id, str) \
            or not wants_record(app, headers.get("ignore_result")):
        return None
    return job_id if record_scheduled(app, job_id, scheduled_at) else None
