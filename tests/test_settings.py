from __future__ import annotations

import pytest

from ojs_kombu.amqp.binding import Binding, register_binding
from ojs_kombu.spec.errors import OJSConfigurationError, QueueNameError
from ojs_kombu.spec.settings import OJSSettings


def test_defaults() -> None:
    settings = OJSSettings.from_options({}, source="test")
    assert settings.prefix == "" and settings.queue_aliases == {"celery": "default"}
    assert settings.max_priority is None and settings.confirm_timeout == 30.0


def test_reads_only_ojs_keys() -> None:
    settings = OJSSettings.from_options(
        {"ojs_prefix": "t1", "broker_url": "x", "ojs_job_types": {"a.B": "a.b"}}, source="test")
    assert settings.prefix == "t1" and settings.job_types == {"a.B": "a.b"}


def test_unknown_setting_is_named() -> None:
    with pytest.raises(OJSConfigurationError, match="ojs_prefx") as info:
        OJSSettings.from_options({"ojs_prefx": "t1"}, source="Celery config")
    assert "ojs_prefix" in str(info.value)  # the known names are listed


def test_invalid_value_is_named() -> None:
    with pytest.raises(OJSConfigurationError, match="confirm_timeout"):
        OJSSettings.from_options({"ojs_confirm_timeout": -1}, source="test")
    with pytest.raises(QueueNameError, match="Bad_Queue"):
        OJSSettings.from_options({"ojs_queue_arguments": {"Bad_Queue": {}}}, source="test")


def test_declare_arguments_merge_priority_and_extras() -> None:
    binding = Binding.from_settings(OJSSettings(queue_arguments={"email": {"x-max-length": 5}},
                                                max_priority=10))
    # a bound rejects publishes unless x-overflow says otherwise (drop-head is opt-in)
    assert binding.declare_arguments("email") == {"x-max-length": 5, "x-max-priority": 10,
                                                  "x-overflow": "reject-publish"}
    assert binding.declare_arguments("other") == {"x-max-priority": 10}
    no_priority = Binding.from_settings(OJSSettings())
    assert no_priority.declare_arguments("email") == {}


def test_conflicting_queue_definitions_are_refused() -> None:
    binding = Binding.from_settings(OJSSettings())
    binding.add_queue_arguments("email", {"x-max-length": 5})
    binding.add_queue_arguments("email", {"x-max-length": 5})  # same definition twice is fine
    with pytest.raises(OJSConfigurationError, match="x-max-length"):
        binding.add_queue_arguments("email", {"x-max-length": 6})


def test_binding_option_must_name_a_binding() -> None:
    with pytest.raises(OJSConfigurationError, match="ojs_binding"):
        Binding.from_options({"ojs_binding": {"prefix": "x"}})
    with pytest.raises(OJSConfigurationError, match="names no ojs_kombu Binding"):
        Binding.from_options({"ojs_binding": "gone#0"})


def test_a_registered_binding_is_found_by_its_key() -> None:
    binding = Binding.from_settings(OJSSettings(prefix="reg"))
    key = register_binding(binding, "proj")
    assert isinstance(key, str) and key.startswith("proj#")
    assert Binding.from_options({"ojs_binding": key}) is binding
    assert Binding.from_options({"ojs_binding": binding}) is binding
    assert register_binding(binding, "proj") != key


def test_max_priority_none_turns_priorities_off() -> None:
    settings = OJSSettings.from_options({"ojs_max_priority": None}, source="test")
    assert Binding.from_settings(settings).declare_arguments("email") == {}
