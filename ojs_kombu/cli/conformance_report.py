"""The conformance report: the binding's requirements, their verdicts and the table.

Kept apart from the live checks so the verdict rules and the rendering a user
reads can be exercised without a broker.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from .common import EXIT_FAILED

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


def terminal_width() -> int:
    """The table width for this terminal (at least 100 columns)."""
    import shutil

    return max(100, shutil.get_terminal_size((120, 24)).columns)


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width) or [""]
