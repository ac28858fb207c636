"""An app on an ``ojs://`` broker whose module forgot ``ojs_kombu.install(app)``."""

import os

from celery import Celery

import ojs_kombu  # noqa: F401  (imported, as a migrated app's module does; not installed)

app = Celery("forgetful", broker=os.environ["OJS_TEST_BROKER_URL"])


@app.task(name="orders.validate")
def validate(order_id: str) -> str:
    return order_id
