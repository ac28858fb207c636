"""First use, no broker: which apps need ``install()``, the worker's refusal, the pytest
plugin's install of Celery's fixture apps, and ``ojs_eager_encode``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, chain
from celery.contrib.testing.app import TestApp

import ojs_kombu
from ojs_kombu import AppNotInstalledError, JobOptionError, NonJSONArgumentError, needs_install
from ojs_kombu.testing import pytest_fixture_setup

URL = "ojs://guest:guest@localhost:5672//"


@pytest.mark.parametrize(("config", "needs"), [
    ({"broker_url": URL}, True),
    ({"broker_url": "ojss://guest:guest@localhost:5671//"}, True),
    ({"broker_url": "amqp://guest:guest@localhost:5672//"}, False),
    ({"broker_url": "memory://"}, False),
    ({"broker_url": "amqp://localhost//", "broker_write_url": URL}, True),
    ({"broker_url": [URL, "ojs://guest:guest@standby:5672//"]}, True),
    ({"broker_url": ["amqp://localhost//", "amqp://standby//"]}, False),
    ({"broker_url": "localhost", "broker_transport": "ojs_kombu.transport:Transport"}, True),
])
def test_needs_install_reads_the_broker_from_the_configuration(config: dict[str, Any],
                                                               needs: bool) -> None:
    app = Celery("t", set_as_current=False)
    app.conf.update(config)
    assert needs_install(app) is needs
    ojs_kombu.install(app)
    assert needs_install(app) is False


def test_needs_install_leaves_the_app_installable() -> None:
    """It reads the configuration only: ``install()`` still works after it."""
    app = Celery("t", broker=URL, set_as_current=False)
    assert needs_install(app)
    ojs_kombu.install(app)
    assert ojs_kombu.check_app(app) is not None


def test_worker_of_an_uninstalled_app_does_not_start() -> None:
    app = Celery("forgetful", broker=URL, set_as_current=False)
    with pytest.raises(AppNotInstalledError, match=r"ojs_kombu\.install\(app\)"):
        app.WorkController(pool="solo", without_heartbeat=True, without_mingle=True,
                           without_gossip=True)


class _FixtureDef:
    def __init__(self, argname: str) -> None:
        self.argname = argname


def _through_plugin(argname: str, app: Celery) -> Celery:
    hook = pytest_fixture_setup(_FixtureDef(argname), None)
    next(hook)
    with pytest.raises(StopIteration) as stop:
        hook.send(app)
    return stop.value.value


@pytest.mark.parametrize("argname", ["celery_app", "celery_session_app"])
def test_the_pytest_plugin_installs_celery_fixture_apps_on_ojs(argname: str) -> None:
    app = TestApp(config={"broker_url": URL}, set_as_current=False)
    assert _through_plugin(argname, app) is app
    assert not needs_install(app)
    assert app.amqp.binding is not None  # an OJS app: its AMQP layer has a binding


def test_the_pytest_plugin_leaves_other_brokers_and_fixtures_alone() -> None:
    amqp_app = TestApp(config={"broker_url": "amqp://localhost//"}, set_as_current=False)
    _through_plugin("celery_app", amqp_app)
    assert not hasattr(amqp_app.amqp, "binding")
    other = TestApp(config={"broker_url": URL}, set_as_current=False)
    _through_plugin("my_app", other)
    assert needs_install(other)


@pytest.fixture()
def eager_app() -> Iterator[Celery]:
    app = Celery("eager", broker=URL, set_as_current=False)
    ojs_kombu.install(app)
    app.conf.task_always_eager = True
    yield app


def _tasks(app: Celery) -> tuple[Any, Any]:
    @app.task(name="shop.add", shared=False)
    def add(x: Any, y: Any) -> Any:
        return x + y

    @app.task(name="shop.tags", shared=False)
    def tags() -> Any:
        return {"a", "b"}

    return add, tags


def test_eager_calls_are_not_encoded_by_default(eager_app: Celery) -> None:
    add, _ = _tasks(eager_app)
    assert add.apply_async((1, 2), priority=300).get() == 3  # a publish would refuse it


def test_ojs_eager_encode_raises_what_a_publish_raises(eager_app: Celery) -> None:
    eager_app.conf.ojs_eager_encode = True
    add, tags = _tasks(eager_app)
    assert add.delay(1, 2).get() == 3
    assert chain(add.s(1, 2), add.s(3)).delay().get() == 6
    with pytest.raises(JobOptionError, match="priority=300"):
        add.apply_async((1, 2), priority=300)
    with pytest.raises(NonJSONArgumentError, match="set"):
        add.delay({1}, 2)
    with pytest.raises(NonJSONArgumentError, match="set"):
        add.apply(({1}, 2))
    with pytest.raises(NonJSONArgumentError, match="set"):  # a chain's next link
        chain(tags.s(), add.s(set())).delay().get()
