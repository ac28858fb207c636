"""The private members of py-amqp, kombu, Celery and OpenTelemetry that ojs_kombu uses.

Each seam module lists its hooks; these tests pin every hook against the installed
library (run first on the newest-releases CI row, so a release that removes or
changes one fails here, by name), keep every use inside the seam modules, and show
what a missing hook does at run time: a fallback with one warning, or a clear
refusal at start.
"""

from __future__ import annotations

import ast
import inspect
import pathlib
import subprocess
import sys
import textwrap

import pytest

import ojs_kombu
from ojs_kombu.amqp.wire import kombu_seam, py_amqp_seam
from ojs_kombu.celery import celery_seam
from ojs_kombu.events import otel_seam
from ojs_kombu.spec.seams import Hook

SEAMS = (py_amqp_seam, kombu_seam, celery_seam, otel_seam)
HOOKS = [hook for seam in SEAMS for hook in seam.HOOKS]
PACKAGE = pathlib.Path(ojs_kombu.__file__).parent
SEAM_FILES = {pathlib.Path(seam.__file__).resolve() for seam in SEAMS}


@pytest.mark.parametrize("hook", HOOKS, ids=[hook.name for hook in HOOKS])
def test_each_hook_holds_on_the_installed_library(hook: Hook) -> None:
    problem = hook.problem()
    assert problem is None, hook.describe(problem)


def test_no_fallback_is_in_force_on_a_supported_stack() -> None:
    assert py_amqp_seam.fallbacks() == kombu_seam.fallbacks() == otel_seam.fallbacks() \
        == frozenset()


def private_names_used(path: pathlib.Path) -> set[str]:
    """``_name`` attributes read or written, methods defined and names imported."""
    names: set[str] = set()
    own: set[str] = set()  # state a class of the file keeps itself (``self._x = ...``)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
            if isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name) \
                    and node.value.id == "self":
                own.add(node.attr)
        elif isinstance(node, ast.ClassDef):
            names.update(item.name for item in node.body if isinstance(item, ast.FunctionDef))
        elif isinstance(node, ast.ImportFrom):
            names.update(alias.name for alias in node.names)
    return names - own


def test_the_hooks_are_used_only_in_their_seam_modules() -> None:
    hooked = {hook.member for hook in HOOKS}
    outside = {
        f"{path.relative_to(PACKAGE.parent)}: {name}"
        for path in PACKAGE.rglob("*.py") if path.resolve() not in SEAM_FILES
        for name in private_names_used(path) & hooked
    }
    assert not outside, f"private members of dependencies used outside a seam: {outside}"


def dependency_classes() -> list[tuple[type, type]]:
    """Every class of ojs_kombu with a base from py-amqp, kombu or Celery."""
    import ojs_kombu.amqp.transport
    import ojs_kombu.celery.app_amqp
    import ojs_kombu.celery.request  # noqa: F401

    found = []
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("ojs_kombu."):
            continue
        for cls in vars(module).values():
            if not inspect.isclass(cls) or cls.__module__ != module_name:
                continue
            for base in cls.__mro__[1:]:
                if base.__module__.split(".")[0] in {"amqp", "kombu", "celery"}:
                    found.append((cls, base))
    return found


def test_no_class_overrides_a_private_member_of_a_dependency_outside_a_seam() -> None:
    """An override of ``_name`` of a dependency's class is a use: the seam modules'
    class decorators install them, delegating to public-named methods."""
    bad = []
    for cls, base in dependency_classes():
        for name, value in vars(cls).items():
            if not name.startswith("_") or name.startswith("__") or name not in vars(base):
                continue
            if any(other is value for key, other in vars(cls).items()
                   if not key.startswith("_")):
                continue  # a seam decorator's alias of a public method
            function = getattr(value, "fget", value)
            function = getattr(function, "__func__", function)
            module = getattr(function, "__module__", "")
            if module not in {seam.__name__ for seam in SEAMS}:
                bad.append(f"{cls.__module__}.{cls.__qualname__}.{name} overrides "
                           f"{base.__module__}.{base.__qualname__}.{name}")
    assert not bad, bad


