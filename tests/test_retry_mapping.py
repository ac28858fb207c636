"""Celery's retry options as OJS retry policies, which failures are retried under
``ojs_retry_semantics`` ("celery", the default, and "ojs"), and policies on the wire."""

from __future__ import annotations

import json
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import (
    MaxRetriesExceededError,
    Reject,
    Retry,
    TimeLimitExceeded,
    WorkerLostError,
)

import ojs_kombu
from ojs_kombu.celery.retries import (
    UNBOUNDED_ATTEMPTS,
    failure_retryable,
    follows_celery_retries,
    job_retry_policy,
    task_retry_policy,
)
from ojs_kombu.celery.task import OJSTask
from ojs_kombu.spec.decode import CELERY_JOB_HEADER, RETRY_HEADER, decode_job_message
from ojs_kombu.spec.envelope import RetryPolicy
from ojs_kombu.spec.errors import JobEncodeError

from .test_codec import encode


class PaymentDeclined(Exception):
    pass


def app_with(semantics: str | None = None, **options: Any) -> Any:
    app = Celery("mapping", set_as_current=False)
    ojs_kombu.install(app)
    if semantics is not None:
        app.conf.ojs_retry_semantics = semantics

    @app.task(name="m.task", shared=False, **options)
    def task() -> None: ...

    return task


def ojs_policy(**options: Any) -> RetryPolicy:
    """The policy under ``ojs_retry_semantics="ojs"``."""
    return task_retry_policy(app_with(**options), "ojs")


#: The request of a job a Celery producer published (``x_celery`` in its envelope).
CELERY_JOB: dict[str, Any] = {CELERY_JOB_HEADER: True, "x-ojs-attempt": 1}
#: The request of a job from another producer, without a policy of its own.
FOREIGN_JOB: dict[str, Any] = {"x-ojs-attempt": 1}


def retryable(task: Any, exc: BaseException, request: dict[str, Any] = CELERY_JOB) -> bool:
    return failure_retryable(task, exc, job_retry_policy(task, request), request)


def test_tasks_derive_from_ojs_task() -> None:
    assert isinstance(app_with(), OJSTask)


# -- the policy a task's jobs state, ojs_retry_semantics="celery" (the default) ----------

#: task options -> the envelope's ``retry`` (the OJS defaults for the fields not given)
CELERY_TABLE: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({}, {"max_attempts": 1}),
    # max_retries, backoff and delays without autoretry_for: only self.retry() uses them
    ({"max_retries": 5, "retry_backoff": 2, "default_retry_delay": 7}, {"max_attempts": 1}),
    ({"dont_autoretry_for": (PaymentDeclined,)}, {"max_attempts": 1}),
    ({"autoretry_for": (ValueError,)},  # Celery's max_retries 3, default_retry_delay 180 s
     {"max_attempts": 4, "initial_interval": "PT180S", "backoff_coefficient": 1.0,
      "max_interval": "PT180S", "jitter": False}),
    ({"autoretry_for": (ValueError,), "max_retries": 2, "default_retry_delay": 0.1},
     {"max_attempts": 3, "initial_interval": "PT0.1S", "backoff_coefficient": 1.0,
      "max_interval": "PT0.1S", "jitter": False}),
    ({"autoretry_for": (ValueError,), "max_retries": None}, {
        "max_attempts": UNBOUNDED_ATTEMPTS, "initial_interval": "PT180S",
        "backoff_coefficient": 1.0, "max_interval": "PT180S", "jitter": False}),
    ({"autoretry_for": (ValueError,), "retry_kwargs": {"max_retries": 5, "countdown": 2}},
     {"max_attempts": 6, "initial_interval": "PT2S", "backoff_coefficient": 1.0,
      "max_interval": "PT2S", "jitter": False}),
    ({"autoretry_for": (ValueError,), "retry_backoff": True},  # Celery: max 600 s, jitter
     {"max_attempts": 4, "initial_interval": "PT1S", "backoff_coefficient": 2.0,
      "max_interval": "PT600S", "jitter": True}),
    ({"autoretry_for": (ValueError,), "retry_backoff": 3.7, "retry_backoff_max": 120,
      "retry_jitter": False, "max_retries": 7},  # Celery's factor is int(3.7)
     {"max_attempts": 8, "initial_interval": "PT3S", "backoff_coefficient": 2.0,
      "max_interval": "PT120S", "jitter": False}),
    ({"autoretry_for": (Exception,), "dont_autoretry_for": (PaymentDeclined, KeyError),
      "max_retries": 1, "default_retry_delay": 5},
     {"max_attempts": 2, "initial_interval": "PT5S", "backoff_coefficient": 1.0,
      "max_interval": "PT5S", "jitter": False,
      "non_retryable_errors": ["KeyError", "PaymentDeclined"]}),
    # ojs_retry: OJS semantics for the task, merged last
    ({"ojs_retry": {"max_attempts": 5}}, {"max_attempts": 5}),
    ({"max_retries": 1, "ojs_retry": {"jitter": False}}, {"max_attempts": 2, "jitter": False}),
]


