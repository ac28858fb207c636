"""Hostile input (no broker): strict envelopes on consume, typed caller errors before
anything is sent, and pickle kept off."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from click.testing import CliRunner
from kombu.exceptions import EncodeError
from kombu.serialization import dumps

import ojs_kombu
from ojs_kombu.cli.main import cli
from ojs_kombu.spec.decode import UNKNOWN_JOB_TYPE, decode_job_message
from ojs_kombu.spec.encode import encode_task_message
from ojs_kombu.spec.envelope import CONTENT_TYPE
from ojs_kombu.spec.errors import (
    JobOptionError,
    JobRejected,
    JobTooLargeError,
    NonJSONArgumentError,
    OJSConfigurationError,
)
from ojs_kombu.spec.job_ids import new_job_id
from ojs_kombu.spec.job_types import JobTypeRegistry
from ojs_kombu.spec.settings import OJSSettings
from ojs_kombu.spec.strict_input import INVALID_ENVELOPE, INVALID_PAYLOAD

from .ojs_schemas import official_fixture_params

JOB_ID = "019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f"
VALID = {"specversion": "1.0", "id": JOB_ID, "type": "email.send", "queue": "email",
         "args": []}
#: The start of a valid job's JSON text, for bodies written out by hand.
HEAD = '{"specversion":"1.0","id":"' + JOB_ID + '","type":"email.send","queue":"email",'


def decode(body: Any, *, queue: str | None = None, resolve: Any = None,
           x_celery: Any = ...) -> Any:
    if not isinstance(body, bytes | str):
        body = json.dumps(body if x_celery is ... else {**body, "x_celery": x_celery})
    return decode_job_message(body, {"content_type": CONTENT_TYPE},
                              resolve_task=resolve or (lambda t: t), queue=queue)


def rejected(body: Any, **kwargs: Any) -> JobRejected:
    with pytest.raises(JobRejected) as info:
        decode(body, **kwargs)
    return info.value


# -- 3. strict envelopes on consume ---------------------------------------------------------


@pytest.mark.parametrize("text, named", [
    (HEAD + '"args":[NaN]}', "NaN"),
    (HEAD + '"args":[Infinity]}', "Infinity"),
    (HEAD + '"args":[1,-Infinity]}', "-Infinity"),
    (HEAD + '"args":[],"priority":NaN}', "NaN"),
    (HEAD + '"args":[],"meta":{"score":Infinity}}', "Infinity"),
    (HEAD + '"args":[1e999]}', "1e999"),
    (HEAD + '"args":[],"x_celery":{"kwargs":{"x":-1e400}}}', "-1e400"),
])
def test_nan_and_infinity_are_invalid_payloads(text: str, named: str) -> None:
    error = rejected(text)
    assert error.code == INVALID_PAYLOAD and named in error.message


@pytest.mark.parametrize("text, key", [
    (HEAD + '"args":[],"queue":"other"}', "queue"),
    (HEAD + '"args":[],"type":"billing.charge"}', "type"),
    (HEAD + '"args":[{"to":"a","to":"b"}]}', "to"),
    (HEAD + '"args":[],"meta":{"tenant_id":"a","tenant_id":"b"}}', "tenant_id"),
    (HEAD + '"args":[],"retry":{"max_attempts":1,"max_attempts":9}}', "max_attempts"),
    (HEAD + '"args":[],"x_celery":{"kwargs":{"n":{"deep":[{"k":1,"k":2}]}}}}', "k"),
    (HEAD + '"args":[{"to":"a","to":"a"}]}', "to"),  # the same value twice
    (HEAD + '"args":[{"a":1,"\\u0061":2}]}', "a"),  # the same key, escaped
])
def test_duplicate_keys_at_any_depth_are_invalid_payloads(text: str, key: str) -> None:
    error = rejected(text)
    assert error.code == INVALID_PAYLOAD
    assert f"{key!r} twice" in error.message


def test_strings_that_mention_nan_or_repeat_keys_are_fine() -> None:
    job = decode(HEAD + '"args":["NaN","Infinity",{"a":1},{"a":2}],"meta":{"a":"a"}}')
    assert job.envelope.args == ["NaN", "Infinity", {"a": 1}, {"a": 2}]


@pytest.mark.parametrize("number", ["18446744073709551616", "-9223372036854775809",
                                    "1" + "0" * 40, "1e-07", "1E2", "2.50", "-0.0"])
def test_numbers_keep_their_exact_value(number: str) -> None:
    assert decode(HEAD + '"args":[' + number + "]}").envelope.args == [json.loads(number)]


def _json_text(rng: random.Random, depth: int = 0) -> str:
    """Random JSON-ish text: strict, lenient (NaN, 1e400, keys twice) or broken."""
    kind = rng.randrange(8 if depth < 4 else 5)
    if kind == 0:
        return rng.choice(["0", "-1", "42", "18446744073709551615", "18446744073709551616",
                           "1" + "0" * 30, "007", "1e400", "-1e999"])
    if kind == 1:
        return rng.choice(["0.1", "1e-7", "1e-07", "2.0", "1e16", "1e+16", "1E2", "1e308",
                           "5e-324", "-0.0", "1.", ".5"])
    if kind == 2:
        return rng.choice(['"a"', '"\\u0061"', '"\\n"', '"\\/"', '"\u00e9"', '"\\ud83d\\ude00"',
                           '"\\ud800"', '"NaN"', '"\x01"', '"\u2028"'])
    if kind == 3:
        return rng.choice(["true", "false", "null", "NaN", "Infinity", "-Infinity", "nul"])
    if kind == 4:
        return rng.choice([" ", "\n", ""]) + _json_text(rng, depth + 1) + rng.choice([" ", ""])
    if kind == 5:
        return "[" + ",".join(_json_text(rng, depth + 1) for _ in range(rng.randrange(4))) + "]"
    keys = rng.choices(['"a"', '"b"', '"\\u0061"', '"task"'], k=rng.randrange(4))
    return "{" + ",".join(f"{key}:{_json_text(rng, depth + 1)}" for key in keys) + "}"


def _outcome(body: str) -> Any:
    try:
        job = decode(body)
    except JobRejected as error:
        return error.code, error.message
    return job.envelope.to_dict(), job.headers, job.payload


def test_compact_bodies_are_judged_as_bodies_with_spaces_are() -> None:
    """A body exactly as a compact JSON writer writes it takes a shorter strict check
    than one with insignificant spaces; both must accept and refuse the same jobs, with
    the same errors."""
    rng = random.Random(20261127)
    for _ in range(3000):
        args = _json_text(rng)
        compact = HEAD + '"args":[' + args + '],"x_celery":{"kwargs":' + _json_text(rng) + "}}"
        spaced = "{ " + compact[1:]
        assert _outcome(compact) == _outcome(spaced), compact


@pytest.mark.parametrize("path", official_fixture_params("valid"))
def test_every_official_valid_fixture_still_decodes(path: Path) -> None:
    job = decode_job_message(path.read_bytes(), {"content_type": CONTENT_TYPE},
                             resolve_task=lambda t: t)
    assert job.envelope.id


def test_a_job_consumed_from_another_queue_is_an_invalid_envelope() -> None:
    error = rejected({**VALID, "queue": "billing"}, queue="email")
    assert error.code == INVALID_ENVELOPE
    assert "'billing'" in error.message and "'email'" in error.message
    assert decode(VALID, queue="email").envelope.queue == "email"
    assert decode({**VALID, "queue": "billing"}).task_name == "email.send"  # no queue given


@pytest.mark.parametrize("x_celery, named", [
    ({"timelimit": "abc"}, "x_celery.timelimit must be"),
    ({"timelimit": [1, 2, 3]}, "x_celery.timelimit must be"),
    ({"timelimit": [-1, None]}, "x_celery.timelimit must be"),
    ({"timelimit": ["30", None]}, "x_celery.timelimit must be"),
    ({"timelimit": [True, None]}, "x_celery.timelimit must be"),
    ({"retries": "1"}, "x_celery.retries must be"),
    ({"retries": -1}, "x_celery.retries must be"),
    ({"group_index": 1.5}, "x_celery.group_index must be"),
    ({"kwargs": [1, 2]}, "x_celery.kwargs must be"),
    ({"callbacks": {"task": "a.b"}}, "x_celery.callbacks must be"),
    ({"callbacks": [1]}, "x_celery.callbacks must be"),
    ({"errbacks": [{"args": []}]}, "x_celery.errbacks must be"),
    ({"chain": "a.b"}, "x_celery.chain must be"),
    ({"chord": [{"task": "a.b"}]}, "x_celery.chord must be"),
    ({"root_id": 7}, "x_celery.root_id must be"),
    ({"ignore_result": "yes"}, "x_celery.ignore_result must be"),
    ({"stamps": []}, "x_celery.stamps must be"),
    ({"stamped_headers": [1]}, "x_celery.stamped_headers must be"),
    ({"argsrepr": ["a"]}, "x_celery.argsrepr must be"),
    ({"eta": "2030-01-01T00:00:00Z"}, "x_celery.eta is not allowed"),
    ({"expires": "2030-01-01T00:00:00Z"}, "x_celery.expires is not allowed"),
    ({"task": "other.task"}, "x_celery.task is not allowed"),
    ({"id": ""}, "x_celery.id must be a non-empty string"),
    ({"id": 5}, "x_celery.id must be a non-empty string"),
    ({"hostname": "evil"}, "x_celery.hostname is not allowed"),
    ({"is_eager": True}, "x_celery.is_eager is not allowed"),
    ({"delivery_info": {}}, "x_celery.delivery_info is not allowed"),
    (None, "x_celery must be an object"),
    ([1], "x_celery must be an object"),
    ("x", "x_celery must be an object"),
])
def test_every_x_celery_entry_is_validated(x_celery: Any, named: str) -> None:
    error = rejected(VALID, x_celery=x_celery)
    assert error.code == INVALID_ENVELOPE
    assert named in error.message


def test_valid_x_celery_reaches_celery_and_the_consumers_own_headers_win() -> None:
    sig = {"task": "math.add", "args": [1], "kwargs": {}, "options": {}, "subtask_type": None}
    x_celery = {
        "kwargs": {"a": 1}, "callbacks": [sig], "errbacks": None, "chain": [sig],
        "chord": sig, "timelimit": [30, 20.5], "retries": 2, "group_index": 0,
        "ignore_result": True, "stamps": {"s": 1}, "stamped_headers": ["s"],
        "origin": "gen1@host", "custom": {"any": ["json", 1]}, "root_id": None,
        # stale copies of what the consumer computes (Celery's retry forwards them)
        "x-ojs-attempt": "garbage", "ojs_retry": "garbage", "ojs_celery_job": False,
    }
    job = decode_job_message(json.dumps({**VALID, "x_celery": x_celery}),
                             {"content_type": CONTENT_TYPE,
                              "application_headers": {"x-ojs-attempt": 3}},
                             resolve_task=lambda t: t)
    headers = job.headers
    assert headers["timelimit"] == [30, 20.5] and headers["retries"] == 2
    assert headers["custom"] == {"any": ["json", 1]} and headers["ignore_result"] is True
    assert headers["root_id"] == JOB_ID  # a null entry means unset
    assert headers["x-ojs-attempt"] == 3 and "ojs_retry" not in headers
    assert headers["ojs_celery_job"] is True
    assert job.payload == ([], {"a": 1}, {"callbacks": [sig], "errbacks": None,
                                          "chain": [sig], "chord": sig})


BUILTINS = ["celery.accumulate", "celery.chord", "celery.group", "celery.chain",
            "celery.chord_unlock", "celery.map", "celery.starmap", "celery.chunks",
            "celery.backend_cleanup"]


def celery_app() -> Celery:
    app = Celery("builtins", set_as_current=False)
    app.finalize(auto=True)
    assert set(BUILTINS) <= set(app.tasks)
    return app


@pytest.mark.parametrize("job_type", BUILTINS)
def test_foreign_jobs_cannot_invoke_celerys_builtin_tasks(job_type: str) -> None:
    registry = JobTypeRegistry({}, lambda: celery_app().tasks)
    body = {**VALID, "type": job_type, "args": [[]]}
    error = rejected(body, resolve=registry.task_for)
    assert error.code == UNKNOWN_JOB_TYPE and job_type in error.message
    assert "ojs_job_types" in error.message
    # Celery's own canvas (x_celery present) keeps running them
    assert decode(body, resolve=registry.task_for, x_celery={"origin": "gen1@h"}
                  ).task_name == job_type
    # so does a plain resolver mapping another type onto them
    assert decode({**body, "type": "maint.job"},
                  resolve={"maint.job": job_type}.get).task_name == job_type


def test_an_explicit_mapping_lets_other_producers_run_a_builtin() -> None:
    app = celery_app()
    registry = JobTypeRegistry({"celery.backend_cleanup": "maintenance.cleanup",
                                "celery.group": "celery.group"}, lambda: app.tasks)
    cleanup = {**VALID, "type": "maintenance.cleanup"}
    assert decode(cleanup, resolve=registry.task_for).task_name == "celery.backend_cleanup"
    assert decode({**VALID, "type": "celery.group", "args": [[]]},
                  resolve=registry.task_for).task_name == "celery.group"
    # the built-in's own name is still not a type other producers may use
    error = rejected({**VALID, "type": "celery.backend_cleanup"}, resolve=registry.task_for)
    assert error.code == UNKNOWN_JOB_TYPE


# -- 4. caller-side errors, typed and early -------------------------------------------------

codec_app = Celery("hostile-codec", set_as_current=False)


def celery_encode(*, properties: dict[str, Any] | None = None, max_job_bytes: int | None = None,
                  args: Any = ("a@b.c",), **options: Any) -> Any:
    """Celery's own send path, as the transport sees it (``basic_publish``)."""
    message = codec_app.amqp.as_task_v2(new_job_id(), "email.send", args, None, **options)
    content_type, _, body = dumps(message.body, serializer="json")
    return encode_task_message(body=body, content_type=content_type,
                               properties={**message.properties, **(properties or {})},
                               headers=dict(message.headers), job_type="email.send",
                               queue="email", max_job_bytes=max_job_bytes)


