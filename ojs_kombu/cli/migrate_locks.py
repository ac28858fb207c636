"""``migrate check``: tasks already wrapped in a lock library (celery-once,
celery-singleton, a hand-made lock decorator).

Such a lock holds across a crash until its own timeout and lives beside the
broker's redeliveries; under ojs_kombu the same guarantees come from the job
itself: ``ojs_unique`` (one job per fingerprint at enqueue) and
``ojs_idempotency_key`` (one run per key), on ``ojs_dedup_url``.
"""

from __future__ import annotations

from typing import Any

#: Lock library module -> (its name, the OJS options that replace it).
LOCK_LIBRARIES: dict[str, tuple[str, str]] = {
    "celery_once": ("celery-once",
                    "ojs_unique={'keys': ['type', 'args'], 'on_conflict': 'reject'} "
                    "('ignore' for once={'graceful': True})"),
    "celery_singleton": ("celery-singleton",
                         "ojs_unique={'keys': ['type', 'args'], 'on_conflict': 'ignore'} "
                         "(the existing job's result, as Singleton returns it)"),
    "redis_lock": ("python-redis-lock", "ojs_idempotency_key (one run per key)"),
    "pottery": ("pottery", "ojs_idempotency_key (one run per key)"),
    "sherlock": ("sherlock", "ojs_idempotency_key (one run per key)"),
}
_LOCK_WORDS = ("lock", "once", "singleton", "mutex")


def lock_hint(task: Any) -> str | None:
    """What replaces the task's lock library, when its base class or a decorator of its
    ``run`` comes from one (``None``: no lock found)."""
    for cls in type(task).__mro__:
        found = _library(cls.__module__)
        if found is not None:
            return _hint(f"base class {cls.__name__} ({found[0]})", found[1])
    wrapper = getattr(task, "run", None)
    while wrapper is not None and hasattr(wrapper, "__wrapped__"):
        # functools.wraps copies the wrapped function's names: the wrapper's own are
        # its code's and its globals'
        code = getattr(wrapper, "__code__", None)
        module = (getattr(wrapper, "__globals__", None) or {}).get("__name__", "")
        name = code.co_qualname if code is not None else type(wrapper).__name__
        found = _library(module)
        if found is not None:
            return _hint(f"decorator {name} ({found[0]})", found[1])
        if any(word in name.lower() for word in _LOCK_WORDS):
            return _hint(f"decorator {module}.{name}",
                         "ojs_unique or ojs_idempotency_key")
        wrapper = wrapper.__wrapped__
    return None


def _library(module: str) -> tuple[str, str] | None:
    return LOCK_LIBRARIES.get(module.partition(".")[0])


def _hint(what: str, instead: str) -> str:
    return (f"wrapped in a lock ({what}): under ojs_kombu use {instead} with "
            "app.conf.ojs_dedup_url; the job carries the guarantee, no lock outlives a "
            "crash (docs: 'Unique jobs and idempotency keys')")