@pytest.mark.parametrize("options, expected", CELERY_TABLE)
def test_celery_semantics_policy_table(options: dict[str, Any],
                                       expected: dict[str, Any]) -> None:
    task = app_with(**options)
    assert task_retry_policy(task) == RetryPolicy(**expected)  # the app's default semantics
    assert task_retry_policy(task, "celery") == task_retry_policy(task)


def test_the_envelope_of_a_celery_job_states_its_celery_retries(job_check: Any) -> None:
    from ojs_kombu.spec.encode import encode_task_message

    from .test_codec import celery_message

    plain, auto = app_with(), app_with(autoretry_for=(ValueError,), max_retries=2,
                                       retry_backoff=False, default_retry_delay=0.1)
    for task, attempts in ((plain, 1), (auto, 3)):
        body, ct, headers, props = celery_message()
        job = encode_task_message(
            body=body, content_type=ct, properties=props, headers=headers,
            job_type="m.task", queue="q",
            retry_policy=task.app.amqp.binding.retry_policy_for("m.task"))
        envelope = json.loads(job.body)
        job_check.validate(envelope)
        assert envelope["retry"]["max_attempts"] == attempts
        assert job.properties["application_headers"]["x-ojs-max-attempts"] == attempts
        incoming = decode_job_message(job.body, job.properties, resolve_task=lambda t: t)
        assert incoming.headers[CELERY_JOB_HEADER] is True  # x_celery: a Celery job
    assert envelope["retry"]["initial_interval"] == "PT0.1S"


def test_the_ojs_setting_publishes_the_ojs_policy() -> None:
    task = app_with("ojs")
    assert task.app.amqp.binding.retry_policy_for("m.task") == RetryPolicy()
    assert task_retry_policy(task) == RetryPolicy()
    with pytest.raises(ojs_kombu.OJSConfigurationError, match="retry_semantics"):
        ojs_kombu.check_app(app_with("sometimes").app)


# -- the policy under ojs_retry_semantics="ojs" ---------------------------------------------


def test_no_options_is_the_ojs_default_policy() -> None:
    assert ojs_policy() == RetryPolicy()


def test_max_retries_counts_retries_not_attempts() -> None:
    assert ojs_policy(max_retries=5).max_attempts == 6
    assert ojs_policy(max_retries=0).max_attempts == 1
    assert ojs_policy(max_retries=None).max_attempts == UNBOUNDED_ATTEMPTS


def test_retry_backoff_maps_onto_exponential_backoff() -> None:
    policy = ojs_policy(retry_backoff=3, retry_backoff_max=120, retry_jitter=False)
    assert (policy.initial_interval, policy.backoff_coefficient) == ("PT3S", 2.0)
    assert (policy.max_interval, policy.jitter) == ("PT120S", False)
    assert ojs_policy(retry_backoff=True).initial_interval == "PT1S"


def test_default_retry_delay_is_a_constant_delay() -> None:
    policy = ojs_policy(default_retry_delay=30)
    assert (policy.initial_interval, policy.backoff_coefficient, policy.max_interval) == (
        "PT30S", 1.0, "PT30S")


def test_dont_autoretry_for_is_non_retryable() -> None:
    task = app_with("ojs", dont_autoretry_for=(PaymentDeclined,))
    assert task_retry_policy(task).non_retryable_errors == ["PaymentDeclined"]
    assert not retryable(task, PaymentDeclined())
    assert retryable(task, ValueError())


def test_autoretry_for_limits_what_is_retried() -> None:
    task = app_with("ojs", autoretry_for=(ConnectionError,))
    assert retryable(task, ConnectionRefusedError())  # a subclass
    assert not retryable(task, ValueError())


