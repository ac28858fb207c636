"""The two probe job types ``ojs-kombu conformance`` sends to a worker's queue.

A worker can only be watched doing what the binding asks (discard a failed
job, stop a running one on CANCEL, BEAT while it runs) with jobs it runs.
``register_conformance_probes(app)`` adds them to an app; the example app
(``examples/proj``) does.  Neither touches anything outside the worker.
"""

from __future__ import annotations

import time
from typing import Any

from celery import Celery

FAIL_TYPE = "conformance.fail"
SLEEP_TYPE = "conformance.sleep"


class ConformanceProbeError(Exception):
    """Raised by ``conformance.fail`` on purpose: its worker must discard the job."""


def register_conformance_probes(app: Celery) -> None:
    """Register ``conformance.fail`` (always fails, never retried: dead-lettered by the
    worker, AMQP-009) and ``conformance.sleep`` (runs ``seconds`` unless cancelled:
    INFO, BEAT and CANCEL, AMQP-019/020/021) in ``app``."""

    @app.task(name=FAIL_TYPE, shared=False, max_retries=0)
    def conformance_fail() -> None:
        raise ConformanceProbeError("conformance probe: failing on purpose")

    @app.task(bind=True, name=SLEEP_TYPE, shared=False)
    def conformance_sleep(self: Any, seconds: float) -> str:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.ojs.cancelled:
                return "cancelled"
            time.sleep(0.1)
        return "slept"
