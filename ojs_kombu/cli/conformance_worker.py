"""What the workers and producers of a queue do on the wire: AMQP-009, 019, 020 and 024..028.

Each check watches from outside, as any AMQP client could:

* the worker's own behaviour, with the two probe job types a worker of the
  queue must run (``ojs_kombu.register_conformance_probes(app)``; the example
  app ``examples/proj`` does): ``conformance.fail`` (fails, no retries: the worker must nack it into
  the DLQ, AMQP-009) and ``conformance.sleep`` (runs until cancelled: INFO says
  ``active``, BEAT messages arrive on the control queue, CANCEL ends it,
  AMQP-019/020).  Copies of the queue's dead letters and control messages are
  read from exclusive queues of this check bound beside the real ones, so
  nothing of the workers' is consumed;
* the producer (ojs_kombu in this process): reconnect timing through a local
  TCP proxy (AMQP-025) and 8 threads publishing at once (AMQP-028);
* with ``--recovery``: the control queue a worker consumes is deleted, and the
  worker must declare it again and consume it (AMQP-026, 027);
* with ``--metrics-url``: the AMQP metrics of section 12.1 read back (AMQP-024).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import urllib.request
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import amqp
import kombu

from ..amqp.binding import Binding
from ..amqp.broker.connection import BrokerConnection
from ..amqp.broker.control import HEARTBEAT, ControlClient
from ..amqp.broker.dead_letters import open_dead_letter_queue
from ..amqp.broker.reconnect import ReconnectPolicy
from ..celery.probes import FAIL_TYPE, SLEEP_TYPE
from ..spec.decode import UNKNOWN_JOB_TYPE
from ..spec.errors import ControlError
from ..spec.failures import latest_death
from ..spec.job_ids import new_job_id
from ..spec.naming import TopologyNames
from .broker import delete_queues, queue_state
from .conformance_report import Results, Status
from .jobs import build_cli_job, publish_cli_job
from .local_proxy import LocalProxy

#: Section 12.1's AMQP metrics, as a Prometheus exporter names them.
AMQP_METRICS = ("ojs_amqp_messages_consumed", "ojs_amqp_messages_acked",
                "ojs_amqp_connections_active", "ojs_amqp_channels_active")
NO_PROBE_TASK = ("no worker of {queue} ran a {kind} job within {timeout:.0f}s: run a worker of "
                 "an app that calls ojs_kombu.register_conformance_probes(app) (examples/proj "
                 "does)")
#: Why the worker checks were not run (n/a, not fail): the worker cannot run the probes.
ADD_PROBES = ("not checked: {who} has no conformance probes; add "
              "ojs_kombu.register_conformance_probes(app) where the app is created and restart "
              "the workers of {queue}")
#: The checks that need the probe job types in the worker's app.
PROBE_CHECKS = ("AMQP-009", "AMQP-019", "AMQP-020")


def missing_probes(app: Any, queue: str) -> str | None:
    """Why the worker checks cannot run with ``app`` (the ``-A`` app): it has no probe
    tasks, so its workers would dead-letter the probes as ``UNKNOWN_JOB_TYPE`` into the
    queue's real DLQ.  ``None`` when it has them (or no app was given)."""
    if app is None or {FAIL_TYPE, SLEEP_TYPE} <= set(app.tasks):
        return None
    return ADD_PROBES.format(who=f"the app {app.main or app!s}", queue=queue)


def unknown_probe(message: amqp.Message | None, queue: str) -> str | None:
    """The n/a reason when a probe's dead letter says the worker has no such task."""
    if message is None:
        return None
    headers = message.properties.get("application_headers") or {}
    if headers.get("x-ojs-error-code") != UNKNOWN_JOB_TYPE:
        return None
    return ADD_PROBES.format(who=f"the worker of {queue} (it dead-lettered the probe as "
                             f"{UNKNOWN_JOB_TYPE})", queue=queue)