def test_ojs_retry_option_wins_and_is_validated() -> None:
    policy = ojs_policy(max_retries=9, ojs_retry={"max_attempts": 2, "jitter": False})
    assert policy.max_attempts == 2 and policy.jitter is False
    with pytest.raises(ojs_kombu.OJSConfigurationError, match="backoff_coefficient"):
        ojs_policy(ojs_retry={"backoff_coefficient": 0.1})


def test_non_retryable_errors_match_class_names_and_prefixes() -> None:
    task = app_with(ojs_retry={"non_retryable_errors": ["PaymentDeclined", "builtins.Key*"]})
    assert not retryable(task, PaymentDeclined())
    assert retryable(task, KeyError())  # "builtins.Key*" is not "prefix.*"
    task = app_with(ojs_retry={"non_retryable_errors": ["builtins.*"]})
    assert not retryable(task, KeyError())


# -- failure_retryable ----------------------------------------------------------------------


def test_celery_semantics_retry_only_what_celery_retries() -> None:
    plain = app_with()
    assert follows_celery_retries(plain, CELERY_JOB)
    for exc in (RuntimeError("boom"), ValueError(), TimeLimitExceeded(5), WorkerLostError()):
        assert not retryable(plain, exc)
    assert retryable(plain, Reject("again", requeue=True))  # within max_attempts (1)
    assert not retryable(plain, Reject("drop", requeue=False))

    auto = app_with(autoretry_for=(ValueError, ConnectionError),
                    dont_autoretry_for=(ConnectionResetError,))
    assert retryable(auto, ValueError())
    assert retryable(auto, ConnectionRefusedError())  # a subclass
    assert not retryable(auto, ConnectionResetError())  # dont_autoretry_for
    assert not retryable(auto, KeyError())
    assert not retryable(auto, TimeLimitExceeded(5))  # Celery would not retry these
    assert not retryable(auto, WorkerLostError())


def test_ojs_semantics_retry_every_failure() -> None:
    plain = app_with("ojs")
    assert not follows_celery_retries(plain, CELERY_JOB)
    for exc in (RuntimeError("boom"), TimeLimitExceeded(5), WorkerLostError()):
        assert retryable(plain, exc)
    assert job_retry_policy(plain, CELERY_JOB) == RetryPolicy()
    auto = app_with("ojs", autoretry_for=(ValueError,))
    assert retryable(auto, ValueError()) and not retryable(auto, KeyError())


def test_an_ojs_retry_option_means_ojs_semantics_for_the_task() -> None:
    task = app_with(ojs_retry={"max_attempts": 4})
    assert not follows_celery_retries(task, CELERY_JOB)
    assert retryable(task, RuntimeError()) and retryable(task, TimeLimitExceeded(5))
    assert job_retry_policy(task, CELERY_JOB).max_attempts == 4


def test_a_per_call_policy_means_ojs_semantics_for_that_job() -> None:
    task = app_with()
    stated = {**CELERY_JOB, RETRY_HEADER: task_retry_policy(task).model_dump(mode="json")}
    assert follows_celery_retries(task, stated)  # the task's own policy, as published
    per_call = {**stated, RETRY_HEADER: {**stated[RETRY_HEADER], "max_attempts": 5}}
    assert not follows_celery_retries(task, per_call)
    assert retryable(task, RuntimeError(), per_call)
    assert job_retry_policy(task, per_call).max_attempts == 5


def test_foreign_jobs_keep_the_ojs_default_policy() -> None:
    task = app_with()
    assert not follows_celery_retries(task, FOREIGN_JOB)
    assert job_retry_policy(task, FOREIGN_JOB) == RetryPolicy()  # 3 attempts
    assert retryable(task, RuntimeError(), FOREIGN_JOB)
    assert retryable(task, TimeLimitExceeded(5), FOREIGN_JOB)
    own = {**FOREIGN_JOB, RETRY_HEADER: {"max_attempts": 2, "non_retryable_errors": ["KeyError"]}}
    assert job_retry_policy(task, own).max_attempts == 2
    assert not retryable(task, KeyError(), own)


# -- OJSTask in the pool: which exceptions become a broker-side retry -----------------------


