"""The app the fault suite's ``celery worker`` subprocesses run (``-A faults.app``).

Each job appends its id to ``$OJS_FAULTS_DONE_FILE`` (one ``O_APPEND`` write per
line, so concurrent pool processes never interleave) before it is acked: the
file is the ground truth for completed and duplicated jobs.  ``$OJS_FAULTS_CONF``
(JSON) adds settings, e.g. quorum queues on the cluster.  ``faults.record_keyed``
does the same with an idempotency key (its job id) on the Redis store.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from celery import Celery

import ojs_kombu


def _done(job_id: str) -> None:
    fd = os.open(os.environ["OJS_FAULTS_DONE_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{job_id}\n".encode())
    finally:
        os.close(fd)


def make_app(broker_url: str, **conf: Any) -> Celery:
    app = Celery("faults", broker=broker_url, set_as_current=False)
    ojs_kombu.install(app)
    app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
                    task_ignore_result=True,
                    ojs_dedup_url=os.environ.get("OJS_FAULTS_DEDUP_URL",
                                                 "redis://127.0.0.1:6379/3"), **conf)

    @app.task(name="faults.record", bind=True, shared=False)
    def record(self: Any, seconds: float = 0.0) -> None:
        if seconds:
            time.sleep(seconds)
        _done(self.request.id)

    @app.task(name="faults.retry_once", bind=True, shared=False, max_retries=3)
    def retry_once(self: Any, countdown: float) -> None:
        """Fails its first attempt: the job waits ``countdown`` s in a retry queue."""
        if not self.request.retries:
            raise self.retry(countdown=countdown)
        _done(self.request.id)

    @app.task(name="faults.record_keyed", bind=True, shared=False, ojs_idempotency_key=True)
    def record_keyed(self: Any, seconds: float = 0.0) -> None:
        if seconds:
            time.sleep(seconds)
        _done(self.request.id)

    ojs_kombu.register_conformance_probes(app)  # what ``ojs-kombu conformance`` watches
    return app


app = make_app(os.environ.get("OJS_FAULTS_BROKER_URL", "ojs://guest:guest@127.0.0.1:5673//"),
               **json.loads(os.environ.get("OJS_FAULTS_CONF") or "{}"))