class Watch:
    """An exclusive queue of this check bound beside a real one: a copy of what it gets."""

    def __init__(self, amqp_connection: Any, exchange: str, routing_key: str) -> None:
        self.channel = amqp_connection.channel()
        self.name, _, _ = self.channel.queue_declare("", exclusive=True, auto_delete=True)
        self.channel.queue_bind(self.name, exchange, routing_key=routing_key)

    def wait_for(self, match: Callable[[amqp.Message], bool], timeout: float
                 ) -> amqp.Message | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = self.channel.basic_get(self.name, no_ack=True)
            if message is None:
                time.sleep(0.1)
            elif match(message):
                return message
        return None

    def poll(self, match: Callable[[amqp.Message], bool]) -> amqp.Message | None:
        """The first message that matches among those here now; ``None`` if none does."""
        while (message := self.channel.basic_get(self.name, no_ack=True)) is not None:
            if match(message):
                return message
        return None

    def close(self) -> None:
        with suppress(Exception):
            self.channel.close()


def check_worker_behaviour(results: Results, connection: kombu.Connection, binding: Binding,
                           queue: str, job_timeout: float, recovery: bool,
                           without_probes: str | None = None) -> None:
    """AMQP-009, 019, 020, 026, 027: what the running workers of ``queue`` do.

    ``without_probes`` (see :func:`missing_probes`): the worker cannot run the probe
    jobs, so none is sent (nothing lands in the queue's DLQ) and their checks are n/a
    with that reason."""
    amqp_connection = connection.connection
    if without_probes is not None:
        for check_id in PROBE_CHECKS:
            results.set(check_id, "n/a", without_probes)
        _each(results, ((["AMQP-026", "AMQP-027"],
                         lambda: _recovery(results, amqp_connection, binding, queue,
                                           recovery)),))
        return
    _each(results, (
        (["AMQP-009"], lambda: _discard(results, connection, binding, queue, job_timeout)),
        (["AMQP-019", "AMQP-020"],
         lambda: _cancel_and_beat(results, connection, binding, queue, job_timeout)),
        (["AMQP-026", "AMQP-027"],
         lambda: _recovery(results, amqp_connection, binding, queue, recovery))))


def check_producer_behaviour(results: Results, connection: kombu.Connection, binding: Binding,
                             metrics_url: str | None) -> None:
    """AMQP-024, 025, 028: ojs_kombu's producer in this process, and a metrics endpoint."""
    _each(results, (
        (["AMQP-025"], lambda: _reconnect(results, connection)),
        (["AMQP-028"], lambda: _threads(results, connection, binding)),
        (["AMQP-024"], lambda: _metrics(results, metrics_url))))


def _each(results: Results, checks: Any) -> None:
    """Run each check; an exception fails every id it was to decide."""
    for ids, work in checks:
        try:
            work()
        except Exception as exc:
            for check_id in ids:
                results.set(check_id, "fail", f"{type(exc).__name__}: {exc}")


def _publish_probe(connection: kombu.Connection, binding: Binding, queue: str,
                   job_type: str, args: list[Any]) -> str:
    job_id = new_job_id()
    publish_cli_job(connection.connection, build_cli_job(
        binding, job_type, job_id, queue, args, eta=None, priority=None, meta=None,
        retry={"max_attempts": 1}))
    return job_id


def _discard(results: Results, connection: kombu.Connection, binding: Binding, queue: str,
             timeout: float) -> None:
    names = binding.names
    watch = Watch(connection.connection, names.dlx_exchange, queue)
    try:
        job_id = _publish_probe(connection, binding, queue, FAIL_TYPE, [])
        dead = watch.wait_for(lambda m: m.properties.get("message_id") == job_id, timeout)
    finally:
        watch.close()
    if dead is None:
        results.set("AMQP-009", "fail", NO_PROBE_TASK.format(queue=queue, kind=FAIL_TYPE,
                                                             timeout=timeout)
                    + "; or the worker did not dead-letter it")
        return
    _delete_dead_letter(connection, queue, job_id)  # the probe leaves nothing behind
    unknown = unknown_probe(dead, queue)
    if unknown is not None:
        results.set("AMQP-009", "n/a", unknown)
        return
    results.set("AMQP-009", *discard_verdict(dead, queue, names))


