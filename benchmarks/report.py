"""Throughput scenarios of ``run.py``: which baseline each is compared with, the
targets of issue #8, and the table.  Pure functions on the medians, so the
comparison rules can be tested without a broker (tests/test_benchmark_report.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Scenario:
    """One measured line.  ``plain_ref``/``dramatiq_ref``: the scenario its ratios divide
    by (the plain Celery or Dramatiq variant with the same delivery guarantee, for a
    drain the same pool); ``None`` when there is nothing to compare it with."""

    key: str
    label: str
    kind: str  # "publish" or "drain"
    plain_ref: str | None = None
    dramatiq_ref: str | None = None


@dataclass(frozen=True)
class Target:
    """``scenario`` jobs/s must be at least ``minimum`` x ``reference`` jobs/s.

    ``ceiling``: the scenario whose ratio to the same reference bounds this one (raw
    py-amqp publishing the same job; for a drain, plain Celery itself under the
    binding's rules), shown beside the ratio."""

    name: str
    scenario: str
    reference: str
    minimum: float
    ceiling: str | None = None


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("plain_publish", "plain Celery apply_async, no confirms", "publish",
             dramatiq_ref="dramatiq_send"),
    Scenario("plain_publish_confirm", "plain Celery apply_async, confirm_publish", "publish",
             dramatiq_ref="dramatiq_send_confirm"),
    Scenario("ojs_publish", "ojs_kombu apply_async (confirmed)", "publish",
             "plain_publish_confirm", "dramatiq_send_confirm"),
    Scenario("ojsclassic_publish", "ojs_kombu apply_async, classic queue", "publish",
             "plain_publish_confirm", "dramatiq_send_confirm"),
    Scenario("ojs_publish_deferred", "ojs_kombu apply_async, confirms deferred "
             "(flushed per block)", "publish", "plain_publish", "dramatiq_send"),
    Scenario("ojsclassic_publish_deferred", "ojs_kombu apply_async, confirms deferred, "
             "classic queue", "publish", "plain_publish", "dramatiq_send"),
    Scenario("ojs_batch", "ojs_kombu enqueue_many (all confirmed)", "publish",
             "plain_publish_confirm", "dramatiq_send"),
    Scenario("ojsclassic_batch", "ojs_kombu enqueue_many, classic queue", "publish",
             "plain_publish_confirm", "dramatiq_send"),
    Scenario("raw_batch", "raw py-amqp, same OJS job, batches confirmed", "publish",
             "plain_publish_confirm", "dramatiq_send"),
    Scenario("raw_publish", "raw py-amqp, same OJS job, each confirmed", "publish",
             "plain_publish_confirm", "dramatiq_send_confirm"),
    Scenario("dramatiq_send", "Dramatiq send, no confirms", "publish", "plain_publish"),
    Scenario("dramatiq_send_confirm", "Dramatiq send, confirm_delivery", "publish",
             "plain_publish_confirm"),
    Scenario("plaindef_drain_threads", "plain Celery drain, threads c4, its defaults "
             "(acks on receipt)", "drain"),
    Scenario("plain_drain_threads", "plain Celery drain, threads c4", "drain",
             "plaindef_drain_threads"),
    Scenario("plainpq_drain_threads", "plain Celery drain, threads c4, priority queue",
             "drain", "plain_drain_threads"),
    Scenario("ojs_drain_threads", "ojs_kombu drain, threads c4", "drain",
             "plain_drain_threads"),
    Scenario("plaindef_drain_prefork", "plain Celery drain, prefork c2, its defaults "
             "(acks on receipt)", "drain"),
    Scenario("plain_drain_prefork", "plain Celery drain, prefork c2", "drain",
             "plaindef_drain_prefork"),
    Scenario("plainpq_drain_prefork", "plain Celery drain, prefork c2, priority queue",
             "drain", "plain_drain_prefork"),
    Scenario("ojs_drain_prefork", "ojs_kombu drain, prefork c2", "drain",
             "plain_drain_prefork"),
    Scenario("ojsmulti_drain_threads", "ojs_kombu drain, threads c4, ojs_acks=multiple",
             "drain", "plain_drain_threads"),
    Scenario("ojsmulti_drain_prefork", "ojs_kombu drain, prefork c2, ojs_acks=multiple",
             "drain", "plain_drain_prefork"),
)
#: The plain Celery drain on a queue of the same broker type as ojs_kombu's default
#: job queue (``x-max-priority``, AMQP-030), per ojs_kombu drain.
PRIORITY_QUEUE_REF = {"ojs_drain_threads": "plainpq_drain_threads",
                      "ojs_drain_prefork": "plainpq_drain_prefork",
                      "ojsmulti_drain_threads": "plainpq_drain_threads",
                      "ojsmulti_drain_prefork": "plainpq_drain_prefork"}
