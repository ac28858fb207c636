"""Least privilege: a producer, a worker and an operator, each a broker user with
exactly the permissions docs/production.rst gives its role (``QUEUES`` there is
the queues' names, here ``lp``).  Each role's work succeeds; what lies outside it
fails with one error naming the missing permission, never a retry loop.

The users are made in the test's private vhost and deleted afterwards.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import amqp
import kombu
import pytest

from ojs_kombu import TopologyPermissionError

from .apps import make_app
from .conftest import HOST, PORT, private_vhost, rabbitmqctl, wait_until
from .test_cli import cli_path
from .workers import WorkerProcess, launch_worker

ROOT = Path(__file__).resolve().parents[1]
#: Minutes of this module on one xdist worker: it goes out before the other modules
#: (integration/conftest.py), not last and alone at the end of the run.
XDIST_LONG = True
QUEUE = "lp"
ROLES = ("producer", "worker", "operator")


def documented_permissions(queues: str = QUEUE) -> dict[str, tuple[str, str, str]]:
    """``{role: (configure, write, read)}`` from docs/production.rst's table, for the
    role's ``queues`` (a regular expression's alternatives: ``email|billing``)."""
    text = (ROOT / "docs" / "production.rst").read_text()
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        match = re.match(r"^\s+(producer|worker|operator)\s+(configure|write|read)\s+(\S+)\s*$",
                         line)
        if match:
            found.setdefault(match[1], []).append(match[3].replace("QUEUES", queues))
    assert sorted(found) == sorted(ROLES) and all(len(v) == 3 for v in found.values()), found
    return {role: (v[0], v[1], v[2]) for role, v in found.items()}


@contextmanager
def role_users(vhost_prefix: str) -> Iterator[tuple[dict[str, str], str]]:
    """``({role: broker URL}, vhost)``: one user per role, with the documented
    permissions (:func:`documented_permissions`), in a vhost of its own; the users are
    deleted afterwards."""
    permissions = documented_permissions()
    token = uuid.uuid4().hex[:6]
    made: list[str] = []
    with private_vhost(vhost_prefix) as vhost:
        try:
            urls = {}
            for role in ROLES:
                user = f"ojs-{role}-{token}"
                rabbitmqctl("add_user", user, "secret")
                made.append(user)
                rabbitmqctl("set_permissions", "-p", vhost, user, *permissions[role])
                urls[role] = f"ojs://{user}:secret@{HOST}:{PORT}/{vhost}"
            yield urls, vhost
        finally:
            for user in made:
                rabbitmqctl("delete_user", user)


@pytest.fixture(scope="module")
def users() -> Iterator[dict[str, str]]:
    """``{role: broker URL}``: one user per role in a vhost of the module's own."""
    with role_users("ojs-kombu-perms") as (urls, _):
        yield urls


