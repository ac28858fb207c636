"""Fault tests on a three-node RabbitMQ cluster with quorum queues (issue 28, item 1).

Producers and workers are given all three node URLs (kombu failover) and
``ojs_queue_defaults = {"type": "quorum"}``: job, retry, scheduling and
dead-letter queues are quorum queues.  Each test prints ``published /
confirmed / refused / completed / duplicated / lost`` and the longest stall
seen by the producer (between two confirms) and by the workers (between two
completions), and asserts ``lost == 0`` for confirmed jobs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import celery
import pytest
from celery import Celery
from kombu.exceptions import OperationalError

import ojs_kombu
from ojs_kombu.spec.errors import JobPublishError
from ojs_kombu.spec.job_ids import new_job_id

from .app import make_app
from .cluster import Cluster, ClusterNode
from .conftest import ROOT, CompletionClock, Counts, Workers, longest_gap, publish, wait_until

QUORUM = {"ojs_queue_defaults": {"type": "quorum"}}
#: Room for publish retries across a node loss (kombu tries the next URL at once).
PUBLISH_RETRY = {"max_retries": 5}
#: RabbitMQ's at-least-once dead-letter worker offers a dead letter whose forward was not
#: confirmed (its target queue changed leaders meanwhile) again only after
#: ``dead_letter_worker_publisher_confirm_timeout``, 180 s by default on 3.10, 4.0 and
#: 4.3: a delay that runs out across a node restart may end that late, not lost.
DEAD_LETTER_RESEND_S = 180


def producer(cluster: Cluster, **conf: Any) -> Celery:
    return make_app(cluster.broker_url, task_publish_retry_policy=PUBLISH_RETRY,
                    **QUORUM, **conf)


def cluster_workers(cluster: Cluster, tmp_path: Any) -> Workers:
    return Workers(cluster.broker_url, tmp_path / "done.txt", tmp_path / "workers.log", QUORUM)


def queue_counts(cluster: Cluster, prefix: str) -> dict[str, int]:
    """Ready + unacked messages of every queue whose name starts with ``prefix``, read on
    the first node whose app runs."""
    for node in cluster.nodes:
        listing = node.ctl("list_queues", "--no-table-headers", "name", "messages",
                           check=False, timeout=30)
        if listing.strip():
            counts = {}
            for line in listing.splitlines():
                name, _, count = line.partition("\t")
                if name.startswith(prefix) and count.strip().isdigit():
                    counts[name] = int(count)
            return counts
    return {}


def print_what_is_left(cluster: Cluster, counts: Counts, name: str, workers: Workers) -> None:
    """When a wait for the jobs runs out: the cluster's queues and their counts, the jobs'
    counts and the end of the workers' log (what was left, and where it waits)."""
    print(queue_counts(cluster, "ojs."), counts.report(name, workers.done_file),
          workers.log.read_text(errors="replace")[-6000:])


def refusal_is_typed(exc: BaseException, job_id: str) -> bool:
    if isinstance(exc, OperationalError):
        return "(broker ojs://guest:**@127.0.0.1:" in str(exc)
    return isinstance(exc, JobPublishError) and job_id in str(exc)


