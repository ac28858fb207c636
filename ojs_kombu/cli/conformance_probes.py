"""Probe jobs for ``ojs-kombu conformance``: AMQP-005..008, 010..018, 022, 023 and 029.

Behaviour a broker's declarations cannot show is checked with probe jobs on a
probe queue of their own (``ojs-conformance-<random>``): published through
ojs_kombu's publish path, fetched back with ``Basic.Get`` or a consumer,
retried, scheduled; every probe queue is deleted at the end.  What the workers
do (discard, CANCEL, BEAT) is :mod:`.conformance_worker`'s.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import amqp

from ..amqp.binding import Binding
from ..amqp.job_channel import JobDelivery
from ..spec.envelope import CONTENT_TYPE, JobEnvelope
from ..spec.errors import JobNackedError, OJSConfigurationError, UnroutableJobError
from ..spec.failures import JobFailure
from ..spec.job_ids import new_job_id
from .broker import delete_queues, queue_state
from .conformance_report import Results
from .jobs import build_cli_job, publish_cli_job


class Probe:
    """Probe jobs on queues of their own, deleted by :meth:`cleanup`."""

    def __init__(self, amqp_connection: Any, binding: Binding) -> None:
        self.amqp = amqp_connection
        self.binding = binding
        self.names = binding.names
        self.queue = f"ojs-conformance-{uuid.uuid4().hex[:10]}"
        self.full_queue = f"{self.queue}-full"
        self.retry_queues: list[str] = []

    def cleanup(self) -> None:
        doomed = [*self.retry_queues]
        for q in (self.queue, self.full_queue):
            doomed += [self.names.job_queue(q), self.names.dead_letter_queue(q),
                       self.names.control_queue(q), self.names.ready_queue(q)]
        delete_queues(self.amqp, doomed)

    def publish(self, *, eta: datetime | None = None, queue: str | None = None,
                traceparent: str | None = None) -> str:
        job_id = new_job_id()
        publish_cli_job(self.amqp, build_cli_job(
            self.binding, "ojs.conformance.probe", job_id, queue or self.queue, [1, "probe"],
            eta=eta, priority=None, meta=None, retry=None, traceparent=traceparent))
        return job_id

    def get(self, channel: Any, queue: str, job_id: str, timeout: float = 10.0
            ) -> amqp.Message:
        """``Basic.Get`` until ``job_id`` arrives (others are acked away: probes only)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = channel.basic_get(queue, no_ack=False)
            if message is None:
                time.sleep(0.02)
                continue
            if message.properties.get("message_id") == job_id:
                return message
            channel.basic_ack(message.delivery_tag)
        raise TimeoutError(f"probe {job_id} did not arrive in {queue} within {timeout}s")


def _guard(results: Results, ids: list[str], work: Callable[[], None]) -> None:
    """Run one probe; an exception fails every id it was to decide."""
    try:
        work()
    except Exception as exc:
        for check_id in ids:
            results.set(check_id, "fail", f"{type(exc).__name__}: {exc}")


def check_probes(results: Results, amqp_connection: Any, binding: Binding,
                 schedule: bool) -> None:
    """AMQP-005..008, 010..018, 022, 023, 029 with probe jobs; cleans up after itself."""
    probe = Probe(amqp_connection, binding)
    names = binding.names
    # Probes provoke what the package logs as warnings (no Basic.Qos, a full queue, a return).
    package_logger = logging.getLogger("ojs_kombu")
    level = package_logger.level
    package_logger.setLevel(logging.CRITICAL)
    try:
        amqp_connection.ensure_topology(probe.queue)
        _guard(results, ["AMQP-005", "AMQP-010", "AMQP-011", "AMQP-012", "AMQP-013",
                         "AMQP-014", "AMQP-017", "AMQP-018", "AMQP-023"],
               lambda: _publish_probe(results, probe))
        _guard(results, ["AMQP-006", "AMQP-007", "AMQP-008"],
               lambda: _consume_probe(results, probe))
        _guard(results, ["AMQP-022"], lambda: _schedule_probe(results, probe, schedule))
        _guard(results, ["AMQP-029"], lambda: _backpressure_probe(results, probe))
        # last: the job queue goes, the connection still thinks it is declared
        delete_queues(amqp_connection, [names.job_queue(probe.queue)])
        _guard(results, ["AMQP-015", "AMQP-016"], lambda: _unroutable_probe(results, probe))
    finally:
        package_logger.setLevel(level)
        probe.cleanup()


