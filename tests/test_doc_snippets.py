"""The documentation's examples (``examples/snippets``) run, and the docs hold no
Python that is not included from there.  The broker-free ones run here; those that
need RabbitMQ run in ``integration/test_doc_snippets.py``."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, signals

import ojs_kombu
from ojs_kombu.spec.settings import OJSSettings

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(ROOT / "examples"))

INCLUDE = re.compile(r"^(?P<indent> *)\.\. literalinclude:: (?P<path>\S+)\n(?P<options>"
                     r"(?:(?P=indent)   :.*\n)*)", re.MULTILINE)
PYTHON_HINTS = re.compile(r"^ +(import \w+$|from [\w.]+ import \w|def \w+\(|class \w+[(:]|"
                          r"app\.conf\.\w+ = |with .+:$|try:$)", re.MULTILINE)


def snippet(module: str) -> Any:
    return importlib.import_module(f"snippets.{module}")


def literal_blocks(text: str) -> list[str]:
    """The bodies of the ``::`` literal blocks of a page."""
    blocks = []
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if line.rstrip().endswith("::") and not line.lstrip().startswith(".."):
            indent = len(line) - len(line.lstrip())
            body = []
            for following in lines[index + 1:]:
                if following.strip() and len(following) - len(following.lstrip()) <= indent:
                    break
                body.append(following)
            blocks.append("\n".join(body))
    return blocks


def test_every_included_snippet_exists_with_its_markers() -> None:
    found = 0
    for page in DOCS.glob("*.rst"):
        for match in INCLUDE.finditer(page.read_text()):
            path = (page.parent / match["path"]).resolve()
            assert path.is_file(), (page.name, match["path"])
            # examples/ holds code; docs/cli_output/ the CLI's output, which
            # tests/test_docs_cli_output.py checks against the CLI
            assert path.is_relative_to(ROOT / "examples") or path.is_relative_to(
                DOCS / "cli_output"), (page.name, match["path"])
            text = path.read_text()
            for option in ("start-after", "end-before"):
                marker = re.search(rf":{option}: (.*)", match["options"])
                assert marker is None or marker[1] in text, (page.name, marker)
            found += 1
    assert found >= 15


def test_the_docs_hold_no_python_that_no_test_runs() -> None:
    """Literal blocks are shell commands, output and broker configuration; Python is
    included from examples/ (or doctested)."""
    for page in DOCS.glob("*.rst"):
        text = page.read_text()
        assert ".. code-block:: python" not in text, page.name
        for block in literal_blocks(text):
            assert not PYTHON_HINTS.search(block), (page.name, block[:200])


def test_the_migration_diff_is_the_example_app() -> None:
    """The diff of the README and the getting-started page is what examples/proj does."""
    example = (ROOT / "examples" / "proj" / "celery.py").read_text()
    for source in (ROOT / "README.rst", DOCS / "getting-started.rst"):
        diff = []
        for line in source.read_text().split(".. code-block:: diff", 1)[1].splitlines()[1:]:
            if line.strip() and not line.startswith(" "):
                break
            diff.append(line)
        added = [line[5:].strip() for line in diff if line.startswith("    +")]
        assert added == ["import ojs_kombu",
                         'app = Celery("proj", broker="ojs://guest:guest@localhost:5672//")',
                         "ojs_kombu.install(app)"], source.name
        assert "import ojs_kombu" in example and "ojs_kombu.install(app)" in example
        assert '"ojs://guest:guest@localhost:5672//"' in example


@pytest.fixture
def app() -> Celery:
    return ojs_kombu.install(Celery("proj", broker="ojs://guest:guest@localhost:5672//",
                                    set_as_current=False))


def settings_of(app: Celery) -> OJSSettings:
    return OJSSettings.from_options(app.conf, source="the snippet")


def test_the_configuration_snippets_are_valid_settings(app: Celery) -> None:
    configuration = snippet("configuration")
    configuration.queue_bounds(app)
    settings = settings_of(app)
    assert settings.queues["payments"].type == "quorum"
    assert settings.queue_defaults.max_depth == 100_000
    configuration.cluster(app)
    assert settings_of(app).queue_defaults.type == "quorum"
    assert app.conf.broker_url.count("ojss://") == 3
    configuration.event_sinks(app)
    assert len(settings_of(app).event_sinks) == 3
    configuration.control_users(app)
    assert settings_of(app).control_users_of("billing") == {"ojs-operator", "billing-producer"}
    tls = configuration.tls_app()
    assert tls.conf.broker_use_ssl["cert_reqs"] is not None
    settings_of(tls)


def test_the_unique_jobs_snippet_refuses_nothing_it_configures(app: Celery) -> None:
    sent: list[tuple[Any, dict[str, Any]]] = []

    class Refresh:
        def apply_async(self, args: Any, **options: Any) -> None:
            sent.append((args, options))

    app.conf.task_always_eager = False
    published: list[dict[str, Any]] = []
    original = Celery.send_task

    def record(self: Celery, name: str, args: Any = None, kwargs: Any = None,
               **options: Any) -> None:
        published.append({"name": name, "args": args, **options})

    Celery.send_task = record  # type: ignore[method-assign]
    try:
        charge = snippet("configuration").unique_jobs(app, Refresh(), 7, 42)
    finally:
        Celery.send_task = original  # type: ignore[method-assign]
    assert settings_of(app).dedup_url == "redis://127.0.0.1:6379/0"
    assert charge.ojs_idempotency_key is True
    assert published[0]["ojs_idempotency_key"] == "charge:42"
    assert sent == [((7,), {"ojs_unique": {"keys": ["type", "args"], "period": "PT10M",
                                           "on_conflict": "ignore"}})]


def test_subscribers_and_observers_hear_the_process_events(
        app: Celery, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
        ) -> None:
    observing = snippet("observing")
    observing.subscribe(app)
    subscription = observing.reconnections(app)
    assert subscription is not None
    observer = observing.add_observer(app)
    assert isinstance(observer, ojs_kombu.Observer)
    from ojs_kombu.events.job_info import JobInfo

    job = JobInfo("019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f", "email.send", "email", 1)
    app.amqp.binding.hook.job_completed(job, 0.01, None)
    printed = capsys.readouterr().out
    assert "job.completed" in printed and job.job_id in printed
    with caplog.at_level("WARNING", logger="proj"):
        app.amqp.binding.hook.job_completed(job, 6.0, None)
    assert f"email.send {job.job_id} took 6.0s" in caplog.text


def test_the_prometheus_recipe_serves_one_endpoint_when_a_worker_starts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import prometheus_client
    from opentelemetry import metrics

    ports: list[int] = []
    set_providers: list[Any] = []
    monkeypatch.setattr(prometheus_client, "start_http_server", ports.append)
    monkeypatch.setattr(metrics, "set_meter_provider", set_providers.append)
    sys.modules.pop("snippets.prometheus", None)
    recipe = snippet("prometheus")
    try:
        signals.worker_init.send(sender=None)
        assert ports == [9464]
        assert type(set_providers[0]).__name__ == "MeterProvider"
    finally:
        signals.worker_init.disconnect(recipe.serve_metrics)


@pytest.mark.parametrize("pool, instrumented_at", [
    ("prefork", "worker_process_init"), ("threads", "worker_init"), ("solo", "worker_init"),
    ("gevent", "worker_init")])
def test_the_tracing_recipe_instruments_where_tasks_run(pool: str, instrumented_at: str) -> None:
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    sys.modules.pop("snippets.tracing", None)
    recipe = snippet("tracing")
    instrumentor = CeleryInstrumentor()
    try:
        worker = type("Worker", (), {"pool_cls": pool})()
        signals.worker_init.send(sender=worker)
        assert instrumentor.is_instrumented_by_opentelemetry is (
            instrumented_at == "worker_init")
        signals.worker_process_init.send(sender=None)
        assert instrumentor.is_instrumented_by_opentelemetry
    finally:
        instrumentor.uninstrument()
        signals.worker_init.disconnect(recipe.instrument_worker)
        signals.worker_process_init.disconnect(recipe.instrument_pool_process)
