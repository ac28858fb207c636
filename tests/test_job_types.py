from __future__ import annotations

from types import SimpleNamespace

import pytest

from ojs_kombu.spec.errors import JobTypeError, OJSConfigurationError
from ojs_kombu.spec.job_types import JobTypeRegistry


def tasks(**named: object) -> dict[str, object]:
    return {name.replace("__", "."): t for name, t in named.items()}


def test_names_that_fit_the_grammar_are_their_own_type() -> None:
    registry = JobTypeRegistry(tasks=lambda: {"email.send": object()})
    assert registry.type_for("email.send") == "email.send"
    assert registry.task_for("email.send") == "email.send"


def test_explicit_config_mapping_wins_both_ways() -> None:
    registry = JobTypeRegistry({"proj.Tasks.Send": "email.send"},
                               tasks=lambda: {"proj.Tasks.Send": object()})
    assert registry.type_for("proj.Tasks.Send") == "email.send"
    assert registry.task_for("email.send") == "proj.Tasks.Send"


def test_task_option_maps_a_task() -> None:
    registry = JobTypeRegistry(
        tasks=lambda: {"proj.tasks.SendEmail": SimpleNamespace(ojs_type="email.send")})
    assert registry.type_for("proj.tasks.SendEmail") == "email.send"
    assert registry.task_for("email.send") == "proj.tasks.SendEmail"


def test_unmappable_name_is_a_clear_error() -> None:
    registry = JobTypeRegistry(tasks=lambda: {})
    with pytest.raises(JobTypeError) as info:
        registry.type_for("proj.tasks.SendEmail")
    assert "proj.tasks.SendEmail" in str(info.value)
    assert "ojs_type" in str(info.value)


def test_invalid_explicit_type_is_refused() -> None:
    registry = JobTypeRegistry({"x": "Not-A-Type"})
    with pytest.raises(JobTypeError, match="Not-A-Type"):
        registry.type_for("x")


def test_validate_names_the_offending_task() -> None:
    registry = JobTypeRegistry(tasks=lambda: {"ok.task": object(), "bad-task": object()})
    with pytest.raises(JobTypeError, match="bad-task"):
        registry.validate()


def test_two_tasks_claiming_one_type_is_refused() -> None:
    registry = JobTypeRegistry({"proj.a": "email.send"},
                               tasks=lambda: {"proj.a": object(), "email.send": object()})
    with pytest.raises(OJSConfigurationError, match="email.send"):
        registry.validate()


def test_unknown_type_resolves_to_none_on_a_worker() -> None:
    registry = JobTypeRegistry(tasks=lambda: {"email.send": object()})
    assert registry.task_for("nobody.handles") is None


def test_registry_sees_tasks_registered_later() -> None:
    table: dict[str, object] = {}
    registry = JobTypeRegistry(tasks=lambda: table)
    assert registry.task_for("late.task") is None
    table["proj.Late"] = SimpleNamespace(ojs_type="late.task")
    assert registry.task_for("late.task") == "proj.Late"


def test_a_resolved_type_is_not_looked_up_in_the_task_registry_again() -> None:
    lookups = 0
    table = {"email.send": object()}

    def tasks() -> dict[str, object]:
        nonlocal lookups
        lookups += 1
        return table

    registry = JobTypeRegistry(tasks=tasks)
    assert registry.task_for("email.send") == "email.send"
    first = lookups
    for _ in range(100):
        assert registry.task_for("email.send") == "email.send"
    assert lookups == first
    assert registry.task_for("nobody.handles") is None
    table["nobody.handles"] = object()  # a later registration is still found
    assert registry.task_for("nobody.handles") == "nobody.handles"