@pytest.mark.parametrize("options, option, words", [
    ({"time_limit": -1}, "time_limit", "time_limit=-1"),
    ({"time_limit": "abc"}, "time_limit", "time_limit='abc'"),
    ({"soft_time_limit": float("nan")}, "soft_time_limit", "soft_time_limit=nan"),
    ({"time_limit": float("inf")}, "time_limit", "time_limit=inf"),
    ({"time_limit": 1, "soft_time_limit": 5}, "soft_time_limit", "greater than time_limit"),
])
def test_bad_time_limits_raise_on_celerys_path(options: dict[str, Any], option: str,
                                               words: str) -> None:
    with pytest.raises(JobOptionError, match=words) as info:
        celery_encode(**options)
    assert info.value.option == option and info.value.task_name == "email.send"
    assert "'email.send'" in str(info.value)


@pytest.mark.parametrize("priority, words", [
    ("high", "not an integer"), (5.0, "not an integer"), (True, "not an integer"),
    (101, "out of range"), (-101, "out of range"), (255, "out of range"),
])
def test_bad_priorities_raise_instead_of_being_clamped(priority: Any, words: str) -> None:
    with pytest.raises(JobOptionError, match=words) as info:
        celery_encode(properties={"priority": priority})
    assert info.value.option == "priority" and "'email.send'" in str(info.value)


