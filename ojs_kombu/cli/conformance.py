"""``ojs-kombu conformance --queue Q``: a live broker and app against AMQP-001..032.

Declarations of ``Q`` are checked read-only (see :mod:`.broker`).  Behaviour
is checked with probe jobs on a probe queue of its own
(``ojs-conformance-<random>``): published through ojs_kombu's publish path,
fetched back with ``Basic.Get`` or a consumer, rejected into the DLQ, retried,
scheduled; every probe queue is deleted at the end.  The control plane is
checked against the running workers of ``Q`` (a consumer on its control queue
and an INFO answer).  Requirements that are client-side behaviour a broker
cannot show (reconnection, metrics, threading) are "n/a", with the reason.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import amqp
import click
import kombu

from ..amqp.binding import Binding
from ..amqp.control import ControlClient
from ..amqp.delivery import JobDelivery
from ..spec.envelope import CONTENT_TYPE, JobEnvelope
from ..spec.errors import (
    ControlError,
    JobNackedError,
    OJSConfigurationError,
    UnroutableJobError,
)
from ..spec.failures import JobFailure
from ..spec.job_ids import new_job_id
from .broker import binding_of, connect, delete_queues, queue_name, queue_state
from .common import EXIT_FAILED, EXIT_NOT_FOUND, CLIError, OJSCommand, common_options, emit
from .common import options as cli_options
from .jobs import job_message
from .topology import inspect_topology

Status = Literal["pass", "fail", "warn", "n/a"]

#: Section 13.1 of the binding: id -> (requirement, MUST/SHOULD).
REQUIREMENTS: dict[str, tuple[str, str]] = {
    "AMQP-001": ("ojs.exchange.direct is a durable direct exchange", "MUST"),
    "AMQP-002": ("ojs.exchange.dlx is a durable direct exchange", "MUST"),
    "AMQP-003": ("job queue: durable, not exclusive/auto-delete", "MUST"),
    "AMQP-004": ("x-dead-letter-exchange on the job queue", "MUST"),
    "AMQP-005": ("PUSH = Basic.Publish on ojs.exchange.direct", "MUST"),
    "AMQP-006": ("FETCH = Basic.Consume with no_ack=false", "MUST"),
    "AMQP-007": ("Basic.Qos prefetch before consuming", "MUST"),
    "AMQP-008": ("ACK = Basic.Ack with the delivery tag", "MUST"),
    "AMQP-009": ("FAIL (discard) = Basic.Nack requeue=false", "MUST"),
    "AMQP-010": ("content_type application/openjobspec+json", "MUST"),
    "AMQP-011": ("delivery_mode=2", "MUST"),
    "AMQP-012": ("message_id = job id", "MUST"),
    "AMQP-013": ("JSON body per the JSON format", "MUST"),
    "AMQP-014": ("publisher confirms", "MUST"),
    "AMQP-015": ("mandatory=true on job publishes", "SHOULD"),
    "AMQP-016": ("Basic.Return handled", "MUST"),
    "AMQP-017": ("retry via DLX + TTL (or delayed exchange)", "MUST"),
    "AMQP-018": ("attempts tracked in x-ojs-attempt", "MUST"),
    "AMQP-019": ("CANCEL via the control queue", "MUST"),
    "AMQP-020": ("BEAT via control queue or connection heartbeat", "MUST"),
    "AMQP-021": ("INFO via RPC reply-to", "SHOULD"),
    "AMQP-022": ("scheduled jobs via delayed delivery", "MUST"),
    "AMQP-023": ("W3C trace context in headers", "MUST"),
    "AMQP-024": ("AMQP-specific metrics", "SHOULD"),
    "AMQP-025": ("reconnect with exponential backoff", "MUST"),
    "AMQP-026": ("re-declare topology after reconnecting", "MUST"),
    "AMQP-027": ("consumer cancellation notifications", "MUST"),
    "AMQP-028": ("channel per thread or channel pool", "MUST"),
    "AMQP-029": ("x-max-length / x-overflow backpressure", "SHOULD"),
    "AMQP-030": ("x-max-priority priority queues", "SHOULD"),
    "AMQP-031": ("OJS entity naming", "MUST"),
    "AMQP-032": ("quorum queues for durability", "SHOULD"),
}

#: Requirements about a client's own behaviour, which no broker can show to another client.
CLIENT_SIDE = {
    "AMQP-020": "BEAT travels between each worker and the broker (60 s connection "
                "heartbeats, ojs.control.heartbeat while a job runs long); another client "
                "cannot see it",
    "AMQP-024": "metrics are exported in-process (OpenTelemetry), not over AMQP",
    "AMQP-025": "reconnection is client-side behaviour of each worker and producer",
    "AMQP-026": "re-declaration after a reconnect is client-side behaviour",
    "AMQP-027": "consumer cancel notifications are handled inside each worker",
    "AMQP-028": "the channel model is internal to each process",
}


@dataclass
class Check:
    id: str
    status: Status
    reason: str

    @property
    def requirement(self) -> str:
        return REQUIREMENTS[self.id][0]

    @property
    def level(self) -> str:
        return REQUIREMENTS[self.id][1]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "requirement": self.requirement, "level": self.level}


class Results:
    """Checks by id; the first verdict for an id wins, missing ids are reported as not run."""

    def __init__(self) -> None:
        self.checks: dict[str, Check] = {}

    def set(self, check_id: str, status: Status, reason: str) -> None:
        if check_id not in self.checks:
            self.checks[check_id] = Check(check_id, status, reason)

    def ordered(self) -> list[Check]:
        return [self.checks.get(i) or Check(i, "fail", "not checked (an earlier probe failed)")
                for i in REQUIREMENTS]


def exit_code(checks: list[Check]) -> int:
    """0 when nothing failed; ``warn`` (an unmet SHOULD) and ``n/a`` do not fail."""
    return EXIT_FAILED if any(c.status == "fail" for c in checks) else 0


def render_table(checks: list[Check], width: int = 120) -> str:
    """The checks as a fixed-width table (``width`` columns) with a summary line."""
    id_w, status_w = 8, 4
    req_w = min(max(len(c.requirement) for c in checks), 48)
    reason_w = max(30, width - id_w - status_w - req_w - 8)
    lines = [f"{'id':<{id_w}}  {'':<{status_w}}  {'requirement':<{req_w}}  reason",
             f"{'-' * id_w}  {'-' * status_w}  {'-' * req_w}  {'-' * reason_w}"]
    for check in checks:
        reason = _wrap(check.reason, reason_w)
        requirement = check.requirement[:req_w]
        lines.append(f"{check.id:<{id_w}}  {check.status.upper():<{status_w}}  "
                     f"{requirement:<{req_w}}  {reason[0]}")
        indent = " " * (id_w + status_w + req_w + 6)
        lines.extend(indent + more for more in reason[1:])
    counts = {s: sum(c.status == s for c in checks) for s in ("pass", "fail", "warn", "n/a")}
    lines.append(f"{counts['pass']} pass, {counts['fail']} fail, {counts['warn']} warn "
                 f"(SHOULD not met), {counts['n/a']} n/a")
    return "\n".join(lines)


def _width() -> int:
    import shutil

    return max(100, shutil.get_terminal_size((120, 24)).columns)


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width) or [""]


# -- live checks ------------------------------------------------------------------------


def check_declarations(results: Results, amqp_connection: Any, binding: Binding,
                       queue: str) -> dict[str, Any]:
    """AMQP-001..004, 019 (existence), 030..032 on ``queue`` as the broker holds it."""
    names = binding.names
    topo = inspect_topology(amqp_connection, binding, queue)
    exchanges = {e["name"]: e for e in topo["exchanges"]}
    queues = {q["role"]: q for q in topo["queues"]}
    for check_id, name in (("AMQP-001", names.direct_exchange), ("AMQP-002", names.dlx_exchange)):
        found = exchanges[name]
        if not found["exists"]:
            results.set(check_id, "fail", f"{name} does not exist")
        elif found["differences"]:
            results.set(check_id, "fail", f"{name}: {_describe(found['differences'])}")
        else:
            results.set(check_id, "pass", f"{name}: re-declaration as durable direct accepted")
    job = queues["job"]
    if not job["exists"]:
        raise CLIError(f"unknown queue: {names.job_queue(queue)} does not exist", EXIT_NOT_FOUND,
                       "not_found")
    differences = job["differences"]
    properties = {k: v for k, v in differences.items() if not k.startswith("x-")}
    if properties:
        results.set("AMQP-003", "fail", f"{job['name']}: {_describe(properties)}")
        results.set("AMQP-004", "fail", "arguments not comparable: AMQP-003 failed first")
    else:
        results.set("AMQP-003", "pass", f"{job['name']}: re-declaration as durable, "
                    "non-exclusive, non-auto-delete accepted")
        arguments = job["arguments"]
        dlx, key = arguments.get("x-dead-letter-exchange"), arguments.get(
            "x-dead-letter-routing-key")
        if dlx != names.dlx_exchange:
            results.set("AMQP-004", "fail",
                        f"{job['name']} has x-dead-letter-exchange {dlx!r}, not "
                        f"{names.dlx_exchange!r}: failed jobs nacked by a consumer are dropped")
        elif key != queue:
            results.set("AMQP-004", "fail", f"{job['name']} has x-dead-letter-routing-key "
                        f"{key!r}, not {queue!r}: dead letters miss ojs.queue.dlx.{queue}")
        elif not queues["dead letters"]["exists"]:
            results.set("AMQP-004", "fail", f"{names.dead_letter_queue(queue)} does not exist")
        else:
            results.set("AMQP-004", "pass", f"x-dead-letter-exchange={dlx}, "
                        f"x-dead-letter-routing-key={key}; {names.dead_letter_queue(queue)} "
                        "exists")
        queue_type = arguments.get("x-queue-type", "classic")
        if "x-max-priority" in arguments:
            results.set("AMQP-030", "pass", f"x-max-priority={arguments['x-max-priority']}")
        elif queue_type == "quorum":
            results.set("AMQP-030", "n/a", "quorum queues have no x-max-priority")
        else:
            results.set("AMQP-030", "warn", f"{job['name']} has no x-max-priority")
        if queue_type == "quorum":
            results.set("AMQP-032", "pass", "x-queue-type=quorum")
        else:
            results.set("AMQP-032", "warn", f"{job['name']} is a {queue_type} queue; set "
                        f"ojs_queue_arguments={{{queue!r}: {{'x-queue-type': 'quorum'}}}}")
    missing = [q["name"] for q in topo["queues"] if not q["exists"]] + [
        e["name"] for e in topo["exchanges"] if not e["exists"]]
    if missing:
        results.set("AMQP-031", "fail", f"missing: {', '.join(missing)}")
    else:
        results.set("AMQP-031", "pass", f"{names.direct_exchange}, {names.dlx_exchange}, "
                    f"{names.job_queue(queue)}, {names.dead_letter_queue(queue)}, "
                    f"{names.control_queue(queue)}")
    return queues["control"]


def _describe(differences: dict[str, dict[str, Any]]) -> str:
    return "; ".join(f"{k} is {d['current']!r}, expected {d['expected']!r}"
                     for k, d in differences.items())


def check_control_plane(results: Results, control: dict[str, Any], queue: str,
                        connection: kombu.Connection, info_timeout: float) -> None:
    """AMQP-019 and 021 against the running workers of ``queue``."""
    if not control["exists"]:
        reason = f"{control['name']} does not exist"
        results.set("AMQP-019", "fail", reason)
        results.set("AMQP-021", "fail", reason)
        return
    if not control["consumers"]:
        reason = (f"no worker consumes {control['name']}: start a worker for {queue!r} "
                  "(with ojs_control_queues on)")
        results.set("AMQP-019", "fail", reason)
        results.set("AMQP-021", "fail", reason)
        return
    results.set("AMQP-019", "pass", f"{control['name']} is bound to its own name and consumed "
                f"by {control['consumers']} worker(s)")

    class _Source:  # ControlClient takes an app; give it a connection like ours
        def connection_for_write(self) -> kombu.Connection:
            return connection.clone()

    unknown = new_job_id()
    try:
        with ControlClient(_Source()) as client:
            answer = client.info(unknown, queue, timeout=info_timeout)
    except ControlError as exc:
        results.set("AMQP-021", "fail", str(exc))
        return
    # "unknown": the worker's app has no result backend to rule the job out
    if answer.get("state") in ("not_found", "unknown") \
            and answer.get("job_id", unknown) == unknown:
        results.set("AMQP-021", "pass", "a worker answered INFO (reply_to, correlation_id) "
                    f"for an unknown job: {answer['state']}")
    else:
        results.set("AMQP-021", "fail", f"unexpected INFO answer {answer!r}")


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
                       self.names.control_queue(q)]
        delete_queues(self.amqp, doomed)

    def publish(self, *, eta: datetime | None = None, queue: str | None = None,
                headers: dict[str, Any] | None = None) -> str:
        job_id = new_job_id()
        message = job_message("ojs.conformance.probe", job_id, [1, "probe"], eta=eta,
                              priority=None, meta=None, retry=None, headers=headers)
        channel = self.amqp.channel()
        try:
            channel.basic_publish(message, exchange=self.names.direct_exchange,
                                  routing_key=queue or self.queue)
        finally:
            if channel.is_open:
                channel.close()
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
    """AMQP-005..018, 022, 023, 029 with probe jobs; cleans up after itself."""
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
        _guard(results, ["AMQP-009"], lambda: _discard_probe(results, probe))
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
    job_id = probe.publish(headers={"traceparent": traceparent})
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


def _discard_probe(results: Results, probe: Probe) -> None:
    names = probe.names
    job_id = probe.publish()
    channel = probe.amqp.channel()
    message = probe.get(channel, names.job_queue(probe.queue), job_id)
    channel.basic_reject(message.delivery_tag, requeue=False)  # sent as Basic.Nack
    dead = probe.get(channel, names.dead_letter_queue(probe.queue), job_id)
    channel.basic_ack(dead.delivery_tag)
    deaths = (dead.properties.get("application_headers") or {}).get("x-death") or []
    if any(d.get("reason") == "rejected" for d in deaths):
        results.set("AMQP-009", "pass", "Basic.Nack(requeue=false) dead-lettered the probe "
                    f"into {names.dead_letter_queue(probe.queue)} (x-death reason rejected)")
    else:
        results.set("AMQP-009", "fail", f"the probe reached the DLQ without x-death "
                    f"'rejected' ({deaths!r})")
    channel.close()


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
    try:
        probe.publish(queue=probe.full_queue)
    except JobNackedError:
        results.set("AMQP-029", "pass", "a probe queue with x-max-length=0, "
                    "x-overflow=reject-publish nacked the probe: JobNackedError")
        return
    results.set("AMQP-029", "fail", "a full queue (x-overflow=reject-publish) accepted the probe")


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


def run_checks(connection: kombu.Connection, queue: str, info_timeout: float = 5.0,
               schedule: bool = False) -> list[Check]:
    """Every AMQP-001..032 check against the broker of ``connection`` and ``queue``."""
    amqp_connection = connection.connection
    binding = binding_of(connection)
    results = Results()
    control = check_declarations(results, amqp_connection, binding, queue)
    check_control_plane(results, control, queue, connection, info_timeout)
    check_probes(results, amqp_connection, binding, schedule)
    for check_id, reason in CLIENT_SIDE.items():
        results.set(check_id, "n/a", reason)
    return results.ordered()


@click.command(cls=OJSCommand)
@click.option("--queue", "-q", required=True, help="OJS queue whose setup and workers to check.")
@click.option("--info-timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="Seconds to wait for a worker's INFO answer.")
@click.option("--schedule", is_flag=True,
              help="Declare the scheduling ladder if missing, to probe AMQP-022.")
@common_options
@click.pass_context
def conformance(ctx: click.Context, queue: str, info_timeout: float, schedule: bool) -> None:
    """Check a live broker and the workers of QUEUE against AMQP-001..032.

    QUEUE's exchanges, queues and arguments are checked read-only; probe jobs
    go to a probe queue of their own (published through ojs_kombu, fetched with
    Basic.Get or a consumer, rejected into its DLQ, retried, scheduled) and are
    deleted afterwards; the control plane needs a worker consuming QUEUE.
    Prints pass / fail / warn (a SHOULD not met) / n/a with a reason for each
    id.  Exit 1 if any check fails, 4 if QUEUE does not exist.
    """
    ojs_queue = queue_name(queue)
    with connect(cli_options(ctx)) as connection:
        checks = run_checks(connection, ojs_queue, info_timeout, schedule)
    code = exit_code(checks)
    emit(ctx, {"queue": ojs_queue, "ok": code == 0, "checks": [c.to_dict() for c in checks]},
         lambda: click.echo(f"conformance of queue {ojs_queue} (OJS AMQP binding "
                            f"1.0.0-rc.1)\n" + render_table(checks, _width())))
    ctx.exit(code)