BY_KEY = {s.key: s for s in SCENARIOS}
#: Scenarios whose latency is per ``enqueue_many`` call (or raw batch), not per job.
BATCH_KEYS = ("ojs_batch", "ojsclassic_batch", "raw_batch")

TARGETS: tuple[Target, ...] = (
    Target("batch publish >= 1.0x Dramatiq send without confirms", "ojs_batch",
           "dramatiq_send", 1.0, "raw_batch"),
    Target("batch publish >= 1.0x Dramatiq send without confirms, both on classic queues",
           "ojsclassic_batch", "dramatiq_send", 1.0),
    Target("single apply_async >= 1.0x Dramatiq with confirm_delivery", "ojs_publish",
           "dramatiq_send_confirm", 1.0, "raw_publish"),
    Target("single apply_async >= 1.0x Dramatiq with confirm_delivery, both on classic queues",
           "ojsclassic_publish", "dramatiq_send_confirm", 1.0),
    Target("single apply_async >= 1.0x plain Celery with confirm_publish", "ojs_publish",
           "plain_publish_confirm", 1.0, "raw_publish"),
    Target("single apply_async, deferred confirms >= 1.0x plain Celery without confirms",
           "ojs_publish_deferred", "plain_publish", 1.0),
    Target("single apply_async, deferred confirms >= 1.0x plain Celery without confirms, "
           "both on classic queues", "ojsclassic_publish_deferred", "plain_publish", 1.0),
    Target("drain threads c4 >= 1.05x plain Celery on its defaults (issue 49)",
           "ojs_drain_threads", "plaindef_drain_threads", 1.05, "plainpq_drain_threads"),
    Target("drain prefork c2 >= 1.05x plain Celery on its defaults (issue 49)",
           "ojs_drain_prefork", "plaindef_drain_prefork", 1.05, "plainpq_drain_prefork"),
    Target("drain threads c4 >= 0.95x plain Celery", "ojs_drain_threads",
           "plain_drain_threads", 0.95),
    Target("drain prefork c2 >= 0.95x plain Celery", "ojs_drain_prefork",
           "plain_drain_prefork", 0.95),
    Target("drain threads c4 >= 0.95x plain Celery, both on priority queues",
           "ojs_drain_threads", "plainpq_drain_threads", 0.95),
    Target("drain prefork c2 >= 0.95x plain Celery, both on priority queues",
           "ojs_drain_prefork", "plainpq_drain_prefork", 0.95),
)


def ratio(medians: dict[str, dict[str, float]], key: str | None, reference: str | None
          ) -> float | None:
    """jobs/s of ``key`` over jobs/s of ``reference``; ``None`` if either was not measured."""
    if key is None or reference is None or key not in medians or reference not in medians:
        return None
    return medians[key]["jobs_per_s"] / medians[reference]["jobs_per_s"]