def _publish_probe(results: Results, probe: Probe) -> None:
    names = probe.names
    traceparent = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"
    job_id = probe.publish(traceparent=traceparent)
    results.set("AMQP-014", "pass", "the probe was published in confirm mode and the broker "
                "acked it before the publish returned")
    channel = probe.amqp.channel()
    message = probe.get(channel, names.job_queue(probe.queue), job_id)
    props, info = message.properties, message.delivery_info
    headers = props.get("application_headers") or {}
    if info.get("exchange") == names.direct_exchange and info.get("routing_key") == probe.queue:
        results.set("AMQP-005", "pass", f"the probe came through {names.direct_exchange} with "
                    f"routing key {probe.queue}")
    else:
        results.set("AMQP-005", "fail", f"the probe came through {info.get('exchange')!r} "
                    f"key {info.get('routing_key')!r}")
    _expect(results, "AMQP-010", props.get("content_type"), CONTENT_TYPE, "content_type")
    _expect(results, "AMQP-011", props.get("delivery_mode"), 2, "delivery_mode")
    _expect(results, "AMQP-012", props.get("message_id"), job_id, "message_id")
    envelope: JobEnvelope | None = None
    try:
        envelope = JobEnvelope.from_json(message.body)
    except ValueError as exc:
        results.set("AMQP-013", "fail", f"the body is not a valid OJS job: {exc}")
    else:
        if envelope.id == job_id and envelope.queue == probe.queue:
            results.set("AMQP-013", "pass", "the body is a valid OJS envelope (job.schema) "
                        "with the job's id and queue")
        else:
            results.set("AMQP-013", "fail", "the envelope's id or queue differ from the job's")
    trace = headers.get("x-ojs-trace-id")
    meta = (envelope.meta if envelope else None) or {}
    if trace == traceparent and meta.get("traceparent") == traceparent:
        results.set("AMQP-023", "pass", "traceparent in x-ojs-trace-id and meta.traceparent")
    else:
        results.set("AMQP-023", "fail", f"x-ojs-trace-id is {trace!r}, sent {traceparent!r}")
    if headers.get("x-ojs-attempt") != 1:
        results.set("AMQP-018", "fail", f"a new job has x-ojs-attempt "
                    f"{headers.get('x-ojs-attempt')!r}, not 1")
    # AMQP-017/018: fail the attempt the way a worker does, and wait for the retry
    delivery = JobDelivery(probe.queue, job_id, message.body, dict(props), props.get("type"))
    delay_ms = channel.retry_job(delivery, message.delivery_tag,
                                 JobFailure("HANDLER_ERROR", "ProbeError", "conformance probe"),
                                 0.001)
    probe.retry_queues.append(names.retry_queue(probe.queue, delay_ms))
    retried = probe.get(channel, names.job_queue(probe.queue), job_id)
    channel.basic_ack(retried.delivery_tag)
    retried_headers = retried.properties.get("application_headers") or {}
    deaths = retried_headers.get("x-death") or []
    if any(d.get("queue") == names.retry_queue(probe.queue, delay_ms) for d in deaths) or (
            retried.delivery_info.get("exchange") == names.direct_exchange):
        results.set("AMQP-017", "pass", f"a failed attempt went through "
                    f"{names.retry_exchange} into {names.retry_queue(probe.queue, delay_ms)} "
                    f"(TTL {delay_ms} ms) and dead-lettered back to {names.job_queue(probe.queue)}")
    else:
        results.set("AMQP-017", "fail", "the retried probe did not come back through the "
                    "retry queue's dead-lettering")
    if retried_headers.get("x-ojs-attempt") == 2:
        results.set("AMQP-018", "pass", "x-ojs-attempt 1 on publish, 2 after one failed attempt")
    else:
        results.set("AMQP-018", "fail", f"after one failed attempt x-ojs-attempt is "
                    f"{retried_headers.get('x-ojs-attempt')!r}, not 2")
    channel.close()


def _expect(results: Results, check_id: str, value: Any, expected: Any, what: str) -> None:
    if value == expected:
        results.set(check_id, "pass", f"{what} = {value!r}")
    else:
        results.set(check_id, "fail", f"{what} is {value!r}, not {expected!r}")