def run_delivered(task: Any, request: dict[str, Any], retries: int = 0) -> Any:
    """Run ``task`` as the pool runs a delivered job; the exception it ends with."""
    task.push_request(id=ojs_kombu.new_job_id(), retries=retries, args=[], kwargs={},
                      called_directly=False, **request)
    try:
        task()
    except BaseException as exc:
        return exc
    finally:
        task.pop_request()
    return None


def failing_task(semantics: str | None = None, exc: type[Exception] = ValueError,
                 **options: Any) -> Any:
    app = Celery("pool", set_as_current=False)
    ojs_kombu.install(app)
    if semantics is not None:
        app.conf.ojs_retry_semantics = semantics

    @app.task(name="p.fail", bind=True, shared=False, **options)
    def fail(self: Any) -> None:
        raise exc("failed")

    return fail


def test_celery_semantics_a_plain_failure_is_not_retried() -> None:
    assert isinstance(run_delivered(failing_task(), CELERY_JOB), ValueError)
    retry = run_delivered(failing_task("ojs"), CELERY_JOB)
    assert isinstance(retry, Retry) and isinstance(retry.exc, ValueError)
    # another producer's job: the OJS default policy
    assert isinstance(run_delivered(failing_task(), FOREIGN_JOB), Retry)


def test_celery_semantics_autoretry_uses_max_retries_and_celerys_delay() -> None:
    task = failing_task(autoretry_for=(ValueError,), max_retries=2, default_retry_delay=0.1)
    retry = run_delivered(task, CELERY_JOB)
    assert isinstance(retry, Retry) and retry.when == 0.1
    assert isinstance(run_delivered(task, CELERY_JOB, retries=1), Retry)
    assert isinstance(run_delivered(task, CELERY_JOB, retries=2), ValueError)  # out of retries
    assert isinstance(run_delivered(failing_task(exc=KeyError, autoretry_for=(ValueError,)),
                                    CELERY_JOB), KeyError)
    backoff = failing_task(autoretry_for=(ValueError,), retry_backoff=2, retry_jitter=False)
    assert [run_delivered(backoff, CELERY_JOB, retries=n).when for n in (0, 1, 2)] == [2, 4, 8]
    default = failing_task(autoretry_for=(ValueError,))
    assert run_delivered(default, CELERY_JOB).when == 180  # Celery's default_retry_delay


def explicit_task(**retry_options: Any) -> Any:
    app = Celery("explicit", set_as_current=False)
    ojs_kombu.install(app)

    @app.task(name="p.explicit", bind=True, shared=False, max_retries=2)
    def explicit(self: Any) -> None:
        raise self.retry(**retry_options)

    return explicit


def test_celery_semantics_explicit_retry_is_celerys() -> None:
    """Allowed without autoretry_for (the envelope says max_attempts 1), within max_retries."""
    task = explicit_task()
    assert task_retry_policy(task).max_attempts == 1
    retry = run_delivered(task, CELERY_JOB)
    assert isinstance(retry, Retry) and retry.when == 180
    assert isinstance(run_delivered(task, CELERY_JOB, retries=1), Retry)
    assert isinstance(run_delivered(task, CELERY_JOB, retries=2), MaxRetriesExceededError)
    assert run_delivered(explicit_task(countdown=3), CELERY_JOB).when == 3
    reraised = run_delivered(explicit_task(exc=KeyError("gone")), CELERY_JOB, retries=2)
    assert isinstance(reraised, KeyError)
    more = explicit_task(max_retries=5, countdown=1)
    assert isinstance(run_delivered(more, CELERY_JOB, retries=4), Retry)
    unbounded = explicit_task(countdown=1)
    unbounded.max_retries = None
    assert isinstance(run_delivered(unbounded, CELERY_JOB, retries=1000), Retry)


def test_a_non_default_policy_travels_in_the_envelope_and_header(job_check: Any) -> None:
    job = encode(properties={}, task_id=None)
    assert "retry" not in json.loads(job.body)  # default policy: implied
    policy = RetryPolicy(max_attempts=5, initial_interval="PT2S")
    from ojs_kombu.spec.encode import encode_task_message

    from .test_codec import celery_message
    body, ct, headers, props = celery_message()
    job = encode_task_message(body=body, content_type=ct, properties=props, headers=headers,
                              job_type="email.send", queue="email", retry_policy=policy)
    envelope = json.loads(job.body)
    job_check.validate(envelope)
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
