"""``celery beat`` under ojs_kombu: ``cron.triggered`` and ``cron.skipped`` events.

``install()`` makes :class:`OJSScheduler` the app's ``beat_scheduler`` (unless
another one is configured).  With ``ojs_beat_skip_overlapping = True`` an entry
whose previous job has not finished (according to the result backend) is not
sent again: the schedule moves on and ``cron.skipped`` says why.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from celery.beat import PersistentScheduler
from celery.schedules import crontab, schedule

logger = logging.getLogger(__name__)


def cron_expression(entry_schedule: Any) -> str:
    """A schedule as text: ``"*/5 * * * *"`` for a crontab, ``"every 10s"`` for an interval."""
    if isinstance(entry_schedule, crontab):
        return " ".join(str(getattr(entry_schedule, f"_orig_{field}")) for field in (
            "minute", "hour", "day_of_month", "month_of_year", "day_of_week"))
    if isinstance(entry_schedule, schedule):
        run_every = entry_schedule.run_every
        seconds = run_every.total_seconds() if isinstance(run_every, timedelta) else run_every
        return f"every {seconds:g}s"
    return str(entry_schedule)


class OJSScheduler(PersistentScheduler):
    """Celery's persistent scheduler, reporting each due entry as an OJS cron event."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._ojs_last: dict[str, str] = {}
        super().__init__(*args, **kwargs)

    def apply_async(self, entry: Any, producer: Any = None, advance: bool = True,
                    **kwargs: Any) -> Any:
        binding = self.app.amqp.binding
        job_type = binding.job_types.type_for(entry.task)
        cron = {"cron_name": entry.name, "cron_expr": cron_expression(entry.schedule),
                "job_type": job_type}
        previous = self._ojs_last.get(entry.name)
        skip_overlapping = binding.settings.beat_skip_overlapping
        if previous and skip_overlapping and self._running(previous):
            if advance:
                self.reserve(entry)
            binding.hook.cron_skipped(entry.name, {
                **cron, "reason": "the previous job of this entry has not finished",
                "existing_job_id": previous})
            logger.info("Scheduler: skipped %s: job %s still running", entry.name, previous)
            return None
        result = super().apply_async(entry, producer, advance, **kwargs)
        if result is not None:
            self._ojs_last[entry.name] = result.id
            binding.hook.cron_triggered(entry.name, {**cron, "job_id": result.id,
                                                     "scheduled_at": datetime.now(UTC)})
        return result

    def _running(self, job_id: str) -> bool:
        try:
            return not self.app.AsyncResult(job_id).ready()
        except NotImplementedError:  # no result backend: nothing to tell
            return False
