"""Who may CANCEL and INFO which queue's jobs, and where an INFO answer may go, against
the real broker and a ``celery -A integration.cliapp worker`` started as users start it
(prefork, gossip, mingle, heartbeats and events on).

Two producer users with docs/production.rst's producer permissions, one scoped to
``email`` and one to ``billing``, in the module's own vhost; the worker runs as
``guest`` with ``ojs_control_users`` authorising each producer for its own queue.
The ``email`` user can publish to every control queue (RabbitMQ checks *write* on
``ojs.exchange.direct``, never the routing key): its requests about ``billing``'s
jobs must change and tell nothing.  An authorised requester's INFO naming a job,
dead-letter, control or shared queue as ``reply_to`` writes nothing there, in bulk,
while good jobs run and good INFO requests are answered.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import amqp
import pytest
from celery import Celery

from ojs_kombu.amqp.broker.control import ControlClient
from ojs_kombu.spec.errors import ControlForbidden, TopologyPermissionError
from ojs_kombu.spec.job_ids import new_job_id

from .apps import make_app
from .conftest import HOST, PORT, broker_version, private_vhost, rabbitmqctl, wait_until
from .test_permissions import documented_permissions
from .workers import WorkerProcess, launch_worker

EMAIL, BILLING, AUDIT = "email", "billing", "audit"
#: Hostile INFO requests per ``reply_to`` target, sent while good work goes on.
HOSTILE_EACH = 60
GOOD_JOBS = 200


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The vhost, one producer user per queue (documented producer pattern) and a
    default ``celery worker`` of ``email`` and ``billing`` as ``guest``."""
    producer = documented_permissions()["producer"]
    token = uuid.uuid4().hex[:6]
    users = {q: f"ojs-{q}-producer-{token}" for q in (EMAIL, BILLING)}
    log = tmp_path_factory.mktemp("control-access") / "worker.log"
    with private_vhost("ojs-kombu-control") as vhost:
        made: list[str] = []
        try:
            urls = {}
            for queue, user in users.items():
                rabbitmqctl("add_user", user, "secret")
                made.append(user)
                rabbitmqctl("set_permissions", "-p", vhost, user,
                            *(re.sub(r"\blp\b", queue, p) for p in producer))
                urls[queue] = f"ojs://{user}:secret@{HOST}:{PORT}/{vhost}"
            guest = f"ojs://guest:guest@{HOST}:{PORT}/{vhost}"
            control_users = json.dumps({EMAIL: [users[EMAIL]], BILLING: [users[BILLING]]})
            with launch_worker(guest, "integration.cliapp", [EMAIL, BILLING], pool="prefork",
                               concurrency=4, log=log, control=True, without=(),
                               env={"OJS_TEST_RESULT_BACKEND": "none",
                                    "OJS_TEST_CONTROL_USERS": control_users}) as worker:
                yield {"vhost": vhost, "urls": urls, "guest": guest, "users": users,
                       "worker": worker}
        finally:
            for user in made:
                rabbitmqctl("delete_user", user)


@pytest.fixture(scope="module")
def producer(site: dict[str, Any]) -> Celery:
    return make_app("control-access-producer", site["guest"], None)


def log_has(worker: WorkerProcess, pattern: str) -> bool:
    return re.search(pattern, worker.log_text()) is not None


def broker_refuses_first() -> bool:
    """RabbitMQ 4.2.6 and later ask a permission on a queue for a passive declaration of
    it: the email user's client is refused its check of billing's topology by the broker
    itself, before a request is sent (and the worker's rule is not reached)."""
    return broker_version() >= (4, 2, 6)


def test_an_email_user_can_neither_cancel_nor_inspect_a_billing_job(
        site: dict[str, Any], producer: Celery) -> None:
    worker = site["worker"]
    send = producer.tasks["loop.until_cancelled"].apply_async
    running = send((120,), queue=BILLING).id
    with ControlClient(site["urls"][EMAIL]) as email, \
            ControlClient(site["urls"][BILLING]) as billing:
        assert billing.user_id == site["users"][BILLING]
        assert wait_until(lambda: billing.info(running, BILLING, timeout=10)["state"]
                          == "active", 60, "the billing job to run")
        if broker_refuses_first():
            with pytest.raises(TopologyPermissionError, match=r"ojs\.queue\.billing"):
                email.info(running, BILLING, timeout=30)
            with pytest.raises(TopologyPermissionError, match=r"ojs\.queue\.billing"):
                email.cancel(running, BILLING, reason="hostile")
        else:
            # through billing's control queue: refused, answered forbidden, nothing of it
            with pytest.raises(ControlForbidden, match="not authorised") as refused:
                email.info(running, BILLING, timeout=30)
            assert "active" not in str(refused.value) and "attempt" not in str(refused.value)
            email.cancel(running, BILLING, reason="hostile")
            wait_until(lambda: log_has(worker, f"CANCEL of job {running}: refused: broker "
                                       f"user '{site['users'][EMAIL]}' is not authorised"),
                       30, "the refused CANCEL in the worker's log")
        # through its own control queue: the job is not one of email's
        assert email.info(running, EMAIL, timeout=10)["state"] in ("unknown", "not_found")
        email.cancel(running, EMAIL, reason="hostile")
        wait_until(lambda: log_has(worker, f"cancel of job {running} refused: it is not a "
                                   f"job of queue '{EMAIL}'"), 30, "the scoped refusal")
        # a request that names no user is refused as well
        anonymous = ControlClient(site["guest"])
        with anonymous:
            anonymous.user_id = None
            anonymous.cancel(running, BILLING)
            wait_until(lambda: log_has(worker, f"CANCEL of job {running}: refused: the "
                                       "request has no user_id"), 30, "the anonymous refusal")
        # still running, for the user who may ask
        assert billing.info(running, BILLING, timeout=10)["state"] == "active"
        billing.cancel(running, BILLING, reason="authorised")
        assert wait_until(lambda: billing.info(running, BILLING, timeout=10)["state"]
                          == "cancelled", 60, "the authorised cancel")


