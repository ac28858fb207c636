"""Celery task name <-> OJS job ``type``.

Resolution order, publish side (task name -> type):

1. ``app.conf.ojs_job_types[task_name]`` (explicit mapping in config);
2. the task's own ``ojs_type`` option (``@app.task(ojs_type="email.send")``);
3. the task name itself, when it already fits the OJS type grammar
   (``proj.tasks.send_email`` is a valid type; ``proj.tasks.SendEmail`` is not).

Consume side (type -> task name) is the reverse of 1 and 2, then the type
itself when a task of that name is registered.  A type nobody handles
resolves to ``None`` and the job is dead-lettered as ``UNKNOWN_JOB_TYPE``, as is
a job from another producer (no ``x_celery``) whose type is one of Celery's
built-in tasks (``celery.group`` ...) that ``ojs_job_types`` does not map
(:meth:`JobTypeRegistry.maps_explicitly`; see :func:`ojs_kombu.spec.decode.decode_job_message`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .errors import JobTypeError, OJSConfigurationError
from .naming import JOB_TYPE_MAX, is_job_type

TaskLookup = Callable[[], Mapping[str, Any]]


def _check_type(task_name: str, job_type: Any, source: str) -> str:
    if not isinstance(job_type, str) or not is_job_type(job_type):
        raise JobTypeError(
            task_name,
            f"{source} {job_type!r} is not an OJS type (dot-separated segments of "
            f"[a-z][a-z0-9_]*, at most {JOB_TYPE_MAX} characters)",
        )
    return job_type


class JobTypeRegistry:
    """Maps task names to OJS types and back; pure, no Celery import."""

    def __init__(
        self, explicit: Mapping[str, str] | None = None, tasks: TaskLookup | None = None
    ) -> None:
        self._explicit = dict(explicit or {})
        self._tasks = tasks
        self._reverse: dict[str, str] | None = None
        self._reverse_size = -1
        self._types: dict[str, str] = {}
        self._task_names: dict[str, str] = {}

    def type_for(self, task_name: str) -> str:
        """OJS type of ``task_name``; raises :class:`JobTypeError` when it has none."""
        job_type = self._types.get(task_name)
        if job_type is None:
            job_type = self._types[task_name] = self._resolve_type(task_name)
        return job_type

    def _resolve_type(self, task_name: str) -> str:
        job_type = self._explicit.get(task_name)
        if job_type is not None:
            return _check_type(task_name, job_type, "ojs_job_types maps it to")
        task = self._task_map().get(task_name)
        option = getattr(task, "ojs_type", None) if task is not None else None
        if option is not None:
            return _check_type(task_name, option, "its ojs_type option")
        if is_job_type(task_name):
            return task_name
        raise JobTypeError(task_name, "the name does not fit the OJS type grammar")

    def task_for(self, job_type: str) -> str | None:
        """Celery task that handles ``job_type``; ``None`` when no registered task does.

        A type once resolved stays resolved (the worker asks for every job it
        consumes, and Celery's task registry costs a lock per look-up); a type
        nobody handles is looked up again each time, so a task registered later
        is found.
        """
        task_name = self._task_names.get(job_type)
        if task_name is not None:
            return task_name
        reverse = self._reverse_map()
        if job_type in reverse:
            task_name = reverse[job_type]
        elif self._tasks is None or job_type in self._task_map():
            task_name = job_type
        if task_name is not None:
            self._task_names[job_type] = task_name
        return task_name

    def maps_explicitly(self, task_name: str, job_type: str) -> bool:
        """Whether ``ojs_job_types`` maps ``task_name`` onto ``job_type`` (what lets a
        job from another producer run one of Celery's built-in tasks)."""
        return self._explicit.get(task_name) == job_type

    def validate(self) -> dict[str, str]:
        """Check every registered task now; return ``{task_name: type}``.

        Raises :class:`JobTypeError` for a task without a valid type and
        :class:`OJSConfigurationError` when two tasks claim one type (a
        consumed job must resolve to exactly one task).
        """
        mapping = {name: self.type_for(name) for name in self._task_map()}
        claimed: dict[str, str] = {}
        for task_name, job_type in mapping.items():
            other = claimed.setdefault(job_type, task_name)
            if other != task_name:
                raise OJSConfigurationError(
                    f"OJS type {job_type!r} is claimed by tasks {other!r} and {task_name!r}; "
                    "a consumed job must map to exactly one task"
                )
        return mapping

    def _task_map(self) -> Mapping[str, Any]:
        return self._tasks() if self._tasks is not None else {}

    def _reverse_map(self) -> dict[str, str]:
        """Types that differ from their task name; rebuilt when tasks are added."""
        tasks = self._task_map()
        if self._reverse is None or len(tasks) != self._reverse_size:
            reverse = {t: n for n, t in self._explicit.items() if t != n}
            for name, task in tasks.items():
                option = getattr(task, "ojs_type", None)
                if option is not None and name not in self._explicit and option != name:
                    reverse.setdefault(option, name)
            self._reverse, self._reverse_size = reverse, len(tasks)
        return self._reverse
