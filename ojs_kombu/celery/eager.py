"""``ojs_eager_encode``: an eager call encoded as its publish would be, then run.

Celery's eager mode (``task_always_eager``, ``Task.apply``) runs the task in the
caller without a message, so nothing checks that the call *could* be published:
an argument OJS refuses (a ``set``, an object kombu's JSON cannot write), an
option it cannot map, a job over ``ojs_max_job_bytes``.  With
``ojs_eager_encode = True`` each eager call is first written into the OJS job its
``apply_async`` would publish, by the encoder every publish uses
(:func:`~ojs_kombu.amqp.publishing.publisher.encode_task`), and the same
:class:`~ojs_kombu.spec.errors.JobEncodeError` subclass is raised.  Nothing is
sent: no broker, no dedup store, no topology.
"""

from __future__ import annotations

from typing import Any

from kombu.exceptions import EncodeError
from kombu.utils.uuid import uuid

from ..amqp.publishing.publisher import encode_task
from ..spec.encode import CELERY_CALL, OutgoingJob
from ..spec.errors import JobEncodeError
from .task_sender import non_json_argument

#: ``apply`` options that are message properties of the publish.
_PROPERTIES = ("priority", "expiration", "delivery_mode")


def eager_encode(app: Any) -> bool:
    """Whether ``app`` asks eager calls to be encoded (``ojs_eager_encode``)."""
    return bool(app.conf.get("ojs_eager_encode"))


def encode_eager_call(task: Any, args: Any, kwargs: Any, task_id: str | None,
                      link: Any, link_error: Any, options: dict[str, Any]) -> OutgoingJob:
    """The OJS job ``task.apply_async(args, kwargs, **options)`` would publish."""
    app = task.app
    options = {key: value for key, value in options.items() if value is not None}
    routed = app.amqp.router.route(options, task.name, args, kwargs, type(task))
    queue = routed.get("queue")
    exchange = routed.get("exchange") or getattr(queue, "exchange", None)
    routing_key = routed.get("routing_key") or getattr(queue, "routing_key", None) or ""
    message = app.amqp.create_task_message(
        task_id or uuid(), task.name, args, kwargs,
        routed.pop("countdown", None), routed.pop("eta", None),
        expires=routed.pop("expires", None),
        callbacks=_as_list(link), errbacks=_as_list(link_error),
        time_limit=routed.pop("time_limit", None),
        soft_time_limit=routed.pop("soft_time_limit", None),
        ignore_result=routed.pop("ignore_result", False),
        **{key: routed[key] for key in ("group_id", "group_index", "chord", "root_id",
                                        "parent_id", "shadow", "chain", "retries")
           if key in routed})
    properties = dict(message.properties)
    properties.update({key: routed[key] for key in _PROPERTIES if key in routed})
    try:
        return encode_task(app.amqp.binding, message.body, CELERY_CALL, properties,
                           message.headers, getattr(exchange, "name", exchange) or "",
                           routing_key)
    except EncodeError as exc:
        if isinstance(exc, JobEncodeError):
            raise
        raise non_json_argument(task.name, exc, message.headers.get("id")) from exc


def _as_list(value: Any) -> list[Any] | None:
    if value is None:
        return None
    return list(value) if isinstance(value, (list, tuple)) else [value]
