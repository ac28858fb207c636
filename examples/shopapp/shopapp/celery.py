"""The shop's Celery app, migrated to OJS by its two lines (``ojs://`` and ``install``).

``SHOPAPP_BROKER_URL`` names the broker (default ``ojs://guest:guest@localhost:5672//``).
Run a worker from ``examples/shopapp/``::

    celery -A shopapp worker
"""

from __future__ import annotations

import os

from celery import Celery

import ojs_kombu

app = Celery(
    "shopapp",
    broker=os.environ.get("SHOPAPP_BROKER_URL", "ojs://guest:guest@localhost:5672//"),
    backend="rpc://",
    include=["shopapp.tasks"],
)
ojs_kombu.install(app)