def discard_verdict(dead: amqp.Message, queue: str, names: TopologyNames) -> tuple[Status, str]:
    """AMQP-009's status and reason for the dead letter of the failing probe job."""
    headers = dead.properties.get("application_headers") or {}
    latest = latest_death(headers) or {}
    if latest.get("reason") == "rejected" and latest.get("queue") == names.job_queue(queue):
        return "pass", (f"a worker of {queue} nacked a failing {FAIL_TYPE} job "
                        f"(requeue=false): it reached {names.dead_letter_queue(queue)} with "
                        "x-death reason rejected")
    if headers.get("x-ojs-error-code"):
        return "warn", (f"a worker of {queue} published the failing {FAIL_TYPE} job to the "
                        "DLX with its error (x-ojs-error-code) and acked it, instead of "
                        "Basic.Nack: ojs_dead_letter_mode='republish', an opt-in (a documented "
                        "deviation, so the dead letter says why); ojs_dead_letter_mode='nack', "
                        "the default, meets AMQP-009 as written")
    return "fail", (f"the failing {FAIL_TYPE} job reached the DLQ without a worker's "
                    "Basic.Nack (no x-death 'rejected') nor its error (no x-ojs-error-code)")


def _delete_dead_letter(connection: kombu.Connection, queue: str, job_id: str) -> None:
    with suppress(Exception), open_dead_letter_queue(connection.clone(), queue) as dlq:
        dlq.delete(job_id)


def _cancel_and_beat(results: Results, connection: kombu.Connection, binding: Binding,
                     queue: str, timeout: float) -> None:
    names = binding.names
    control = names.control_queue(queue)
    watch = Watch(connection.connection, names.direct_exchange, control)
    dead_letters = Watch(connection.connection, names.dlx_exchange, queue)
    try:
        with ControlClient(_Source(connection)) as client:
            job_id = _publish_probe(connection, binding, queue, SLEEP_TYPE, [timeout + 60])
            dead: list[amqp.Message] = []

            def state() -> str | None:
                with suppress(ControlError):
                    return client.info(job_id, queue, timeout=2).get("state")
                return None

            def started_or_dead() -> bool:
                found = dead_letters.poll(
                    lambda m: m.properties.get("message_id") == job_id)
                if found is not None:
                    dead.append(found)
                    return True
                return state() == "active"

            if not _until(started_or_dead, timeout) or dead:
                reason = unknown_probe(dead[0] if dead else None, queue) or NO_PROBE_TASK.format(
                    queue=queue, kind=SLEEP_TYPE, timeout=timeout)
                status: Status = "n/a" if dead and reason.startswith("not checked") else "fail"
                results.set("AMQP-019", status, reason)
                results.set("AMQP-020", status, reason)
                client.cancel(job_id, queue)
                _delete_dead_letter(connection, queue, job_id)
                return
            beat = watch.wait_for(lambda m: m.properties.get("type") == HEARTBEAT
                                  and json.loads(m.body).get("job_id") == job_id, timeout)
            if beat is not None:
                body = beat.body.decode() if isinstance(beat.body, bytes) else beat.body
                results.set("AMQP-020", "pass", f"{HEARTBEAT} for the running probe on "
                            f"{control}: {body[:120]}")
            else:
                results.set("AMQP-020", "fail", f"no {HEARTBEAT} for a job running "
                            f"{timeout:.0f}s (is ojs_job_heartbeat above it?)")
            started = time.monotonic()
            client.cancel(job_id, queue, reason="conformance probe")
            if _until(lambda: state() == "cancelled", 30):
                results.set("AMQP-019", "pass", f"a running {SLEEP_TYPE} job was CANCELled "
                            f"through {control}: INFO active, then cancelled after "
                            f"{time.monotonic() - started:.1f}s")
            else:
                results.set("AMQP-019", "fail", "a running job was still not cancelled 30s "
                            "after CANCEL")
    finally:
        watch.close()
        dead_letters.close()


def _reconnect(results: Results, connection: kombu.Connection) -> None:
    """ojs_kombu's producer connection through a proxy that goes down: its waits."""
    with LocalProxy(connection.hostname or "127.0.0.1", connection.port or 5672) as proxy:
        url = connection.as_uri(include_password=True).split("@", 1)
        through = f"{url[0]}@127.0.0.1:{proxy.port}/{connection.virtual_host.lstrip('/')}"
        client = BrokerConnection(through, connect_timeout=2, ssl=_through_proxy(connection),
                                  transport_options=connection.transport_options)
        client.reconnect_policy = ReconnectPolicy(max_delay=4.0)
        client.ensure_connection(max_retries=0)
        started = proxy.cut()
        client.collect()
        with suppress(Exception):
            client.ensure_connection(max_retries=3, errback=lambda *_: None)  # no log
        client.release()
        attempts = proxy.attempts_since(started)
    gaps = [round(b - a, 1) for a, b in itertools.pairwise(attempts)]
    expected = [1.0, 2.0, 4.0][:len(gaps)]
    if len(gaps) == 3 and all(0.7 * e <= g <= 1.3 * e + 0.5 for g, e in zip(gaps, expected,
                                                                              strict=True)):
        results.set("AMQP-025", "pass", f"through a local proxy that went down, the "
                    f"producer tried again after {', '.join(map(str, gaps))} s (1, 2, 4 "
                    "+-25 %)")
    else:
        results.set("AMQP-025", "fail", f"reconnect attempts {gaps} s apart, not 1, 2, 4")