def _consume_probe(results: Results, probe: Probe) -> None:
    names = probe.names
    job_queue = names.job_queue(probe.queue)
    first, second = probe.publish(), probe.publish()
    channel = probe.amqp.channel()
    try:
        channel.basic_consume(job_queue, no_ack=True, callback=lambda m: None)
    except OJSConfigurationError:
        results.set("AMQP-006", "pass", "the ojs:// transport refuses no_ack=true on job "
                    "queues; its consumers use no_ack=false")
        channel = probe.amqp.channel()
    else:
        results.set("AMQP-006", "fail", "the transport accepted no_ack=true on a job queue")
        channel.close()
        channel = probe.amqp.channel()
    received: list[amqp.Message] = []
    tag = channel.basic_consume(job_queue, no_ack=False, callback=received.append)
    _drain(probe.amqp, lambda: len(received) >= 1)
    held_back = queue_state(probe.amqp, job_queue).messages
    if len(received) == 1 and held_back == 1:
        results.set("AMQP-007", "pass", "consuming without an explicit Basic.Qos got prefetch "
                    f"{binding_prefetch(probe.binding)}: the second probe waited for the ack")
    else:
        results.set("AMQP-007", "fail", f"{len(received)} deliveries before any ack, "
                    f"{held_back} held back")
    channel.basic_ack(received[0].delivery_tag)
    _drain(probe.amqp, lambda: len(received) >= 2)
    channel.basic_ack(received[1].delivery_tag)
    channel.basic_cancel(tag)
    time.sleep(0.05)
    left = queue_state(probe.amqp, job_queue).messages
    ids = {m.properties.get("message_id") for m in received}
    if ids == {first, second} and left == 0:
        results.set("AMQP-008", "pass", "Basic.Ack with each delivery tag settled both probes")
    else:
        results.set("AMQP-008", "fail", f"acked {sorted(ids)}, {left} message(s) left")
    channel.close()


def binding_prefetch(binding: Binding) -> int:
    return binding.settings.default_prefetch


def _drain(amqp_connection: Any, done: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no probe delivery within {timeout}s")
        try:
            amqp_connection.drain_events(timeout=min(remaining, 0.5))
        except TimeoutError:
            continue


def _schedule_probe(results: Results, probe: Probe, schedule: bool) -> None:
    names = probe.names
    if probe.binding.settings.delayed_exchange:
        ladder = "the delayed-message exchange"
    elif queue_state(probe.amqp, names.schedule_queue(0)).exists or schedule:
        ladder = "the TTL ladder"
    else:
        results.set("AMQP-022", "n/a", "no scheduling ladder in this vhost yet (ojs_kombu "
                    "declares it with the first scheduled job); --schedule declares it and "
                    "probes it")
        return
    started = datetime.now(UTC)
    job_id = probe.publish(eta=started + timedelta(milliseconds=50))
    channel = probe.amqp.channel()
    message = probe.get(channel, names.job_queue(probe.queue), job_id)
    waited = (datetime.now(UTC) - started).total_seconds() * 1000
    channel.basic_ack(message.delivery_tag)
    channel.close()
    if waited >= 50:
        results.set("AMQP-022", "pass", f"a probe scheduled 50 ms ahead arrived after "
                    f"{waited:.0f} ms through {ladder}")
    else:
        results.set("AMQP-022", "fail", f"a probe scheduled 50 ms ahead arrived after "
                    f"{waited:.0f} ms")


def _backpressure_probe(results: Results, probe: Probe) -> None:
    probe.binding.add_queue_arguments(probe.full_queue, {"x-max-length": 0,
                                                         "x-overflow": "reject-publish"})
    # A quorum queue refuses only once it is over its bound: it takes one job past it.
    for taken in range(2):
        try:
            probe.publish(queue=probe.full_queue)
        except JobNackedError:
            over = " after taking one (a quorum queue refuses once over its bound)" \
                if taken else ""
            results.set("AMQP-029", "pass", "a probe queue with x-max-length=0, "
                        f"x-overflow=reject-publish nacked the probe{over}: JobNackedError")
            return
    results.set("AMQP-029", "fail", "a full queue (x-overflow=reject-publish) accepted 2 probes")


def _unroutable_probe(results: Results, probe: Probe) -> None:
    try:
        probe.publish()
    except UnroutableJobError:
        results.set("AMQP-015", "pass", "a job publish to a routing key with no queue was "
                    "returned (mandatory=true)")
        results.set("AMQP-016", "pass", "the Basic.Return became UnroutableJobError")
        return
    results.set("AMQP-015", "fail", "a job publish with no queue bound was not returned: "
                "mandatory is not set, the job was dropped")
