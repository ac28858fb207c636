"""The installed ``ojs-kombu`` console script against the real broker and a real worker."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from datetime import datetime
from pathlib import Path
from typing import Any

import amqp
import pytest
from celery import Celery

from ojs_kombu.spec.job_ids import new_job_id

from .conftest import HOST, queue_depth, rabbitmqctl, wait_until
from .test_helpers import check_job
from .workers import WorkerProcess, launch_worker

#: Every test here runs ``ojs-kombu`` subprocesses against the session's vhost and
#: shares nothing with the others but session fixtures: xdist may hand them out one
#: by one (conftest.py), the longest module of the suite spread over its workers.
XDIST_SPREAD = True
ROOT = Path(__file__).resolve().parents[1]
UNREACHABLE = "ojs://guest:guest@127.0.0.1:1//"


def cli_path() -> str:
    """The console script the package installed next to this interpreter."""
    found = shutil.which("ojs-kombu", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.fail("ojs-kombu is not installed: run .venv/bin/pip install -e '.[test]'")
    return found


def run(broker_url: str, *args: str, input: str | None = None, timeout: float = 120,
        cwd: Path | None = None, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "OJS_BROKER_URL": broker_url, **(env or {})}
    return subprocess.run([cli_path(), *args], env=environment, capture_output=True, text=True,
                          timeout=timeout, input=input, cwd=cwd or ROOT, check=False)


def run_bare(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None
             ) -> subprocess.CompletedProcess[str]:
    """The CLI with no broker in its environment but ``env``."""
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("OJS_BROKER_URL", "CELERY_BROKER_URL", "CELERY_APP")}
    return subprocess.run([cli_path(), *args], env={**environment, **(env or {})},
                          capture_output=True, text=True, timeout=120, cwd=cwd or ROOT,
                          check=False)


def run_json(broker_url: str, *args: str, **kwargs: Any) -> tuple[int, Any]:
    result = run(broker_url, *args, "--json", **kwargs)
    try:
        return result.returncode, json.loads(result.stdout)
    except ValueError:
        pytest.fail(f"not JSON (rc {result.returncode}): {result.stdout!r} {result.stderr!r}")


def raw_publish_and_reject(channel: amqp.Channel, queue: str, count: int) -> list[str]:
    """Dead letters the way a consumer makes them: Basic.Reject(requeue=false)."""
    ids = []
    channel.confirm_select()
    for n in range(count):
        job_id = new_job_id()
        body = {"specversion": "1.0", "id": job_id, "type": "math.add", "queue": queue,
                "args": [n, 1]}
        channel.basic_publish_confirm(
            amqp.Message(json.dumps(body), message_id=job_id, delivery_mode=2,
                         content_type="application/openjobspec+json",
                         application_headers={"x-ojs-attempt": 1}),
            exchange="ojs.exchange.direct", routing_key=queue, mandatory=True)
        ids.append(job_id)
    for _ in ids:
        message = wait_until(lambda: channel.basic_get(f"ojs.queue.{queue}"), what="a job")
        channel.basic_reject(message.delivery_tag, requeue=False)
    wait_until(lambda: queue_depth(channel, f"ojs.queue.dlx.{queue}") == count,
               what="the dead letters")
    return ids


# -- help, usage, unreachable broker ---------------------------------------------------
# Every command's help and every command's unreachable-broker error are unit tests
# (tests/test_cli_options.py, in-process); here the installed script shows them once.


def test_root_help_documents_the_exit_codes(broker_url: str) -> None:
    out = run(broker_url, "--help").stdout
    assert out.startswith("Usage: ojs-kombu [OPTIONS] COMMAND")
    for code in ("0  success", "2  usage error", "3  the broker cannot be reached",
                 "4  unknown queue"):
        assert code in out


def test_a_commands_help_names_the_installed_script(broker_url: str) -> None:
    result = run(broker_url, "dlq", "list", "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage: ojs-kombu dlq list [OPTIONS]")
    assert "OJS_BROKER_URL" in result.stdout and "--json" in result.stdout


def test_unreachable_broker_exits_3() -> None:
    command = ["topology", "show", "-q", "email"]
    result = run(UNREACHABLE, *command)
    assert result.returncode == 3, result
    assert "cannot reach the broker" in result.stderr
    assert "on broker ojs://guest:**@127.0.0.1:1// (vhost '/', URL from OJS_BROKER_URL)" \
        in result.stderr
    code, data = run_json(UNREACHABLE, *command)
    assert code == 3
    assert data["error"] == "unreachable" and data["exit_code"] == 3
    assert (data["broker"], data["vhost"]) == ("ojs://guest:**@127.0.0.1:1//", "/")


def test_broker_url_from_the_option_beats_the_environment(worker: Any, broker_url: str
                                                          ) -> None:
    result = run(UNREACHABLE, "topology", "show", "-q", "email", "--broker", broker_url)
    assert result.returncode == 0, result.stderr


def test_broker_and_ojs_settings_come_from_the_app(broker_url: str, amqp_channel: amqp.Channel,
                                                   tmp_path: Path) -> None:
    """``-A`` alone: the app's broker_url (an amqp:// URL, as before the switch), its
    prefix, queue aliases and queue settings; --prefix still wins over the app's."""
    (tmp_path / "tenantcliproj.py").write_text(textwrap.dedent(f"""
        from celery import Celery

        app = Celery("tenantcliproj", broker={broker_url.replace("ojs://", "amqp://", 1)!r})
        app.conf.ojs_prefix = "tenant1"
        app.conf.ojs_queue_aliases = {{"Billing_Q": "cli-billing"}}
        app.conf.ojs_queues = {{"cli-billing": {{"max_depth": 50}}}}
    """))
    app = ("-A", "tenantcliproj")
    result = run_bare(*app, "topology", "declare", "-q", "Billing_Q", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    declared = json.loads(result.stdout)["declared"][0]
    job = declared["queues"][0]
    assert declared["queue"] == "cli-billing" and job["name"] == "tenant1.ojs.queue.cli-billing"
    assert job["arguments"]["x-max-length"] == 50
    assert queue_depth(amqp_channel, "tenant1.ojs.queue.cli-billing") == 0  # really there

    result = run_bare(*app, "enqueue", "math.add", "[1, 2]", "-q", "Billing_Q", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert queue_depth(amqp_channel, "tenant1.ojs.queue.cli-billing") == 1
    result = run_bare(*app, "topology", "show", "-q", "Billing_Q", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["queues"][0]["queues"][0]["messages"] == 1
    result = run_bare(*app, "topology", "show", "-q", "Billing_Q", "--prefix", "tenant2",
                      cwd=tmp_path)
    assert result.returncode == 4 and "tenant2.ojs.queue.cli-billing" in result.stdout
    assert "URL from the broker_url of app 'tenantcliproj'" in result.stderr


def test_celery_broker_url_is_read_and_ojs_broker_url_beats_it(broker_url: str) -> None:
    env = {"CELERY_BROKER_URL": broker_url.replace("ojs://", "amqp://", 1)}
    result = run_bare("topology", "declare", "-q", "cli-celery-env", env=env)
    assert result.returncode == 0, result.stderr
    result = run_bare("topology", "show", "-q", "cli-celery-env",
                      env={**env, "OJS_BROKER_URL": UNREACHABLE})
    assert result.returncode == 3 and "URL from OJS_BROKER_URL" in result.stderr
    result = run_bare("topology", "show", "-q", "cli-celery-env", "--broker", broker_url,
                      env={**env, "OJS_BROKER_URL": UNREACHABLE})
    assert result.returncode == 0, result.stderr


def test_without_any_broker_setting_the_error_names_the_default() -> None:
    """Read-only: passive declarations on the default vhost change nothing."""
    result = run_bare("topology", "show", "-q", "cli-not-in-the-default-vhost")
    assert result.returncode in (3, 4), result.stderr  # 3 where localhost has no broker
    assert "on broker ojs://guest:**@localhost:5672// (vhost '/', URL from the default" \
        in result.stderr


# -- topology -----------------------------------------------------------------------------


def test_topology_declare_then_show(broker_url: str, amqp_channel: amqp.Channel,
                                    worker: Any) -> None:
    """``show`` of a queue without consumers and of ``email``, which the session's
    worker (requested here, so the test also passes alone) consumes."""
    code, declared = run_json(broker_url, "topology", "declare", "-q", "cli-topo")
    assert code == 0
    assert [q["name"] for q in declared["declared"][0]["queues"]] == [
        "ojs.queue.cli-topo", "ojs.queue.dlx.cli-topo", "ojs.queue.control.cli-topo",
        "ojs.queue.dlx.unroutable"]
    queue_depth(amqp_channel, "ojs.queue.dlx.cli-topo")  # really declared (passive)
    queue_depth(amqp_channel, "ojs.queue.dlx.unroutable")

    for _ in range(2):
        assert run(broker_url, "enqueue", "math.add", "[1, 2]", "-q", "cli-topo").returncode == 0
    code, shown = run_json(broker_url, "topology", "show", "-q", "cli-topo", "-q", "email")
    assert code == 0
    topo, email = shown["queues"]
    job = topo["queues"][0]
    assert job["name"] == "ojs.queue.cli-topo" and job["messages"] == 2
    assert job["consumers"] == 0
    assert job["arguments"] == {"x-dead-letter-exchange": "ojs.exchange.dlx",
                                "x-dead-letter-routing-key": "cli-topo"}
    assert topo["problems"] == []
    assert email["queues"][0]["consumers"] >= 1  # the session worker
    assert {b["routing_key"] for b in topo["bindings"]} == {"cli-topo",
                                                            "ojs.queue.control.cli-topo", ""}
    dlx = next(e for e in topo["exchanges"] if e["name"] == "ojs.exchange.dlx")
    assert dlx["exists"] and dlx["differences"] == {}  # its alternate exchange is there

    human = run(broker_url, "topology", "show", "-q", "cli-topo")
    assert human.returncode == 0
    assert "ojs.queue.cli-topo" in human.stdout and "messages 2, consumers 0  ok" in human.stdout
    assert "x-dead-letter-exchange=ojs.exchange.dlx" in human.stdout


def test_topology_show_reads_the_arguments_the_broker_holds(
        broker_url: str, amqp_channel: amqp.Channel) -> None:
    amqp_channel.queue_declare("ojs.queue.cli-odd", durable=True, auto_delete=False,
                               arguments={"x-max-length": 7})
    code, shown = run_json(broker_url, "topology", "show", "-q", "cli-odd")
    assert code == 1  # no dead-lettering, no DLQ, no control queue
    job = shown["queues"][0]["queues"][0]
    assert job["arguments"] == {"x-max-length": 7}
    assert job["differences"]["x-dead-letter-exchange"] == {"expected": "ojs.exchange.dlx",
                                                            "current": None}
    assert any("x-dead-letter-exchange" in p for p in shown["queues"][0]["problems"])
    human = run(broker_url, "topology", "show", "-q", "cli-odd")
    assert human.returncode == 1 and "PROBLEM" in human.stdout
    # read-only: the queue kept its arguments and nothing was created
    with pytest.raises(amqp.exceptions.NotFound):
        amqp_channel.queue_declare("ojs.queue.dlx.cli-odd", passive=True)


def test_unknown_queue_exits_4(broker_url: str, amqp_channel: amqp.Channel) -> None:
    code, shown = run_json(broker_url, "topology", "show", "-q", "cli-never-declared")
    assert code == 4
    assert shown["queues"][0]["queues"][0]["exists"] is False
    result = run(broker_url, "topology", "show", "-q", "cli-never-declared")
    assert result.returncode == 4 and "unknown queue" in result.stderr
    vhost = broker_url.rpartition("/")[2]
    assert f"on broker ojs://guest:**@{HOST}:" in result.stderr
    assert f"(vhost '{vhost}', URL from OJS_BROKER_URL)" in result.stderr
    for command in (["dlq", "list", "-q", "cli-never-declared"],
                    ["info", new_job_id(), "-q", "cli-never-declared"],
                    ["cancel", new_job_id(), "-q", "cli-never-declared"],
                    ["conformance", "-q", "cli-never-declared"]):
        code, error = run_json(broker_url, *command)
        assert (code, error["error"]) == (4, "not_found"), command
        assert error["vhost"] == vhost and "guest:**@" in error["broker"]
    with pytest.raises(amqp.exceptions.NotFound):  # and nothing was declared
        amqp_channel.queue_declare("ojs.queue.dlx.cli-never-declared", passive=True)


def test_invalid_queue_name_is_a_usage_error(broker_url: str) -> None:
    code, error = run_json(broker_url, "topology", "show", "-q", "Bad Queue")
    assert code == 2 and "Bad Queue" in error["message"]


# -- enqueue ----------------------------------------------------------------------------


def test_enqueue_prints_the_id_of_a_job_the_worker_runs(app: Celery, worker: Any,
                                                        broker_url: str) -> None:
    result = run(broker_url, "enqueue", "math.add", "[2, 3]", "--queue", "email")
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip()
    assert app.calls.wait_for(job_id)["args"] == [2, 3]


def test_enqueue_publishes_a_spec_valid_job(broker_url: str, amqp_channel: amqp.Channel
                                            ) -> None:
    code, job = run_json(broker_url, "enqueue", "report.build", '[{"month": 11}, "pdf"]',
                         "-q", "cli-raw", "--priority", "5", "--meta",
                         '{"tags": ["cli"]}', "--retry", '{"max_attempts": 7}')
    assert code == 0
    message = amqp_channel.basic_get("ojs.queue.cli-raw", no_ack=True)
    assert message is not None
    props, headers = message.properties, message.properties["application_headers"]
    assert props["message_id"] == job["id"] and props["type"] == "report.build"
    assert props["content_type"] == "application/openjobspec+json"
    assert props["delivery_mode"] == 2 and props["priority"] == 5
    assert headers["x-ojs-queue"] == "cli-raw" and headers["x-ojs-attempt"] == 1
    assert headers["x-ojs-max-attempts"] == 7 and headers["x-ojs-tags"] == "cli"
    envelope = json.loads(message.body)
    check_job(envelope)
    assert envelope["args"] == [{"month": 11}, "pdf"] and envelope["priority"] == 5
    assert "x_celery" not in envelope  # nothing Celery-specific in a job from the shell


def test_enqueue_scheduled_job_runs_when_due(app: Celery, worker: Any, broker_url: str) -> None:
    code, job = run_json(broker_url, "enqueue", "email.send", '["a@b.c", "later"]', "-q",
                         "email", "--delay", "0.3")
    assert code == 0 and job["scheduled_at"]
    call = app.calls.wait_for(job["id"])
    assert call["scheduled_at"] == job["scheduled_at"]
    assert call["started"] >= datetime.fromisoformat(job["scheduled_at"].replace("Z", "+00:00"))


@pytest.mark.parametrize("args, fragment", [
    ('["a@b.c"', "not valid JSON"),
    ('{"to": "a@b.c"}', "must be a JSON array"),
    ("[NaN]", "not valid JSON"),
])
def test_enqueue_refuses_invalid_json_args(broker_url: str, amqp_channel: amqp.Channel,
                                           args: str, fragment: str) -> None:
    run(broker_url, "topology", "declare", "-q", "cli-invalid")
    result = run(broker_url, "enqueue", "math.add", args, "-q", "cli-invalid")
    assert result.returncode == 2 and fragment in result.stderr
    code, error = run_json(broker_url, "enqueue", "math.add", args, "-q", "cli-invalid")
    assert code == 2 and error["error"] == "usage" and fragment in error["message"]
    assert queue_depth(amqp_channel, "ojs.queue.cli-invalid") == 0  # nothing was sent


@pytest.mark.parametrize("extra, fragment", [
    (["--id", "not-a-uuid"], "UUIDv7"),
    (["--delay", "1", "--scheduled-at", "2030-01-01T00:00:00Z"], "not both"),
    (["--scheduled-at", "tomorrow"], "ISO 8601"),
])
def test_enqueue_refuses_invalid_options(broker_url: str, extra: list[str], fragment: str
                                         ) -> None:
    code, error = run_json(broker_url, "enqueue", "math.add", "[1, 2]", *extra)
    assert code == 2 and fragment in error["message"]


def test_enqueue_refuses_an_invalid_type(broker_url: str) -> None:
    result = run(broker_url, "enqueue", "Math.Add", "[1, 2]")
    assert result.returncode == 2 and "not an OJS job type" in result.stderr


# -- dead letters -------------------------------------------------------------------------


def test_dlq_list_show_replay_purge(broker_url: str, amqp_channel: amqp.Channel) -> None:
    run(broker_url, "topology", "declare", "-q", "cli-dlq")
    ids = raw_publish_and_reject(amqp_channel, "cli-dlq", 4)

    code, listed = run_json(broker_url, "dlq", "list", "-q", "cli-dlq")
    assert code == 0 and listed["count"] == 4
    assert [d["job_id"] for d in listed["dead_letters"]] == ids  # oldest first, none removed
    assert queue_depth(amqp_channel, "ojs.queue.dlx.cli-dlq") == 4
    human = run(broker_url, "dlq", "list", "-q", "cli-dlq", "--limit", "2").stdout
    assert "4 dead letter(s)" in human and ids[0] in human and "2 more" in human

    code, shown = run_json(broker_url, "dlq", "show", "-q", "cli-dlq", ids[1])
    assert code == 0 and shown["envelope"]["id"] == ids[1] and shown["envelope"]["args"] == [1, 1]
    assert shown["headers"]["x-death"]
    assert ids[1] in run(broker_url, "dlq", "show", "-q", "cli-dlq", ids[1]).stdout
    old_spelling = run(broker_url, "dlq", "show", "-q", "cli-dlq", "--id", ids[1])
    assert old_spelling.returncode == 0 and ids[1] in old_spelling.stdout
    assert "--id is deprecated" in old_spelling.stderr
    code, error = run_json(broker_url, "dlq", "show", "-q", "cli-dlq", new_job_id())
    assert (code, error["error"]) == (4, "not_found")
    code, error = run_json(broker_url, "dlq", "show", "-q", "cli-dlq", "not-a-uuid")
    assert (code, error["error"]) == (4, "not_found")  # a task id no dead letter has
    code, error = run_json(broker_url, "dlq", "show", "-q", "cli-dlq", "x" * 256)
    assert (code, error["error"]) == (2, "usage")  # as info: a malformed id is a usage error

    code, replayed = run_json(broker_url, "dlq", "replay", "-q", "cli-dlq", ids[0])
    assert code == 0 and replayed["replayed"] == [ids[0]]
    back = amqp_channel.basic_get("ojs.queue.cli-dlq", no_ack=True)
    assert back.properties["message_id"] == ids[0]
    assert back.properties["application_headers"]["x-ojs-attempt"] == 1

    result = run(broker_url, "dlq", "purge", "-q", "cli-dlq", ids[1], input="n\n")
    assert result.returncode == 1 and "Aborted" in result.stderr  # asked, refused
    assert queue_depth(amqp_channel, "ojs.queue.dlx.cli-dlq") == 3
    result = run(broker_url, "dlq", "purge", "-q", "cli-dlq", ids[1], input="y\n")
    assert result.returncode == 0 and "deleted 1" in result.stdout
    assert queue_depth(amqp_channel, "ojs.queue.dlx.cli-dlq") == 2

    result = run(broker_url, "dlq", "replay", "-q", "cli-dlq", "--all")
    assert result.returncode == 0 and "replayed 2 job(s)" in result.stdout
    assert queue_depth(amqp_channel, "ojs.queue.dlx.cli-dlq") == 0
    assert queue_depth(amqp_channel, "ojs.queue.cli-dlq") == 2

    for _ in range(2):  # dead-letter the replayed jobs again
        message = amqp_channel.basic_get("ojs.queue.cli-dlq")
        amqp_channel.basic_reject(message.delivery_tag, requeue=False)
    wait_until(lambda: queue_depth(amqp_channel, "ojs.queue.dlx.cli-dlq") == 2)
    code, purged = run_json(broker_url, "dlq", "purge", "-q", "cli-dlq", "--yes")
    assert code == 0 and purged["deleted"] == 2
    assert queue_depth(amqp_channel, "ojs.queue.dlx.cli-dlq") == 0


def test_dlq_browses_past_its_windows_in_order_and_leaves_every_other_dead_letter(
        broker_url: str, amqp_channel: amqp.Channel) -> None:
    """``list``, ``show`` and a purge by id read the DLQ a window (500) at a time: past
    the second window they still see every dead letter, oldest first, and leave in place
    all but the one purged."""
    run(broker_url, "topology", "declare", "-q", "cli-browse")
    ids = raw_publish_and_reject(amqp_channel, "cli-browse", 1203)
    code, listed = run_json(broker_url, "dlq", "list", "-q", "cli-browse", "--limit", "2000")
    assert code == 0 and [d["job_id"] for d in listed["dead_letters"]] == ids
    code, shown = run_json(broker_url, "dlq", "show", "-q", "cli-browse", ids[-1])
    assert code == 0 and shown["envelope"]["id"] == ids[-1]
    result = run(broker_url, "dlq", "purge", "-q", "cli-browse", ids[1100], "--yes")
    assert result.returncode == 0 and "deleted 1" in result.stdout
    assert queue_depth(amqp_channel, "ojs.queue.dlx.cli-browse") == 1202
    code, listed = run_json(broker_url, "dlq", "list", "-q", "cli-browse", "--limit", "2000")
    assert [d["job_id"] for d in listed["dead_letters"]] == ids[:1100] + ids[1101:]
    code, purged = run_json(broker_url, "dlq", "purge", "-q", "cli-browse", "--yes")
    assert code == 0 and purged["deleted"] == 1202


def test_dlq_replay_needs_id_or_all(broker_url: str) -> None:
    run(broker_url, "topology", "declare", "-q", "cli-dlq")
    result = run(broker_url, "dlq", "replay", "-q", "cli-dlq")
    assert result.returncode == 2 and "give ID or --all" in result.stderr


def test_dead_letter_of_a_worker_shows_its_error(app: Celery, worker: Any, broker_url: str,
                                                 amqp_channel: amqp.Channel) -> None:
    code, job = run_json(broker_url, "enqueue", "nobody.handles_this", "[]", "-q", "malformed")
    assert code == 0
    wait_until(lambda: queue_depth(amqp_channel, "ojs.queue.dlx.malformed") == 1,
               what="the dead letter")
    try:
        code, shown = run_json(broker_url, "dlq", "show", "-q", "malformed", job["id"])
        assert code == 0 and shown["error_code"] == "UNKNOWN_JOB_TYPE"
        assert "UNKNOWN_JOB_TYPE" in run(broker_url, "dlq", "list", "-q", "malformed").stdout
    finally:
        result = run(broker_url, "dlq", "purge", "-q", "malformed", job["id"], "--yes")
        assert result.returncode == 0
    assert queue_depth(amqp_channel, "ojs.queue.dlx.malformed") == 0


def test_interrupted_replay_loses_nothing(broker_url: str, amqp_channel: amqp.Channel) -> None:
    run(broker_url, "topology", "declare", "-q", "cli-replay")
    # three windows of 500: Ctrl-C after the first one stops the replay between windows
    ids = set(raw_publish_and_reject(amqp_channel, "cli-replay", 1500))
    environment = {**os.environ, "OJS_BROKER_URL": broker_url}
    process = subprocess.Popen([cli_path(), "dlq", "replay", "-q", "cli-replay", "--all"],
                               env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    # the CLI's start-up alone took over 20 s on 2 cores at a load average of 20
    wait_until(lambda: queue_depth(amqp_channel, "ojs.queue.cli-replay") > 0
               or process.poll() is not None, timeout=120, what="the replay to start")
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    # A Ctrl-C that lands after the last window finds nothing left to stop: exit 0, or,
    # in the last instant of the interpreter's exit, killed by SIGINT (a shell's 130).
    assert process.returncode in (130, 0, -signal.SIGINT), err
    if "interrupted after" in err:
        assert process.returncode == 130 and "the others are still in" in err
    else:
        assert "replayed 1500 job(s)" in out, (process.returncode, out, err)
    found: set[str] = set()
    for queue in ("ojs.queue.cli-replay", "ojs.queue.dlx.cli-replay"):
        while (message := amqp_channel.basic_get(queue, no_ack=True)) is not None:
            found.add(message.properties["message_id"])
    assert found == ids  # every job is in its queue or still in the DLQ


# -- control plane ------------------------------------------------------------------------


def test_info_and_cancel_a_running_job(app: Celery, worker: Any, broker_url: str) -> None:
    # the job runs until cancelled (at most 300 s): the four CLI runs before the cancel
    # took more than 30 s on 2 loaded cores, and the job had ended before it came
    code, job = run_json(broker_url, "enqueue", "loop.until_cancelled", "[300]", "-q", "email")
    assert code == 0

    def active() -> bool:
        code, answer = run_json(broker_url, "info", job["id"], "-q", "email")
        return code == 0 and answer["state"] == "active"

    wait_until(active, timeout=30, what="the job running")
    human = run(broker_url, "info", job["id"], "-q", "email")
    assert human.returncode == 0 and f"{job['id']}: active" in human.stdout
    code, sent = run_json(broker_url, "cancel", job["id"], "-q", "email", "--reason", "cli test")
    assert code == 0 and sent["sent"] and sent["workers"] >= 1
    assert app.calls.wait_for(job["id"])["args"] == ["cancelled"]


def test_info_of_unknown_job_exits_4_and_bad_ids_exit_2(worker: Any, broker_url: str) -> None:
    code, answer = run_json(broker_url, "info", new_job_id(), "-q", "email")
    assert code == 4 and answer["state"] == "not_found"
    result = run(broker_url, "cancel", "", "-q", "email")
    assert result.returncode == 2 and "neither a job id nor a task id" in result.stderr


def test_info_without_a_worker_times_out_with_5(broker_url: str) -> None:
    run(broker_url, "topology", "declare", "-q", "cli-no-worker")
    code, error = run_json(broker_url, "info", new_job_id(), "-q", "cli-no-worker",
                           "--timeout", "0.5")
    assert (code, error["error"]) == (5, "timeout")


def _cli_worker(broker_url: str, queue: str, result_backend: str, log: Path
                ) -> WorkerProcess:
    return launch_worker(broker_url, "integration.cliapp", queue, hostname=f"{queue}@%h",
                         pool="solo", concurrency=1, log=log, control=True,
                         env={"OJS_TEST_RESULT_BACKEND": result_backend})


def test_info_without_a_result_backend_and_with_a_failing_one(
        broker_url: str, amqp_channel: amqp.Channel, tmp_path: Path) -> None:
    """No backend: INFO answers ``unknown`` and why (exit 4), never an attribute error.
    A backend that fails: ``unknown`` too, with a reason, not the Python error."""
    workers = [_cli_worker(broker_url, "cli-nobackend", "none", tmp_path / "none.log"),
               _cli_worker(broker_url, "cli-badbackend", "redis://127.0.0.1:1/0",
                           tmp_path / "bad.log")]
    try:
        code, answer = run_json(broker_url, "info", new_job_id(), "-q", "cli-nobackend",
                                "--timeout", "30")
        assert (code, answer["state"]) == (4, "unknown"), answer
        assert "no result backend" in answer["reason"]
        result = run(broker_url, "info", new_job_id(), "-q", "cli-nobackend", "--timeout", "30")
        assert result.returncode == 4 and "no result backend" in result.stderr
        assert "_get_task_meta_for" not in result.stdout + result.stderr

        code, answer = run_json(broker_url, "info", new_job_id(), "-q", "cli-badbackend",
                                "--timeout", "30")
        assert (code, answer["state"]) == (4, "unknown"), answer
        assert "result backend did not answer" in answer["reason"]
        assert "Error" not in str(answer)  # never a Python error text
        result = run(broker_url, "info", new_job_id(), "-q", "cli-badbackend", "--timeout", "30")
        assert result.returncode == 4 and "result backend did not answer" in result.stderr
    finally:
        for worker in workers:
            worker.stop()


# -- events ---------------------------------------------------------------------------------


def _tail(broker_url: str, *args: str) -> subprocess.Popen[str]:
    environment = {**os.environ, "OJS_BROKER_URL": broker_url}
    process = subprocess.Popen([cli_path(), "events", "tail", *args], env=environment,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    assert "following" in process.stderr.readline()  # bound: events from now on are seen
    return process


def test_events_tail_follows_the_amqp_sink(app: Celery, worker: Any, broker_url: str) -> None:
    process = _tail(broker_url, "--types", "job.*", "--queues", "events", "--count", "2",
                    "--timeout", "60", "--json")
    run(broker_url, "enqueue", "math.add", "[1, 2]", "-q", "email")  # filtered out by queue
    _, job = run_json(broker_url, "enqueue", "math.add", "[4, 5]", "-q", "events")
    out, err = process.communicate(timeout=90)
    assert process.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["type"] for e in events] == ["job.started", "job.completed"]
    assert {e["subject"] for e in events} == {job["id"]}

    process = _tail(broker_url, "--types", "job.completed", "--count", "1", "--timeout", "60")
    _, job = run_json(broker_url, "enqueue", "math.add", "[6, 7]", "-q", "events")
    out, _ = process.communicate(timeout=90)
    assert process.returncode == 0
    assert "job.completed" in out and job["id"] in out


def test_events_tail_stops_by_itself(broker_url: str) -> None:
    result = run(broker_url, "events", "tail", "--types", "cron.*", "--count", "1",
                 "--timeout", "0.5")
    assert result.returncode == 5 and "0 of 1" in result.stderr
    result = run(broker_url, "events", "tail", "--types", "cron.*", "--timeout", "0.5")
    assert result.returncode == 0


def test_events_tail_refuses_unknown_types(broker_url: str) -> None:
    result = run(broker_url, "events", "tail", "--types", "jobs.*", "--timeout", "0.5")
    assert result.returncode == 2 and "matches no OJS event type" in result.stderr


# -- conformance ----------------------------------------------------------------------------


def _probe_queues(vhost: str) -> list[str]:
    names = rabbitmqctl("list_queues", "--no-table-headers", "-p", vhost, "name").split()
    return [n for n in names if "ojs-conformance" in n]


def test_conformance_of_a_good_setup(worker_launcher: Any, broker_url: str, vhost: str,
                                     amqp_channel: amqp.Channel) -> None:
    """Against ``celery worker`` with the probes registered and BEATs every second
    (``ojs_job_heartbeat=1``: the AMQP-020 check waits for the running probe's BEAT)."""
    queue = "cli-conformance"
    with worker_launcher("integration.cliapp", queue, control=True,
                         env={"OJS_TEST_CONFORMANCE_PROBES": "1",
                              "OJS_TEST_QUEUE_MAX_PRIORITY": "10"}):
        dead_before = queue_depth(amqp_channel, f"ojs.queue.dlx.{queue}")
        code, report = run_json(broker_url, "conformance", "-q", queue, "--schedule")
        checks = {c["id"]: c for c in report["checks"]}
        assert len(checks) == 32 and all(c["reason"] for c in checks.values())
        failed = {i: c["reason"] for i, c in checks.items() if c["status"] == "fail"}
        assert failed == {} and code == 0
        for check_id in ("AMQP-004", "AMQP-009", "AMQP-014", "AMQP-015", "AMQP-017", "AMQP-019",
                         "AMQP-020", "AMQP-021", "AMQP-022", "AMQP-023", "AMQP-025", "AMQP-028",
                         "AMQP-030"):
            assert checks[check_id]["status"] == "pass", checks[check_id]
        # what the worker did, not the checker
        assert f"a worker of {queue} nacked" in checks["AMQP-009"]["reason"]
        assert "running conformance.sleep job was CANCELled" in checks["AMQP-019"]["reason"]
        # opt-in checks say how to run them
        metrics, recovery = checks["AMQP-024"], checks["AMQP-026"]
        assert metrics["status"] == "n/a" and "--metrics-url" in metrics["reason"]
        assert recovery["status"] == "n/a" and "--recovery" in recovery["reason"]
        assert _probe_queues(vhost) == []  # probes cleaned up
        assert queue_depth(amqp_channel, f"ojs.queue.dlx.{queue}") == dead_before  # the probe's too

        human = run(broker_url, "conformance", "-q", queue, "--recovery")
        assert human.returncode == 0
        assert "AMQP-004  PASS" in human.stdout and "AMQP-027  PASS" in human.stdout
        assert " 0 fail" in human.stdout


def test_conformance_shows_a_queue_without_its_dlx_as_fail(
        broker_url: str, amqp_channel: amqp.Channel, vhost: str) -> None:
    amqp_channel.queue_declare("ojs.queue.cli-broken", durable=True, auto_delete=False)
    code, report = run_json(broker_url, "conformance", "-q", "cli-broken")
    assert code == 1 and report["ok"] is False
    checks = {c["id"]: c for c in report["checks"]}
    assert checks["AMQP-004"]["status"] == "fail"
    assert "x-dead-letter-exchange" in checks["AMQP-004"]["reason"]
    assert checks["AMQP-019"]["status"] == "fail"  # no control queue, no worker
    human = run(broker_url, "conformance", "-q", "cli-broken")
    assert human.returncode == 1 and "AMQP-004  FAIL" in human.stdout
    assert _probe_queues(vhost) == []


# -- migrate check ----------------------------------------------------------------------------


def test_migrate_check_of_an_app_that_can_switch(broker_url: str) -> None:
    env = {"OJS_TEST_BROKER_URL": broker_url}
    code, report = run_json(broker_url, "migrate", "check", "-A", "integration.cliapp", env=env)
    assert code == 0 and report["ok"] is True
    types = {t["name"]: t["job_type"] for t in report["tasks"]}
    assert types["proj.tasks.Legacy"] == "legacy.run" and types["math.add"] == "math.add"
    human = run(broker_url, "migrate", "check", "-A", "integration.cliapp", env=env)
    assert human.returncode == 0 and "nothing blocks the switch" in human.stdout
    assert "docs/differences.rst#task-ids" in human.stdout


def test_migrate_check_reports_what_blocks_the_switch(broker_url: str, tmp_path: Path) -> None:
    (tmp_path / "legacyproj.py").write_text(textwrap.dedent(f"""
        from celery import Celery

        app = Celery("legacyproj", broker="amqp://guest:guest@{HOST}//")
        app.conf.task_serializer = "pickle"
        app.conf.accept_content = ["pickle", "json"]
        app.conf.task_acks_late = True

        @app.task(name="proj.tasks.SendEmail", rate_limit="10/m")
        def send_email(to):
            return to

        @app.task(name="billing.charge", acks_late=False)
        def charge(amount):
            return amount
    """))
    code, report = run_json(broker_url, "migrate", "check", "-A", "legacyproj", cwd=tmp_path)
    assert code == 1 and report["ok"] is False
    subjects = {(f["level"], f["subject"]) for f in report["findings"]}
    assert ("blocker", "task proj.tasks.SendEmail") in subjects
    assert ("blocker", "task_serializer") in subjects
    assert ("blocker", "task billing.charge") in subjects
    assert ("blocker", "accept_content") in subjects  # pickle
    assert ("info", "task proj.tasks.SendEmail") in subjects  # rate_limit
    human = run(broker_url, "migrate", "check", "-A", "legacyproj", cwd=tmp_path)
    assert human.returncode == 1
    assert "proj.tasks.SendEmail" in human.stdout and "NEEDS A MAPPING" in human.stdout
    assert "proj.tasks.send_email" in human.stdout  # the suggested type


def test_migrate_check_of_a_missing_app_is_a_usage_error(broker_url: str) -> None:
    result = run(broker_url, "migrate", "check", "-A", "no_such_project_module")
    assert result.returncode == 2 and "cannot load the Celery app" in result.stderr
