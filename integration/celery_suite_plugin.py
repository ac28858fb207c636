"""pytest plugin that runs Celery's own integration suite on ``ojs://``.

Loaded with ``-p integration.celery_suite_plugin`` by ``integration/celery_suite.py``
for the ``ojs://`` run only.  Celery's fixtures create the apps (the session
worker's and one per test); this plugin calls ``ojs_kombu.install(app)`` on each
right after it is created, before it configures, sends or consumes anything,
which is what a user's ``app = Celery(...); ojs_kombu.install(app)`` does.
Celery's tests and fixtures stay as released.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery

import ojs_kombu


@pytest.fixture(scope="session", autouse=True)
def ojs_session_app(celery_session_app: Celery) -> Iterator[Celery]:
    """The session worker's app: an autouse fixture of a plugin is set up before
    any fixture of Celery's conftest can start the worker or touch ``app.amqp``."""
    yield ojs_kombu.install(celery_session_app)


@pytest.fixture(autouse=True)
def ojs_test_app(celery_app: Celery) -> Iterator[Celery]:
    """The per-test app the tests publish through (Celery's ``app`` fixture)."""
    yield ojs_kombu.install(celery_app)
