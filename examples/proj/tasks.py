"""Example tasks; every one is an OJS job type.

* ``proj.tasks.send_email`` is a Python-flavoured name; it is mapped to the
  language-neutral OJS type ``email.send`` with the ``ojs_type`` task option,
  so producers in any language enqueue ``email.send``.  It runs on queue ``email``.
* ``billing.charge``, ``report.fetch`` and ``report.render`` are named after
  their OJS type directly and run on queue ``default``.
* ``conformance.fail`` and ``conformance.sleep`` (registered in ``celery.py``)
  are the probe jobs ``ojs-kombu conformance`` sends to a worker's queue.
"""

from __future__ import annotations

import json
import os
from typing import Any

from celery import Task

from .celery import app

#: File the email task appends one JSON line per sent email to (if set), so a
#: producer that does not use Celery's result backend can see the job ran.
OUTBOX_ENV = "OJS_EXAMPLE_OUTBOX"


class PaymentDeclinedError(Exception):
    """The (pretend) payment provider declined the charge."""


@app.task(bind=True, ojs_type="email.send")
def send_email(self: Task, to: str, subject: str) -> str:
    """Pretend to send an email; record it in ``$OJS_EXAMPLE_OUTBOX``."""
    outbox = os.environ.get(OUTBOX_ENV)
    if outbox:
        line = json.dumps({"id": self.request.id, "to": to, "subject": subject})
        with open(outbox, "a", encoding="utf-8") as file:
            file.write(line + "\n")
    return f"sent to {to}"


@app.task(name="billing.charge", throws=(PaymentDeclinedError,),
          autoretry_for=(PaymentDeclinedError,), max_retries=2, default_retry_delay=0.2)
def charge(customer: str, amount_cents: int) -> None:
    """Always fails: Celery's ``autoretry_for`` retries it twice (the broker holds each
    retry), then the job is nacked into its queue's dead-letter queue."""
    raise PaymentDeclinedError(f"card of {customer} declined for {amount_cents} cents")


@app.task(name="report.fetch")
def fetch_report(quarter: str) -> dict[str, Any]:
    """First step of the report chain: fetch the rows of ``quarter``."""
    return {"quarter": quarter, "rows": [12, 30, 18]}


@app.task(name="report.render")
def render_report(report: dict[str, Any]) -> str:
    """Second step of the report chain: render what ``report.fetch`` returned."""
    rows = report["rows"]
    return f"{report['quarter'].upper()}: {len(rows)} rows, total {sum(rows)}"

