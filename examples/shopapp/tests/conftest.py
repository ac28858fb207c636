"""The shop's test configuration: Celery's pytest fixtures on a real broker.

``SHOPAPP_BROKER_URL`` names the broker the fixtures' apps use (``amqp://`` or
``ojs://``); the suite is the same on both.  The one line ojs_kombu asks of it
is ``-p ojs_kombu.testing`` in ``pytest.ini``.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

pytest_plugins = ("celery.contrib.pytest",)

BROKER_URL = os.environ.get("SHOPAPP_BROKER_URL", "ojs://guest:guest@localhost:5672//")


@pytest.fixture(scope="session")
def celery_config() -> dict[str, Any]:
    return {"broker_url": BROKER_URL, "result_backend": "cache+memory://"}


@pytest.fixture(scope="session")
def celery_includes() -> list[str]:
    return ["shopapp.tasks"]