def stream(cluster: Cluster, app: Celery, workers: Workers, queue: str, total: int,
           disrupt: Callable[[Counts], Any], name: str, pause: float = 0.0,
           stop: Callable[[], str | None] = lambda: None) -> dict[str, Any]:
    """``total`` confirmed jobs published while a worker drains them; ``disrupt`` runs once
    a fifth are confirmed; ``stop`` ends the wait for them early (``wait_completed``).
    Returns the counts and the longest stalls."""
    events: list[dict[str, Any]] = []
    subscription = ojs_kombu.subscribe(app, events.append,
                                       event_types=["connection.reconnected"])
    workers.start(queue, "--pool", "threads", "-c", "4", "--prefetch-multiplier", "4")
    workers.wait_ready()
    counts = Counts()
    thread = threading.Thread(target=publish, args=(app, counts, total),
                              kwargs={"queue": queue, "pause": pause}, daemon=True)
    with CompletionClock(workers.done_file) as clock:
        try:
            thread.start()
            wait_until(lambda: len(counts.confirmed) >= total // 5, 180, "a fifth confirmed")
            disrupted = time.monotonic()
            disrupt(counts)
            thread.join(300)
            assert not thread.is_alive(), "the producer never finished"
            try:
                counts.wait_completed(workers.done_file, timeout=180, stop=stop)
                wait_until(lambda: not any(queue_counts(cluster, f"ojs.queue.{queue}").values()),
                           60, "the queue to drain")
            except AssertionError:
                print_what_is_left(cluster, counts, name, workers)
                raise
        finally:
            subscription.cancel()
            thread.join(1)
    numbers: dict[str, Any] = dict(counts.report(name, workers.done_file))
    numbers["publish_stall_s"] = round(longest_gap(counts.confirmed_at), 1)
    numbers["drain_stall_s"] = round(longest_gap(clock.times), 1)
    numbers["reconnections"] = sum(e["type"] == "connection.reconnected" for e in events)
    refused_at = counts.refused_at
    numbers["refusals_s"] = round(refused_at[-1] - refused_at[0], 1) if refused_at else 0.0
    print(f"[{name}] publish_stall_s={numbers['publish_stall_s']} "
          f"drain_stall_s={numbers['drain_stall_s']} refusals_over_s={numbers['refusals_s']} "
          f"reconnections={numbers['reconnections']} "
          f"disruption_to_drained_s={time.monotonic() - disrupted:.1f}")
    log = workers.log.read_text(errors="replace")
    assert numbers["lost"] == 0, log[-5000:]
    assert numbers["confirmed"] + numbers["refused"] == total
    for job, exc in counts.refused.items():
        assert refusal_is_typed(exc, job), f"{job}: {type(exc)}: {exc}"
    # redelivered: what the worker held unacked (4 x 4 per lost connection, at most
    # two connections); republished: one per producer reconnection or refusal
    assert numbers["duplicated"] <= 2 * 16 + numbers["reconnections"] + numbers["refused"], \
        numbers
    return numbers


#: What Celery's worker stops on when it reconnects to another node while the node that
#: held its connection is down, on RabbitMQ 4.2 and later (docs/support.rst).
PIDBOX_LOCKED = "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue"
PIDBOX_LOCKED_REASON = (
    "RabbitMQ 4.2+ (Khepri) keeps a lost node's exclusive queues until the node returns or "
    "is forgotten: the worker's Celery remote-control queue ({hostname}.celery.pidbox) "
    "stays locked, and Celery's worker stops on 405 RESOURCE_LOCKED (plain Celery alike)")


def keeps_a_lost_nodes_exclusive_queues(cluster: Cluster, lost: ClusterNode) -> bool:
    """Whether the surviving nodes run RabbitMQ 4.2 or later, which no longer delete a
    down node's exclusive queues (rabbitmq-server pull request 14573)."""
    survivor = next(node for node in cluster.nodes if node is not lost)
    version = survivor.ctl("version", check=False).strip().split(".")
    return [int(part) for part in version[:2] if part.isdigit()] >= [4, 2]


def test_kill_9_of_the_queue_leaders_node_under_load(healed_cluster: Cluster,
                                                     tmp_path: Any) -> None:
    """The node holding ``ojs.queue.{q}``'s leader (also the node the producer and the
    worker are connected to: the first URL) is killed with ``kill -9`` while 5,000
    confirmed jobs are published and drained; it stays down until the end."""
    cluster, queue = healed_cluster, "cl-leader"
    workers = cluster_workers(cluster, tmp_path)
    killed: list[ClusterNode] = []

    def kill_leader(counts: Counts) -> None:
        leader = cluster.leader(f"ojs.queue.{queue}")
        leader.kill9()
        killed.append(leader)

    keeps: list[bool] = []

    def pidbox_locked_for_good() -> bool:
        """RabbitMQ 4.2+ and the worker stopped on its locked pidbox (after ojs_kombu's
        30 s wait for the lock): nothing more completes (docs/support.rst)."""
        if not killed or PIDBOX_LOCKED not in workers.log.read_text(errors="replace"):
            return False
        if not keeps:  # asked of the broker once
            keeps.append(keeps_a_lost_nodes_exclusive_queues(cluster, killed[0]))
        return keeps[0]

    def worker_stopped() -> str | None:  # the 180 s wait need not run out
        return "the worker stopped on its locked pidbox queue" \
            if pidbox_locked_for_good() else None

    try:
        numbers = stream(cluster, producer(cluster), workers, queue, 5000, kill_leader,
                         "kill -9 of the leader's node", stop=worker_stopped)
    except AssertionError:
        if pidbox_locked_for_good():
            pytest.xfail(PIDBOX_LOCKED_REASON)
        raise
    finally:
        workers.stop_all()
    assert killed[0].pid is None  # down for the rest of the drain: nothing waited for it
    log = workers.log.read_text(errors="replace")
    others = [node.url.split("@")[1] for node in cluster.nodes if node is not killed[0]]
    assert any(f"reconnected to ojs://guest:**@{other}" in log for other in others), log[-3000:]
    # publishes that reach a surviving node during the leader election are nacked by
    # RabbitMQ (JobNackedError, typed, never confirmed): they are counted, and the
    # election is short
    assert numbers["refusals_s"] < 15, numbers


def test_node_restart_while_retries_and_scheduled_jobs_wait(healed_cluster: Cluster,
                                                            tmp_path: Any) -> None:
    """Retries and ``countdown`` jobs wait in quorum retry and ladder queues led by node 1;
    node 1 is stopped and started again while their delays run out."""
    cluster, queue, n, delay = healed_cluster, "cl-wait", 200, 15.0
    workers = cluster_workers(cluster, tmp_path)
    app = producer(cluster)
    retried = [new_job_id() for _ in range(n)]
    scheduled = [new_job_id() for _ in range(n)]
    counts = Counts(published=retried + scheduled, confirmed=retried + scheduled)
    try:
        workers.start(queue, "--pool", "threads", "-c", "4")
        workers.wait_ready()
        for job_id in retried:
            app.tasks["faults.retry_once"].apply_async((delay,), queue=queue, task_id=job_id)
        for job_id in scheduled:
            app.tasks["faults.record"].apply_async(queue=queue, task_id=job_id,
                                                   countdown=delay)
        all_due = time.monotonic() + delay
        retry_queue = f"ojs.queue.retry.{queue}."
        wait_until(lambda: sum(queue_counts(cluster, retry_queue).values()) >= n, 60,
                   "every first attempt to wait in its retry queue")
        assert not counts.completions(workers.done_file)  # nothing ran before its delay
        node = cluster.nodes[0]
        restarted = time.monotonic()
        with CompletionClock(workers.done_file) as clock:
            node.stop()
            # every delay runs out while the node is down
            time.sleep(max(all_due - time.monotonic(), 0) + 1)
            node.start()
            node.await_up()
            try:
                counts.wait_completed(workers.done_file, timeout=DEAD_LETTER_RESEND_S + 120)
            except AssertionError:
                print_what_is_left(cluster, counts, "node restart while jobs wait", workers)
                raise
        numbers = counts.report("node restart while jobs wait", workers.done_file)
        print(f"[node restart while jobs wait] all done {clock.times[-1] - restarted:.1f}s "
              "after the stop")
    finally:
        workers.stop_all()
    assert numbers["lost"] == 0, workers.log.read_text(errors="replace")[-5000:]
    assert numbers["completed"] == 2 * n
    assert numbers["duplicated"] <= 16, numbers  # a worker's unacked window at most


def test_minority_by_stopping_two_nodes_apps_in_turn(healed_cluster: Cluster,
                                                     tmp_path: Any) -> None:
    """Node 2's app stops (a majority remains), then node 3's: node 1, where the clients
    are, is a minority and its quorum queues cannot confirm; then both come back.  A
    publish the minority cannot confirm raises ``PublishConfirmTimeout`` after
    ``ojs_confirm_timeout``; every confirmed job runs."""
    cluster, queue = healed_cluster, "cl-minority"
    workers = cluster_workers(cluster, tmp_path)
    _, second, third = cluster.nodes

    def minority(counts: Counts) -> None:
        second.ctl("stop_app")
        time.sleep(3)
        third.ctl("stop_app")
        time.sleep(8)  # node 1 alone: no quorum
        third.ctl("start_app")
        second.ctl("start_app")
        third.await_up()
        second.await_up()

    try:
        numbers = stream(cluster, producer(cluster, ojs_confirm_timeout=5.0), workers, queue,
                         4000, minority, "minority by stop_app of two nodes", pause=0.005)
    finally:
        workers.stop_all()
    assert numbers["publish_stall_s"] >= 5, numbers  # the minority did hold publishes


# Seen once on Celery 5.5.3 / kombu 5.5.4 (the oldest row): after --recovery deleted the
# quorum control queue, no worker consumed it again within 30 s (AMQP-026/027), where the
# newest row passed in the same run.  Not strict: the rows that pass still show it.
@pytest.mark.xfail(celery.VERSION[:2] < (5, 6), strict=False,
                   reason="AMQP-026/027 on a quorum cluster under Celery 5.5: under study")
def test_ojs_kombu_conformance_on_the_cluster_with_quorum_queues(healed_cluster: Cluster,
                                                                tmp_path: Path) -> None:
    """``ojs-kombu conformance --schedule --recovery`` given all three node URLs, a worker
    of the queue running the probe tasks, every queue a quorum queue: no row fails,
    AMQP-032 passes, and so do the rows watching the worker and the producer."""
    cli = shutil.which("ojs-kombu", path=str(Path(sys.executable).parent))
    assert cli, "ojs-kombu is not installed next to this interpreter"
    # a BEAT within --job-timeout (the default ojs_job_heartbeat, 30 s, needs up to 60 s)
    workers = Workers(healed_cluster.broker_url, tmp_path / "done.txt",
                      tmp_path / "workers.log", {**QUORUM, "ojs_job_heartbeat": 5})
    try:
        workers.start("conformance", "--pool", "threads", "-c", "4")
        workers.wait_ready()
        env = {**os.environ, "OJS_FAULTS_BROKER_URL": healed_cluster.broker_url,
               "OJS_FAULTS_CONF": json.dumps(QUORUM),
               "OJS_FAULTS_DONE_FILE": str(tmp_path / "done.txt")}
        started = time.monotonic()
        result = subprocess.run(
            [cli, "conformance", "-A", "faults.app", "-q", "conformance", "--schedule",
             "--recovery", "--job-timeout", "40", "--json"],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=150, check=False)
        took = time.monotonic() - started
    finally:
        workers.stop_all()
    try:
        report = json.loads(result.stdout)
    except ValueError:
        raise AssertionError(f"not JSON (rc {result.returncode}): {result.stdout!r} "
                             f"{result.stderr[-2000:]!r}") from None
    checks = {c["id"]: c for c in report["checks"]}
    statuses = {s: sorted(i for i, c in checks.items() if c["status"] == s)
                for s in ("pass", "warn", "n/a", "fail")}
    print(f"\nconformance on the cluster in {took:.0f}s: "
          + ", ".join(f"{len(ids)} {s}" for s, ids in statuses.items()))
    for check_id, check in sorted(checks.items()):
        if check["status"] != "pass" or check_id in ("AMQP-009", "AMQP-019", "AMQP-020",
                                                     "AMQP-025", "AMQP-026", "AMQP-027",
                                                     "AMQP-029", "AMQP-032"):
            print(f"  {check_id} {check['status']}: {check['reason']}")
    assert len(checks) == 32
    assert {i: c["reason"] for i, c in checks.items() if c["status"] == "fail"} == {}
    assert result.returncode == 0 and report["ok"] is True
    assert checks["AMQP-032"]["status"] == "pass", checks["AMQP-032"]
    assert "a worker of conformance nacked" in checks["AMQP-009"]["reason"]
    for check_id in ("AMQP-019", "AMQP-020", "AMQP-022", "AMQP-025", "AMQP-026", "AMQP-027",
                     "AMQP-029"):
        assert checks[check_id]["status"] == "pass", checks[check_id]
