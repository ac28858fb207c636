"""An app whose task name cannot be an OJS type: its worker must refuse to start."""

import os

from celery import Celery

import ojs_kombu

app = Celery("bad", broker=os.environ["OJS_TEST_BROKER_URL"])
ojs_kombu.install(app)


@app.task(name="proj.tasks.SendEmail")
def send_email() -> None:
    """Upper case: not an OJS type, and no ojs_type mapping."""
