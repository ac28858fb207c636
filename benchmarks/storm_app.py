"""Celery app of the poison storm, for ``python -m celery -A storm_app worker``.

``poison_storm.py`` builds the same app in the benchmark process (to declare
queues and to ``ping`` the worker) and starts the worker subprocess with the
``BENCH_STORM_*`` environment variables read at the bottom.  Both sides
register one no-op task on the storm queue; every message of the storm is
poison (a type or task no worker handles, or not a job at all), so the task
never runs.  Remote control stays on, with an exchange named after the side,
so the run can ``ping`` the worker during the storm and delete what the
worker declared afterwards.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from kombu import Exchange, Queue
from sides import celery_app

TASK_NAME = "storm.noop"  # fits the OJS job type grammar


def plain_dead_letter_names(queue: str) -> tuple[str, str]:
    """The dead-letter exchange and queue the plain side's queue dead-letters into."""
    return f"{queue}.dlx", f"{queue}.dlq"


def make_app(broker: str, queue: str, control_exchange: str, *, ojs_prefix: str | None = None,
             set_as_current: bool = False) -> Celery:
    """Plain Celery (dead-lettering queue, the acks that keep failures) or, with
    ``ojs_prefix``, the README's ``ojs://`` + ``ojs_kombu.install(app)``."""
    app = celery_app("bench_storm", broker, ojs_prefix=ojs_prefix,
                     set_as_current=set_as_current)
    if ojs_prefix is None:
        dlx, _dlq = plain_dead_letter_names(queue)
        # What a plain Celery user does to keep poison: reject (not ack) into a DLX.
        app.conf.update(
            task_acks_late=True,
            task_acks_on_failure_or_timeout=False,
            task_reject_on_worker_lost=False,
            task_queues=[Queue(queue, Exchange(queue, "direct"), routing_key=queue,
                               queue_arguments={"x-dead-letter-exchange": dlx,
                                                "x-dead-letter-routing-key": queue})],
        )
    app.conf.update(
        task_default_queue=queue,
        task_ignore_result=True,
        result_backend=None,
        control_exchange=control_exchange,
        broker_connection_retry_on_startup=True,
    )

    @app.task(name=TASK_NAME, ignore_result=True, shared=False)
    def noop(*_args: Any) -> None:
        """Registered so the worker has a task; no storm message runs it."""

    return app


def _from_environment() -> Celery | None:
    broker = os.environ.get("BENCH_STORM_BROKER")
    if broker is None:  # imported by the benchmark process, not by a worker
        return None
    return make_app(broker, os.environ["BENCH_STORM_QUEUE"], os.environ["BENCH_STORM_CONTROL"],
                    ojs_prefix=os.environ.get("BENCH_STORM_OJS_PREFIX") or None,
                    set_as_current=True)


app = _from_environment()