def run_with_changed_hook(change: str, then: str) -> subprocess.CompletedProcess[str]:
    """Run ``then`` in a fresh interpreter after ``change`` altered a dependency, as a
    release would."""
    code = "import logging; logging.basicConfig(level=logging.WARNING)\n" + \
        textwrap.dedent(change) + textwrap.dedent(then)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


def test_a_changed_read_hook_falls_back_to_py_amqps_own_reader_with_one_warning() -> None:
    done = run_with_changed_hook("""
        import amqp.transport
        original = amqp.transport.TCPTransport._read
        def _read(self, n, initial=False):  # a release that dropped _errnos
            return original(self, n, initial)
        amqp.transport.TCPTransport._read = _read
    """, """
        from ojs_kombu.amqp.transport import Connection
        for _ in range(3):
            connection = Connection(host="127.0.0.1:1", connect_timeout=0.1)
            print(type(connection.Transport("127.0.0.1:1", 0.1)).__module__)
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["amqp.transport"] * 3
    warnings = [line for line in done.stderr.splitlines() if "TCPTransport._read" in line]
    assert len(warnings) == 1, done.stderr
    assert "takes (n, initial), expected (n, initial, _errnos)" in warnings[0]
    assert "py-amqp's own reader" in warnings[0]


def test_a_changed_delivery_hook_makes_acks_go_out_one_at_a_time() -> None:
    done = run_with_changed_hook("""
        import amqp
        original = amqp.Channel._on_basic_deliver
        def _on_basic_deliver(self, consumer_tag, delivery_tag, redelivered, exchange,
                              routing_key, message):  # renamed last argument
            return original(self, consumer_tag, delivery_tag, redelivered, exchange,
                            routing_key, message)
        amqp.Channel._on_basic_deliver = _on_basic_deliver
    """, """
        import ojs_kombu
        print("imported")
        from ojs_kombu.amqp.transport import Connection
        connection = Connection(host="127.0.0.1:1", connect_timeout=0.1)
        connection.Transport("127.0.0.1:1", 0.1)  # a connection checks the hooks it needs
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["imported"]
    warnings = [line for line in done.stderr.splitlines() if "_on_basic_deliver" in line]
    assert len(warnings) == 1, done.stderr
    assert "acking each delivery at once" in warnings[0]


def test_a_missing_celery_hook_refuses_install_naming_it() -> None:
    done = run_with_changed_hook("""
        import celery.app.amqp
        del celery.app.amqp.AMQP._create_task_sender
    """, """
        from celery import Celery
        import ojs_kombu
        try:
            ojs_kombu.install(Celery("proj", broker="ojs://localhost//"))
        except ojs_kombu.UnsupportedDependencyError as exc:
            print(exc)
        else:
            print("installed")
    """)
    assert done.returncode == 0, done.stderr
    assert "celery.app.amqp.AMQP._create_task_sender is missing" in done.stdout
    assert "checked with Celery 5.5.3" in done.stdout


def test_a_changed_otel_proxy_buffers_every_measurement_with_one_warning() -> None:
    done = run_with_changed_hook("""
        from opentelemetry.metrics._internal import instrument
        original = instrument._ProxyInstrument.__init__
        def __init__(self, *args, **kwargs):  # a release that renamed _real_instrument
            original(self, *args, **kwargs)
            self._sdk_instrument = self.__dict__.pop("_real_instrument")
        instrument._ProxyInstrument.__init__ = __init__
    """, """
        from ojs_kombu.events.metrics import OJSMetrics
        metrics = OJSMetrics()  # no SDK set: the API's proxies
        print(metrics.duration.discards(), metrics.wait.discards())
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]  # unknown: buffered, handed to the API
    warnings = [line for line in done.stderr.splitlines() if "_real_instrument" in line]
    assert len(warnings) == 1, done.stderr
    assert otel_seam.NO_DISCARD_CHECK in warnings[0]


def test_with_the_otel_hook_an_instrument_without_sdk_discards() -> None:
    done = run_with_changed_hook("", """
        from ojs_kombu.events.metrics import OJSMetrics
        metrics = OJSMetrics()
        print(metrics.duration.discards(), metrics.live())
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]