def worker_run(url: str, queue: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """A default worker (gossip, mingle, heartbeats on) that is expected to stop."""
    env = {**os.environ, "OJS_TEST_BROKER_URL": url, "OJS_TEST_RESULT_BACKEND": "none"}
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "integration.cliapp", "worker", "-Q", queue,
         "--pool", "solo", "-E"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def worker_start(url: str, queue: str, log: Path, control_users: tuple[str, ...] = ()
                 ) -> WorkerProcess:
    """The one launcher; the test waits for what this role may see itself.
    ``control_users``: whose CANCEL and INFO it honours besides its own user's."""
    return launch_worker(url, "integration.cliapp", queue, pool="threads", concurrency=4,
                         log=log, env={"OJS_TEST_RESULT_BACKEND": "none",
                                       "OJS_TEST_CONFORMANCE_PROBES": "1",
                                       "OJS_TEST_CONTROL_USERS": json.dumps(control_users)},
                         ready=False, without=(), options=("-E",))


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([cli_path(), *args, "--json"], env={**os.environ, "OJS_BROKER_URL": url},
                          capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)


def depth(url: str, queue: str) -> int:
    """Ready messages of ``queue`` (a passive declaration: no permission needed)."""
    with kombu.Connection(url.replace("ojs://", "pyamqp://", 1)) as connection:
        return int(connection.default_channel.queue_declare(queue, passive=True).message_count)


def test_each_role_does_its_work_and_nothing_else(users: dict[str, str], tmp_path: Path
                                                  ) -> None:
    # a producer may not declare the queue: before anyone did, its publish says so
    producer = make_app("perm-producer", users["producer"])
    with pytest.raises(TopologyPermissionError) as refused:
        producer.send_task("math.add", args=[0, 0], queue=QUEUE, ignore_result=True)
    assert "lacks the 'configure' permission on exchange 'ojs.exchange.direct'" \
        in str(refused.value)  # the first declaration of the topology

    # the operator declares it; the producer publishes jobs, now and scheduled
    declared = cli(users["operator"], "topology", "declare", "-q", QUEUE)
    assert declared.returncode == 0, declared.stderr
    producer = make_app("perm-producer", users["producer"])
    now = producer.send_task("math.add", args=[1, 2], queue=QUEUE, ignore_result=True)
    later = producer.send_task("math.add", args=[2, 2], queue=QUEUE, countdown=1,
                               ignore_result=True)
    failing = producer.send_task("toggle.fail", queue=QUEUE, ignore_result=True)
    assert depth(users["operator"], f"ojs.queue.{QUEUE}") >= 2

    # ... and consumes none: a default worker with its user stops at start, at Celery's
    # mingle (the first thing a worker declares is its reply queue), naming the refusal
    run = worker_run(users["producer"], QUEUE)
    assert run.returncode != 0, run.stderr[-3000:]
    assert re.search(r"ACCESS_REFUSED - (configure )?access to exchange 'reply\.celery\.pidbox'",
                     run.stderr), run.stderr[-3000:]
    assert "Trying again" not in run.stderr

    # the worker runs them (one fails into the dead-letter queue)
    log = tmp_path / "worker.log"
    operator = users["operator"].split("//", 1)[1].split(":", 1)[0]  # conformance's CANCEL, INFO
    worker = worker_start(users["worker"], QUEUE, log, control_users=(operator,))
    try:
        wait_until(lambda: depth(users["operator"], f"ojs.queue.dlx.{QUEUE}") == 1, 60,
                   "the failing job's dead letter")
        # the ready count is 0 once the worker holds them: the log says they ran
        for job in (now, later):
            wait_until(lambda j=job: f"Task math.add[{j.id}] succeeded" in log.read_text(),
                       60, f"job {job.id} to run")
        # the producer's user reads no dead letter either
        listed = cli(users["producer"], "dlq", "list", "-q", QUEUE)
        assert listed.returncode == 1 and "Traceback" not in listed.stderr, listed.stderr
        assert json.loads(listed.stdout)["error"] == "permission_refused"
        # 3.x and 4.0 refuse the Basic.Get (read); 4.2.7+/4.3 already the passive
        # declaration before it, which needs any permission and reports 'configure'
        assert re.search(f"lacks the '(read|configure)' permission on queue "
                         f"'ojs.queue.dlx.{QUEUE}'", listed.stderr), listed.stderr

        # the operator: dlq list, show, replay, purge, and conformance
        listed = cli(users["operator"], "dlq", "list", "-q", QUEUE)
        assert listed.returncode == 0, listed.stderr
        assert [d["job_id"] for d in json.loads(listed.stdout)["dead_letters"]] == [failing.id]
        shown = cli(users["operator"], "dlq", "show", "-q", QUEUE, failing.id)
        assert shown.returncode == 0, shown.stderr
        replayed = cli(users["operator"], "dlq", "replay", "-q", QUEUE, failing.id)
        assert replayed.returncode == 0, replayed.stderr
        wait_until(lambda: depth(users["operator"], f"ojs.queue.dlx.{QUEUE}") == 1, 60,
                   "the replayed job to fail again")
        purged = cli(users["operator"], "dlq", "purge", "-q", QUEUE, "--yes")
        assert purged.returncode == 0 and json.loads(purged.stdout)["deleted"] == 1
        report = cli(users["operator"], "conformance", "-q", QUEUE)
        checks = {c["id"]: c for c in json.loads(report.stdout)["checks"]}
        failed = {i: c["reason"] for i, c in checks.items() if c["status"] == "fail"}
        assert failed == {} and report.returncode == 0, (failed, report.stderr)
    finally:
        worker.stop()

    # the worker's user deletes no other queue: one refusal from the broker (RabbitMQ 4
    # names the permission, 3.x does not), no retry
    worker_app = make_app("perm-worker", users["worker"])
    with (worker_app.connection_for_write() as connection,
          pytest.raises(amqp.exceptions.AccessRefused) as refused):
        connection.default_channel.queue_delete(f"ojs.queue.{QUEUE}-other")
    assert re.search(f"(configure )?access to queue 'ojs.queue.{QUEUE}-other'",
                     str(refused.value)), refused.value
    assert depth(users["operator"], f"ojs.queue.{QUEUE}") == 0  # its own queue is there


def test_a_worker_that_cannot_declare_its_topology_says_so_and_exits(
        users: dict[str, str]) -> None:
    run = worker_run(users["worker"], "notmine")
    assert run.returncode == 1, run.stderr[-3000:]
    assert "worker cannot start: TopologyPermissionError: the broker user lacks the " \
        "'configure' permission on queue 'ojs.queue.notmine'" in run.stderr, run.stderr
    assert "Trying again" not in run.stderr and "Traceback" not in run.stderr
