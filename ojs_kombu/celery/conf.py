"""What ``install()`` sets in ``app.conf`` once the configuration is loaded.

OJS delivery semantics need ``task_acks_late=True`` (ack after success) and
``task_acks_on_failure_or_timeout=False`` (a failed job is nacked into its
dead-letter queue, never acked and lost); the pool reads envelopes, so the
``ojs`` content type joins ``accept_content``.  Pickle stays off: out of
``accept_content`` and ``result_accept_content``, and a ``pickle`` result or
event serializer becomes ``json`` (with a warning each);
:func:`~ojs_kombu.celery.preflight.check_app` refuses an app that sets it again.
An ``ojs_dedup_url`` without the ``redis`` package is refused at once.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery

from ..spec.encode import CELERY_JSON
from ..spec.envelope import CONTENT_TYPE
from .dedup_store import require_redis
from .serialization import SERIALIZER_NAME

logger = logging.getLogger(__name__)


def configure_when_loaded(app: Celery) -> None:
    """Apply the OJS settings when the app's configuration is loaded (now, if it is):
    a configuration the project loads after ``install()`` does not undo them."""
    app.on_after_configure.connect(_configure, sender=app, weak=False)
    if app.configured:
        _configure(app)


def _configure(sender: Celery, **_: Any) -> None:
    """OJS delivery semantics, the ``ojs`` content type, and pickle off (Celery's
    ``on_after_configure`` receiver)."""
    conf = sender.conf
    if conf.broker_heartbeat == 120:  # Celery's default; the binding recommends 60 s (11.1)
        conf.broker_heartbeat = 60
    if conf.beat_scheduler == "celery.beat:PersistentScheduler":
        conf.beat_scheduler = "ojs_kombu.celery.beat:OJSScheduler"
    conf.task_acks_late = True
    conf.task_acks_on_failure_or_timeout = False
    # Per-consumer QoS (the binding's global=false): a Basic.Qos on a live channel does
    # not reach running consumers, so Celery's prefetch reduction after a reconnect only
    # sends one, synchronously, from the thread that acks: with Celery 5.5 and 5.6 a
    # threads-pool thread then reads the socket beside the event loop and the worker
    # can hang.  Celery 5.7 skips the reduction for per-consumer QoS itself.
    conf.worker_enable_prefetch_count_reduction = False
    if conf.get("ojs_dedup_url"):
        require_redis()  # a clear error now, not at the first unique job
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


def pickle_settings(conf: Any) -> list[str]:
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
    for setting in pickle_settings(conf):
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