@pytest.mark.parametrize("priority", [-100, -10, 0, 9, 10, 100])
def test_priorities_in_range_travel_unchanged(priority: int) -> None:
    body = json.loads(celery_encode(properties={"priority": priority}).body)
    assert body.get("priority", 0) == priority


def test_a_job_over_the_limit_raises_naming_job_size_and_limit() -> None:
    big = ("x" * 5000,)
    with pytest.raises(JobTooLargeError) as info:
        celery_encode(args=big, max_job_bytes=4096)
    error = info.value
    assert error.size > 5000 and error.limit == 4096 and error.job_id
    assert error.job_id in str(error) and "4096" in str(error) and str(error.size) in str(error)
    assert celery_encode(args=big, max_job_bytes=10_000).body


def test_max_job_bytes_defaults_to_rabbitmqs_max_message_size() -> None:
    assert OJSSettings().max_job_bytes == 134_217_728
    assert OJSSettings.from_options({"ojs_max_job_bytes": None}, source="t").max_job_bytes is None
    with pytest.raises(OJSConfigurationError, match="max_job_bytes"):
        OJSSettings.from_options({"ojs_max_job_bytes": 0}, source="test")


@pytest.fixture
def app() -> Celery:
    # Port 1: anything that tried to reach a broker would raise a connection error.
    app = Celery("hostile", broker="ojs://guest:guest@127.0.0.1:1//", set_as_current=False)
    ojs_kombu.install(app)
    app.conf.update(ojs_max_job_bytes=4096, broker_connection_retry=False)

    @app.task(name="math.add", shared=False)
    def add(x: Any, y: int = 0) -> Any:
        return x

    return app


