"""The plugin Celery's CLI loads in every ``celery`` process (``ojs_kombu_celery``):
it makes ``ojs://`` resolve without loading ojs_kombu into apps that do not use it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from celery import Celery

from ojs_kombu_celery import names_ojs


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    return done.stdout.strip()


def test_loading_the_plugin_names_the_transports_and_imports_no_ojs_kombu() -> None:
    out = _run("import sys, ojs_kombu_celery\n"
               "print('ojs_kombu' in sys.modules)\n"
               "from kombu.transport import resolve_transport\n"
               "t = resolve_transport('ojs'); s = resolve_transport('ojss')\n"
               "print(t.__module__, t.__name__, s.__name__)")
    assert out.splitlines() == ["False", "ojs_kombu.amqp.transport Transport SSLTransport"]


def test_the_celery_command_line_lists_the_ojs_command_and_leaves_other_apps_alone() -> None:
    out = _run("import sys\n"
               "from click.testing import CliRunner\n"
               "from celery.bin.celery import celery\n"
               "result = CliRunner().invoke(celery, ['--help'])\n"
               "print('  ojs ' in result.output, 'ojs_kombu' in sys.modules)")
    assert out == "True False"


@pytest.mark.parametrize(("conf", "expected"), [
    ({"broker_url": "ojs://guest@localhost//"}, True),
    ({"broker_url": "ojss://h//"}, True),
    ({"broker_url": ["amqp://a//", "ojs://b//"]}, True),
    ({"broker_url": "amqp://a//;ojs://b//"}, True),
    ({"broker_write_url": "ojs://w//"}, True),
    ({"broker_url": "amqp://x//", "broker_transport": "ojs_kombu.transport:Transport"}, True),
    ({"broker_url": "amqp://guest@localhost//"}, False),
    ({"broker_url": "redis://localhost/0"}, False),
    ({}, False),
])
def test_which_apps_are_on_ojs(conf: dict[str, object], expected: bool) -> None:
    app = Celery("plugin-test", set_as_current=False)
    app.conf.update(conf)
    assert names_ojs(app.conf) is expected