def _through_proxy(connection: kombu.Connection) -> Any:
    """The connection's TLS options (``broker_use_ssl``) for a connection to it through
    the local proxy: the certificate is still checked against the broker's name."""
    if not connection.ssl:
        return False
    options = dict(connection.ssl) if isinstance(connection.ssl, dict) else {}
    options.setdefault("server_hostname", connection.hostname)
    return options


def _threads(results: Results, connection: kombu.Connection, binding: Binding) -> None:
    """8 threads publish 5 probe jobs each, every thread on its own channel."""
    probe_queue = f"ojs-conformance-threads-{new_job_id()[-8:]}"
    names = binding.names
    errors: list[Exception] = []

    def publish() -> None:
        own = connection.clone()
        try:
            own.ensure_connection(max_retries=0)
            channel = own.connection.channel()
            for _ in range(5):
                channel.publish_job(build_cli_job(
                    binding, "conformance.probe", new_job_id(), probe_queue, [], eta=None,
                    priority=None, meta=None, retry=None))
        except Exception as exc:
            errors.append(exc)
        finally:
            own.release()

    connection.connection.ensure_topology(probe_queue)
    try:
        threads = [threading.Thread(target=publish) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        stored = queue_state(connection.connection, names.job_queue(probe_queue)).messages
    finally:
        delete_queues(connection.connection, [names.job_queue(probe_queue),
                                              names.dead_letter_queue(probe_queue),
                                              names.control_queue(probe_queue)])
    if not errors and stored == 40:
        results.set("AMQP-028", "pass", "8 threads, each on a channel of its own, published "
                    "5 jobs each at once: 40 confirmed and stored")
    else:
        results.set("AMQP-028", "fail", f"{stored} of 40 jobs stored; errors: {errors[:2]}")


def _recovery(results: Results, amqp_connection: Any, binding: Binding, queue: str,
              recovery: bool) -> None:
    control = binding.names.control_queue(queue)
    if not recovery:
        reason = (f"not run: --recovery deletes {control} (a queue the workers consume) and "
                  "watches them declare it again and consume it (their job consumers stay)")
        results.set("AMQP-026", "n/a", reason)
        results.set("AMQP-027", "n/a", reason)
        return
    channel = amqp_connection.channel()
    channel.queue_delete(control)
    channel.close()
    started = time.monotonic()
    back = _until(lambda: (queue_state(amqp_connection, control).consumers or 0) > 0, 30)
    took = time.monotonic() - started
    if back:
        results.set("AMQP-026", "pass", f"{control}, deleted, was declared again by its "
                    f"worker ({took:.1f}s)")
        results.set("AMQP-027", "pass", "the worker handled the consumer cancellation and "
                    f"consumes {control} again ({took:.1f}s)")
    else:
        reason = f"{control} was deleted and no worker consumes it again after 30s"
        results.set("AMQP-026", "fail", reason)
        results.set("AMQP-027", "fail", reason)


def _metrics(results: Results, metrics_url: str | None) -> None:
    if not metrics_url:
        results.set("AMQP-024", "n/a", "metrics are exported by each process (OpenTelemetry); "
                    "--metrics-url URL reads a worker's Prometheus endpoint back")
        return
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    missing = [name for name in AMQP_METRICS if name not in text]
    if missing:
        results.set("AMQP-024", "fail", f"{metrics_url} has no {', '.join(missing)}")
    else:
        results.set("AMQP-024", "pass", f"{metrics_url} exports {', '.join(AMQP_METRICS)}")


def _until(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.25)
    return False


class _Source:
    """ControlClient takes an app; give it a clone of the checked connection."""

    def __init__(self, connection: kombu.Connection) -> None:
        self._connection = connection

    def connection_for_write(self) -> kombu.Connection:
        return self._connection.clone()