BAD_CALLS = [
    pytest.param({"time_limit": -1}, JobOptionError, "time_limit", id="negative-time-limit"),
    pytest.param({"time_limit": 1, "soft_time_limit": 5}, JobOptionError, "soft_time_limit",
                 id="soft-over-hard"),
    pytest.param({"time_limit": "10"}, JobOptionError, "time_limit", id="time-limit-string"),
    pytest.param({"priority": "high"}, JobOptionError, "priority", id="priority-string"),
    pytest.param({"priority": 1000}, JobOptionError, "priority", id="priority-range"),
]


@pytest.mark.parametrize("options, error, option", BAD_CALLS)
def test_apply_async_refuses_before_connecting(app: Celery, options: dict[str, Any],
                                               error: type, option: str) -> None:
    with pytest.raises(error) as info:
        app.tasks["math.add"].apply_async((1,), **options)
    assert info.value.option == option and "'math.add'" in str(info.value)


@pytest.mark.parametrize("options, error, option", BAD_CALLS)
def test_enqueue_many_refuses_before_connecting(app: Celery, options: dict[str, Any],
                                                error: type, option: str) -> None:
    with pytest.raises(error) as info:
        ojs_kombu.enqueue_many(app, [("math.add", (1,)), ("math.add", (2,), {}, options)])
    assert info.value.option == option and "batch job #1 (math.add)" in str(info.value)


