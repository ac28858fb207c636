"""Celery's retry options as OJS retry policies, and policies on the wire."""

from __future__ import annotations

import json
from typing import Any

import pytest
from celery import Celery

import ojs_kombu
from ojs_kombu.codec import RETRY_HEADER, decode_job_message
from ojs_kombu.envelope import RetryPolicy
from ojs_kombu.errors import JobEncodeError
from ojs_kombu.worker import UNBOUNDED_ATTEMPTS, OJSTask, is_retryable, task_retry_policy

from .test_codec import encode


class PaymentDeclined(Exception):
    pass


def app_with(**options: Any) -> Any:
    app = Celery("mapping", set_as_current=False)
    ojs_kombu.install(app)

    @app.task(name="m.task", shared=False, **options)
    def task() -> None: ...

    return task


def test_tasks_derive_from_ojs_task() -> None:
    assert isinstance(app_with(), OJSTask)


def test_no_options_is_the_ojs_default_policy() -> None:
    assert task_retry_policy(app_with()) == RetryPolicy()


def test_max_retries_counts_retries_not_attempts() -> None:
    assert task_retry_policy(app_with(max_retries=5)).max_attempts == 6
    assert task_retry_policy(app_with(max_retries=0)).max_attempts == 1
    assert task_retry_policy(app_with(max_retries=None)).max_attempts == UNBOUNDED_ATTEMPTS


def test_retry_backoff_maps_onto_exponential_backoff() -> None:
    policy = task_retry_policy(app_with(retry_backoff=3, retry_backoff_max=120,
                                        retry_jitter=False))
    assert (policy.initial_interval, policy.backoff_coefficient) == ("PT3S", 2.0)
    assert (policy.max_interval, policy.jitter) == ("PT120S", False)
    assert task_retry_policy(app_with(retry_backoff=True)).initial_interval == "PT1S"


def test_default_retry_delay_is_a_constant_delay() -> None:
    policy = task_retry_policy(app_with(default_retry_delay=30))
    assert (policy.initial_interval, policy.backoff_coefficient, policy.max_interval) == (
        "PT30S", 1.0, "PT30S")


def test_dont_autoretry_for_is_non_retryable() -> None:
    task = app_with(dont_autoretry_for=(PaymentDeclined,))
    policy = task_retry_policy(task)
    assert policy.non_retryable_errors == ["PaymentDeclined"]
    assert not is_retryable(task, PaymentDeclined(), policy)
    assert is_retryable(task, ValueError(), policy)


def test_autoretry_for_limits_what_is_retried() -> None:
    task = app_with(autoretry_for=(ConnectionError,))
    policy = task_retry_policy(task)
    assert is_retryable(task, ConnectionRefusedError(), policy)  # a subclass
    assert not is_retryable(task, ValueError(), policy)


def test_ojs_retry_option_wins_and_is_validated() -> None:
    policy = task_retry_policy(app_with(max_retries=9, ojs_retry={"max_attempts": 2,
                                                                  "jitter": False}))
    assert policy.max_attempts == 2 and policy.jitter is False
    with pytest.raises(ojs_kombu.OJSConfigurationError, match="backoff_coefficient"):
        task_retry_policy(app_with(ojs_retry={"backoff_coefficient": 0.1}))


def test_non_retryable_errors_match_class_names_and_prefixes() -> None:
    task = app_with(ojs_retry={"non_retryable_errors": ["PaymentDeclined", "builtins.Key*"]})
    policy = task_retry_policy(task)
    assert not is_retryable(task, PaymentDeclined(), policy)
    assert is_retryable(task, KeyError(), policy)  # "builtins.Key*" is not "prefix.*"
    task = app_with(ojs_retry={"non_retryable_errors": ["builtins.*"]})
    assert not is_retryable(task, KeyError(), task_retry_policy(task))


def test_a_non_default_policy_travels_in_the_envelope_and_header(job_schema: Any) -> None:
    job = encode(properties={}, task_id=None)
    assert "retry" not in json.loads(job.body)  # default policy: implied
    policy = RetryPolicy(max_attempts=5, initial_interval="PT2S")
    from ojs_kombu.codec import encode_task_message

    from .test_codec import celery_message
    body, ct, headers, props = celery_message()
    job = encode_task_message(body=body, content_type=ct, properties=props, headers=headers,
                              job_type="email.send", queue="email", retry_policy=policy)
    envelope = json.loads(job.body)
    job_schema.validate(envelope)
    assert envelope["retry"]["max_attempts"] == 5
    assert job.properties["application_headers"]["x-ojs-max-attempts"] == 5


def test_per_call_policy_is_validated_at_publish() -> None:
    job = encode(properties={"ojs_retry": {"max_attempts": 1}})
    assert json.loads(job.body)["retry"]["max_attempts"] == 1
    with pytest.raises(JobEncodeError, match="on_exhaustion"):
        encode(properties={"ojs_retry": {"on_exhaustion": "never"}})


def test_a_foreign_jobs_own_policy_reaches_the_task() -> None:
    body = json.dumps({"specversion": "1.0", "id": ojs_kombu.new_job_id(), "type": "a.b",
                       "queue": "q", "args": [], "retry": {"max_attempts": 7}}).encode()
    headers = decode_job_message(body, {"content_type": ojs_kombu.CONTENT_TYPE},
                                 resolve_task=lambda t: t).headers
    assert headers[RETRY_HEADER] == {"max_attempts": 7}
    bare = json.dumps({"specversion": "1.0", "id": ojs_kombu.new_job_id(), "type": "a.b",
                       "queue": "q", "args": []}).encode()
    headers = decode_job_message(bare, {"content_type": ojs_kombu.CONTENT_TYPE,
                                        "application_headers": {"x-ojs-max-attempts": 4}},
                                 resolve_task=lambda t: t).headers
    assert headers[RETRY_HEADER] == {"max_attempts": 4}