def assess(medians: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Per scenario its two ratios (and their baselines); per target ratio and verdict.

    Also the batch ratio to plain Celery *without* confirms, the comparison the
    issue quotes ("about 4x plain Celery without confirms"), and each publish
    against raw py-amqp publishing the same OJS job the same way (batches, or one
    confirm per message): the share ojs_kombu keeps of what the broker takes of
    that message with no client work beyond py-amqp's.
    """
    ratios = {
        s.key: {"plain": ratio(medians, s.key, s.plain_ref), "plain_ref": s.plain_ref,
                "dramatiq": ratio(medians, s.key, s.dramatiq_ref),
                "dramatiq_ref": s.dramatiq_ref}
        for s in SCENARIOS if s.key in medians
    }
    for key, reference in PRIORITY_QUEUE_REF.items():
        if key in ratios:
            ratios[key]["plain_priority_queue"] = ratio(medians, key, reference)
            ratios[key]["plain_priority_queue_ref"] = reference
    targets = []
    for t in TARGETS:
        measured = ratio(medians, t.scenario, t.reference)
        targets.append({"name": t.name, "scenario": t.scenario, "reference": t.reference,
                        "minimum": t.minimum, "ratio": measured,
                        "ceiling": ratio(medians, t.ceiling, t.reference),
                        "met": measured is not None and measured >= t.minimum})
    return {"ratios": ratios, "targets": targets,
            "batch_vs_plain_no_confirms": ratio(medians, "ojs_batch", "plain_publish"),
            "batch_vs_raw": ratio(medians, "ojs_batch", "raw_batch"),
            "single_vs_raw": ratio(medians, "ojs_publish", "raw_publish")}


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def render(medians: dict[str, dict[str, float]], jobs: dict[str, int],
           batch_size: int) -> list[str]:
    """The scenario table, then the targets table, as text lines."""
    assessed = assess(medians)
    rows: list[tuple[str, ...]] = [("scenario", "jobs", "jobs/s", "vs plain Celery",
                                    "vs plain, priority q", "vs Dramatiq", "p50 ms",
                                    "p99 ms")]
    for s in SCENARIOS:
        if s.key not in medians:
            continue
        m, r = medians[s.key], assessed["ratios"][s.key]
        mark = "*" if s.key in BATCH_KEYS else ""
        p50 = _cell(m.get("p50_ms"), ".3f") + (mark if "p50_ms" in m else "")
        p99 = _cell(m.get("p99_ms"), ".3f") + (mark if "p99_ms" in m else "")
        rows.append((s.label, str(jobs.get(s.key, "")), f"{m['jobs_per_s']:.0f}",
                     _cell(r["plain"], ".2f"), _cell(r.get("plain_priority_queue"), ".2f"),
                     _cell(r["dramatiq"], ".2f"), p50, p99))
    lines = grid(rows)
    if "ojs_batch" in medians:
        batch = medians["ojs_batch"]
        lines.append(f"* one enqueue_many call (raw: one batch) of {batch_size} jobs; per job "
                     f"amortised: p50 {batch['p50_ms'] * 1e3 / batch_size:.1f} us, "
                     f"p99 {batch['p99_ms'] * 1e3 / batch_size:.1f} us")
    if any(key in medians for key in PRIORITY_QUEUE_REF.values()):
        lines.append("  plain Celery drains with task_acks_late=True (as ojs_kombu, AMQP-008) "
                     "unless 'its defaults' says acks on receipt")
        lines.append("  priority queue: the plain Celery queue declared with the "
                     "x-max-priority the ojs_kombu sides declare (sides.BENCH_MAX_PRIORITY)")
    if "ojsclassic_batch" in medians or "ojsclassic_publish" in medians:
        lines.append("  classic queue: an ojs_kombu job queue without x-max-priority "
                     "(ojs_max_priority=None), the queue type Dramatiq declares")
    if assessed["batch_vs_plain_no_confirms"] is not None:
        lines.append("  batch publish vs plain Celery without confirms: "
                     f"{assessed['batch_vs_plain_no_confirms']:.2f}x")
    if assessed["batch_vs_raw"] is not None:
        lines.append("  batch publish vs raw py-amqp publishing the same OJS job (the "
                     f"broker's ceiling for it): {assessed['batch_vs_raw']:.2f}x")
    if assessed["single_vs_raw"] is not None:
        lines.append("  single apply_async vs raw py-amqp publishing the same OJS job, one "
                     f"confirm each (the ceiling for it): {assessed['single_vs_raw']:.2f}x")
    target_rows: list[tuple[str, ...]] = [("target", "ratio", "ceiling", "status")]
    for t in assessed["targets"]:
        target_rows.append((t["name"], _cell(t["ratio"], ".2f"), _cell(t["ceiling"], ".2f"),
                            "-" if t["ratio"] is None else ("met" if t["met"] else "not met")))
    notes = ["  ceiling: the same ratio for raw py-amqp publishing the same OJS job (publish "
             "targets); for the drains against plain Celery's defaults, plain Celery itself "
             "acking after the job on a priority queue (AMQP-008, AMQP-030: what the binding "
             "asks of any OJS worker), the bound for Celery's own worker code under those "
             "rules (ojs_kombu's own code can pass it)"]
    return [*lines, "", *grid(target_rows), *notes]


def grid(rows: list[tuple[str, ...]]) -> list[str]:
    """Left-aligned columns separated by `` | ``, a rule under the header row."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    fmt = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
           for row in rows]
    return [fmt[0], "-+-".join("-" * w for w in widths), *fmt[1:]]


def block_sizes(n: int, blocks: int) -> list[int]:
    """``n`` jobs cut into ``blocks`` near-equal parts (none empty)."""
    blocks = max(1, min(blocks, n))
    return [n // blocks + (1 if i < n % blocks else 0) for i in range(blocks)]


def block_orders(keys: list[str], blocks: int, forward: bool) -> list[list[str]]:
    """The scenario order of each publish block: rotated by one per block, so each
    block starts with another scenario, and reversed on odd rounds (``forward`` false)."""
    keys = list(keys) if forward else list(reversed(keys))
    return [keys[b % len(keys):] + keys[:b % len(keys)] for b in range(blocks)]
