from __future__ import annotations

import pytest

from ojs_kombu.spec.errors import OJSConfigurationError, QueueNameError
from ojs_kombu.spec.naming import TopologyNames, check_queue_name, is_job_id, is_job_type


def test_spec_names_without_prefix() -> None:
    names = TopologyNames()
    assert names.direct_exchange == "ojs.exchange.direct"
    assert names.dlx_exchange == "ojs.exchange.dlx"
    assert names.retry_exchange == "ojs.exchange.retry"
    assert names.delayed_exchange == "ojs.exchange.delayed"
    assert names.job_queue("email") == "ojs.queue.email"
    assert names.dead_letter_queue("email") == "ojs.queue.dlx.email"
    assert names.retry_queue("email", 5000) == "ojs.queue.retry.email.5000"
    assert names.control_queue("email") == "ojs.queue.control.email"
    assert names.dropped_queue("email") == "ojs.queue.dropped.email"


@pytest.mark.parametrize("prefix", ["tenant1", "tenant1."])
def test_prefix_for_multi_tenancy(prefix: str) -> None:
    names = TopologyNames(prefix=prefix)
    assert names.job_queue("email") == "tenant1.ojs.queue.email"
    assert names.dlx_exchange == "tenant1.ojs.exchange.dlx"
    assert names.dropped_queue("email") == "tenant1.ojs.queue.dropped.email"
    assert names.queue_from_job_queue("tenant1.ojs.queue.email") == "email"
    assert names.queue_from_job_queue("ojs.queue.email") is None


def test_bad_prefix_is_refused() -> None:
    with pytest.raises(OJSConfigurationError, match="prefix"):
        TopologyNames(prefix="ten ant")


def test_job_queue_recognition_skips_dlx_retry_control() -> None:
    names = TopologyNames()
    assert names.queue_from_job_queue("ojs.queue.email") == "email"
    assert names.queue_from_job_queue("ojs.queue.reports.eu") == "reports.eu"
    for other in ("ojs.queue.dlx.email", "ojs.queue.retry.email.500",
                  "ojs.queue.control.email", "ojs.queue.dropped.email", "celery",
                  "celeryev.abc", "ojs.queue."):
        assert names.queue_from_job_queue(other) is None


def test_celery_queue_names_map_to_ojs_names() -> None:
    names = TopologyNames()
    assert names.ojs_queue("celery") == "default"  # Celery's default queue
    assert names.ojs_queue("email") == "email"
    assert names.ojs_queue("ojs.queue.email") == "email"
    custom = TopologyNames(queue_aliases={"high_priority": "high-priority"})
    assert custom.ojs_queue("high_priority") == "high-priority"
    assert custom.ojs_queue("celery") == "celery"


@pytest.mark.parametrize("bad", ["High", "with_underscore", "-dash", "a" * 129, "", "a b",
                                 "dlx.email", "retry.x", "control.y", "dropped.z", "unroutable"])
def test_invalid_queue_names_are_explained(bad: str) -> None:
    with pytest.raises(QueueNameError) as info:
        check_queue_name(bad)
    assert repr(bad) in str(info.value) or bad == ""


def test_type_and_id_grammars() -> None:
    assert is_job_type("email.send") and is_job_type("proj.tasks.send_email")
    assert not is_job_type("Email.send") and not is_job_type("email-send")
    assert not is_job_type("1x") and not is_job_type("a" * 256)
    assert is_job_id("019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f")
    assert not is_job_id("550e8400-e29b-41d4-a716-446655440000")  # v4
    assert not is_job_id("019461A8-1A2B-7C3D-8E4F-5A6B7C8D9E0F")  # upper case