def test_a_cancel_before_the_job_arrives_cancels_only_a_job_of_its_queue(
        site: dict[str, Any], producer: Celery) -> None:
    """The attack seen: a billing job cancelled by the email user before it ran."""
    worker = site["worker"]
    add = producer.tasks["math.add"]
    later = add.apply_async((2, 3), queue=BILLING, countdown=20).id
    mine = add.apply_async((4, 5), queue=EMAIL, countdown=20).id
    with ControlClient(site["urls"][EMAIL]) as email:
        if broker_refuses_first():
            with pytest.raises(TopologyPermissionError, match=r"ojs\.queue\.billing"):
                email.cancel(later, BILLING)
        else:
            email.cancel(later, BILLING)
        email.cancel(later, EMAIL)   # recorded for email's jobs only
        email.cancel(mine, EMAIL)    # its own: honoured
        wait_until(lambda: log_has(worker, f"cancel of job {mine}: not on this worker"), 30,
                   "the CANCELs handled")
        assert wait_until(lambda: email.info(mine, EMAIL, timeout=10)["state"]
                          == "cancelled", 90, "its own job cancelled as it arrives")
    with ControlClient(site["urls"][BILLING]) as billing:
        assert wait_until(lambda: billing.info(later, BILLING, timeout=10)["state"]
                          == "completed", 90, "the billing job to run anyway")
    text = worker.log_text()
    # the CANCEL through email's control queue was held before the job arrived
    assert text.index(f"cancel of job {later}: not on this worker") \
        < text.index(f"[{later}] received")


def _depth(channel: amqp.Channel, queue: str) -> int:
    return int(channel.queue_declare(queue, passive=True).message_count)


def test_info_answers_never_go_to_a_queue_that_is_not_the_requesters_own(
        site: dict[str, Any], producer: Celery) -> None:
    worker = site["worker"]
    connection = amqp.Connection(f"{HOST}:{PORT}", virtual_host=site["vhost"])
    connection.connect()
    try:
        channel = connection.channel()
        producer.connection_for_write().ensure_connection().connection.ensure_topology(AUDIT)
        channel.queue_declare("shared-replies", durable=True, auto_delete=False)
        server_named, _, _ = channel.queue_declare("", durable=True, auto_delete=False)
        targets = [f"ojs.queue.{AUDIT}", f"ojs.queue.dlx.{AUDIT}",
                   f"ojs.queue.control.{AUDIT}", f"ojs.queue.dlx.{BILLING}", "shared-replies",
                   server_named]
        before = {t: _depth(channel, t) for t in targets}
        add = producer.tasks["math.add"]
        good = [add.apply_async((n, 1), queue=BILLING).id for n in range(GOOD_JOBS // 2)]
        sent = 0
        for n in range(HOSTILE_EACH):
            for target in targets:
                channel.basic_publish(amqp.Message(
                    json.dumps({"job_id": good[n % len(good)]}), type="ojs.control.info",
                    user_id="guest", reply_to=target, correlation_id=new_job_id()),
                    exchange="ojs.exchange.direct", routing_key=f"ojs.queue.control.{BILLING}")
                sent += 1
            if n == HOSTILE_EACH // 2:
                good += [add.apply_async((n, 2), queue=BILLING).id
                         for n in range(GOOD_JOBS // 2)]
        ran = wait_until(lambda: (lambda text: all(f"[{j}] succeeded" in text for j in good)
                                  and text)(worker.log_text()), 180, "every good job to run")
        sample = good[::10]  # well inside the worker's INFO backlog
        with ControlClient(site["urls"][BILLING]) as billing:
            answers = billing.info_many([(j, BILLING) for j in sample], timeout=60)
        assert {a["state"] for a in answers.values()} == {"completed"}
        after = {t: _depth(channel, t) for t in targets}
        assert after == before, (before, after)
        assert log_has(worker, "is not a reply queue of the requester's own")
        assert log_has(worker, f"{server_named!r} is not exclusive")
        assert worker.alive
        runs = sum(ran.count(f"[{j}] succeeded") for j in good)
        print(f"\nhostile INFO requests: {sent}; good jobs: {len(good)} published, {runs} "
              f"ran, {len(set(good)) - len(good)} duplicate ids; good INFO requests: "
              f"{len(sample)} sent, {len(answers)} answered; messages written into the "
              f"{len(targets)} named queues: {sum(after.values()) - sum(before.values())}")
    finally:
        connection.close()
