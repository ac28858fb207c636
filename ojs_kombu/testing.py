"""pytest plugin: Celery's own pytest fixtures on an ``ojs://`` broker.

Load it with one line, ``-p ojs_kombu.testing`` (in ``addopts``) or
``pytest_plugins = ("celery.contrib.pytest", "ojs_kombu.testing")`` in a
``conftest.py``.  ``celery.contrib.pytest`` makes a new app for its fixtures
(``celery_app``, ``celery_session_app``, and so the workers of ``celery_worker``
and ``celery_session_worker``), not the project's app, so the project's
``ojs_kombu.install(app)`` never runs on it.  This plugin calls ``install`` on
that app as soon as the fixture made it, before it sends or consumes anything,
when its configuration (``celery_config``) names an ``ojs://``/``ojss://``
broker; apps on any other broker are left as they are, so one suite runs on
both.  See docs/testing.rst.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

#: The fixtures of ``celery.contrib.pytest`` that make the app its workers use.
APP_FIXTURES = frozenset({"celery_app", "celery_session_app"})


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: Any) -> Iterator[None]:
    """Install the app a Celery app fixture just made, when its broker is ``ojs://``."""
    app = yield
    if fixturedef.argname in APP_FIXTURES:
        from .celery.app import install, needs_install

        if needs_install(app):
            install(app)
    return app