def test_too_large_jobs_are_refused_by_apply_async_and_enqueue_many(app: Celery) -> None:
    with pytest.raises(JobTooLargeError, match="4096"):
        app.tasks["math.add"].apply_async(("x" * 5000,))
    with pytest.raises(JobTooLargeError, match="batch job #0"):
        ojs_kombu.enqueue_many(app, [app.tasks["math.add"].s("x" * 5000)])


class Opaque:
    pass


@pytest.mark.parametrize("value", [{1, 2}, frozenset({1}), Opaque(), 1 + 2j],
                         ids=["set", "frozenset", "object", "complex"])
def test_non_json_arguments_raise_the_documented_error_on_every_path(app: Celery,
                                                                     value: Any) -> None:
    add = app.tasks["math.add"]
    with pytest.raises(NonJSONArgumentError, match="'math.add'"):
        add.apply_async((value,))
    with pytest.raises(NonJSONArgumentError, match="'math.add'"):
        add.apply_async((1,), {"y": value}, headers={"h": 1})
    with pytest.raises(NonJSONArgumentError, match="'math.add'"):
        app.send_task("math.add", (value,))
    with pytest.raises(NonJSONArgumentError):
        ojs_kombu.enqueue_many(app, [("math.add", (value,))])


def test_a_kombu_tag_no_registered_type_reads_raises_an_encode_error() -> None:
    tagged = b'[[{"__type__": "money", "__value__": "1.00"}], {}, {}]'
    with pytest.raises(EncodeError, match="'money'") as info:
        encode_task_message(body=tagged, content_type="application/json", properties={},
                            headers={"task": "email.send", "id": new_job_id()},
                            job_type="email.send", queue="email")
    assert isinstance(info.value, NonJSONArgumentError)


def test_send_task_refuses_a_job_over_the_limit_before_connecting(app: Celery) -> None:
    with pytest.raises(JobTooLargeError, match="4096"):
        app.send_task("math.add", ("x" * 5000,))


# -- 6. pickle stays off --------------------------------------------------------------------


def test_install_removes_pickle_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    app = Celery("pickly", broker="ojs://guest:guest@127.0.0.1:1//", set_as_current=False)
    ojs_kombu.install(app)
    with caplog.at_level(logging.WARNING, logger="ojs_kombu.celery.conf"):
        app.conf.update(accept_content=["pickle", "json", "application/x-python-serialize"],
                        result_accept_content=["pickle"], result_serializer="pickle",
                        event_serializer="pickle")
        conf = app.conf
        assert conf.accept_content == ["json", "ojs"]
    assert conf.result_accept_content == ["json"]
    assert conf.result_serializer == "json" and conf.event_serializer == "json"
    warned = " ".join(r.getMessage() for r in caplog.records)
    for setting in ("accept_content", "result_accept_content", "result_serializer",
                    "event_serializer"):
        assert setting in warned
    ojs_kombu.check_app(app)  # starts


def test_a_worker_whose_app_insists_on_pickle_does_not_start() -> None:
    app = Celery("insists", broker="ojs://guest:guest@127.0.0.1:1//", set_as_current=False)
    ojs_kombu.install(app)
    ojs_kombu.check_app(app)
    app.conf.accept_content = ["json", "pickle"]  # after install() configured the app
    with pytest.raises(OJSConfigurationError, match="accept_content.*pickle"):
        ojs_kombu.check_app(app)


def test_migrate_check_reports_pickle_as_a_blocker(tmp_path: Path) -> None:
    (tmp_path / "pickleproj.py").write_text(
        "from celery import Celery\n"
        "app = Celery('pickleproj', broker='amqp://guest:guest@127.0.0.1:1//')\n"
        "app.conf.accept_content = ['json', 'pickle']\n")
    result = CliRunner().invoke(cli, ["migrate", "check", "-A", "pickleproj",
                                      "--workdir", str(tmp_path), "--json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    blockers = {f["subject"]: f["message"] for f in report["findings"]
                if f["level"] == "blocker"}
    assert "pickle" in blockers["accept_content"]
