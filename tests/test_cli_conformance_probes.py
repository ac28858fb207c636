"""``conformance`` against an app whose workers cannot run the probe jobs (no broker)."""

from __future__ import annotations

from types import SimpleNamespace

import amqp
from celery import Celery

import ojs_kombu
from ojs_kombu.amqp.binding import Binding
from ojs_kombu.cli.conformance_report import Results
from ojs_kombu.cli.conformance_worker import (
    check_worker_behaviour,
    discard_verdict,
    missing_probes,
    unknown_probe,
)
from ojs_kombu.spec.naming import TopologyNames


def make_app() -> Celery:
    return Celery("proj", broker="ojs://guest:guest@localhost:5672//", set_as_current=False)


def test_an_app_without_probes_is_told_what_to_add() -> None:
    reason = missing_probes(make_app(), "email")
    assert reason is not None
    assert "ojs_kombu.register_conformance_probes(app)" in reason and "email" in reason


def test_an_app_with_probes_or_no_app_runs_the_worker_checks() -> None:
    app = make_app()
    ojs_kombu.register_conformance_probes(app)
    assert missing_probes(app, "email") is None
    assert missing_probes(None, "email") is None


def test_without_probes_nothing_is_sent_and_the_checks_are_not_failed() -> None:
    """No probe job reaches a worker that would dead-letter it into the app's real DLQ:
    the connection is never used (it has no AMQP connection at all)."""
    results = Results()
    reason = missing_probes(make_app(), "email")
    check_worker_behaviour(results, SimpleNamespace(connection=None),  # type: ignore[arg-type]
                           Binding.from_options({}), "email", job_timeout=1, recovery=False,
                           without_probes=reason)
    checks = {c.id: c for c in results.ordered()}
    for check_id in ("AMQP-009", "AMQP-019", "AMQP-020"):
        assert (checks[check_id].status, checks[check_id].reason) == ("n/a", reason)
    assert checks["AMQP-026"].status == checks["AMQP-027"].status == "n/a"


def test_a_probe_dead_lettered_as_an_unknown_type_names_the_missing_probes() -> None:
    unknown = amqp.Message(b"{}", application_headers={
        "x-ojs-error-code": "UNKNOWN_JOB_TYPE"})
    reason = unknown_probe(unknown, "email")
    assert reason is not None and "register_conformance_probes(app)" in reason
    nacked = amqp.Message(b"{}", application_headers={"x-death": [{"reason": "rejected"}]})
    assert unknown_probe(nacked, "email") is None
    assert unknown_probe(None, "email") is None


def test_the_discard_check_passes_a_nack_warns_a_republish_with_its_error_fails_neither(
        ) -> None:
    names = TopologyNames()
    nacked = amqp.Message(b"{}", application_headers={
        "x-death": [{"reason": "rejected", "queue": "ojs.queue.email"}]})
    republished = amqp.Message(b"{}", application_headers={"x-ojs-error-code": "HANDLER_ERROR"})
    neither = amqp.Message(b"{}", application_headers={})
    assert discard_verdict(nacked, "email", names)[0] == "pass"
    status, reason = discard_verdict(republished, "email", names)
    assert status == "warn" and "ojs_dead_letter_mode='nack'" in reason
    assert discard_verdict(neither, "email", names)[0] == "fail"
