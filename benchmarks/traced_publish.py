"""Single confirmed ``apply_async`` with OpenTelemetry's Celery instrumentation on.

The tracing this project recommends (``opentelemetry-instrumentation-celery``)
connects receivers to ``before_task_publish``/``after_task_publish``, and a
traced app's publishes go through whatever path those signals take.  This part
measures what such an app gets: ojs_kombu (``ojs://``, ``install(app)``)
against plain Celery (``pyamqp://`` with ``confirm_publish``), both with an SDK
``TracerProvider`` and ``CeleryInstrumentor().instrument()``, and the same two
untraced in the same run, so the table also shows what tracing costs each side.
Next to them the ceiling, traced and untraced: raw py-amqp publishing a copy of
one job ojs_kombu published, one confirmed message at a time, traced between
Celery's publish signals as Celery sends them (so the instrumentation does its
span work per publish).  The issue's target is reachable only if the traced
ceiling is.

Every side is a process of its own (``publish_side.py``; the instrumentation
patches Celery process-wide), started once for the part.  A round cuts each
side's ``--jobs`` into ``--blocks`` blocks and runs them in turns, the side
order rotated by one per block and reversed on odd rounds, as the throughput
part's publishes; the queue is purged before and after every block.  Per side
and round: jobs/s over its blocks' seconds, p50/p99 of the calls, CPU per job
of its process (the span exporter's thread included) and the PRODUCER spans
its exporter received.
"""

from __future__ import annotations

import json
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from admin import delete_swept
from report import block_orders, block_sizes, grid

HERE = Path(__file__).resolve().parent

#: ``(kind, traced)`` of every side, in table order.
SIDES: dict[str, tuple[str, bool]] = {
    "plain_traced": ("plain", True), "ojs_traced": ("ojs", True), "raw_traced": ("raw", True),
    "plain_untraced": ("plain", False), "ojs_untraced": ("ojs", False),
    "raw_untraced": ("raw", False),
    "plainnc_traced": ("plainnc", True), "deferred_traced": ("deferred", True),
    "plainnc_untraced": ("plainnc", False), "deferred_untraced": ("deferred", False),
}
LABELS = {
    "plain_traced": "plain Celery apply_async, confirm_publish, traced",
    "ojs_traced": "ojs_kombu apply_async (confirmed), traced",
    "raw_traced": "raw py-amqp, confirmed, Celery's publish signals, traced",
    "plain_untraced": "plain Celery apply_async, confirm_publish, untraced",
    "ojs_untraced": "ojs_kombu apply_async (confirmed), untraced",
    "raw_untraced": "raw py-amqp, confirmed, untraced",
    "plainnc_traced": "plain Celery apply_async, no confirms, traced",
    "deferred_traced": "ojs_kombu apply_async, deferred confirms (flushed), traced",
    "plainnc_untraced": "plain Celery apply_async, no confirms, untraced",
    "deferred_untraced": "ojs_kombu apply_async, deferred confirms (flushed), untraced",
}
#: Issue 39: ojs_kombu with deferred confirms over plain Celery without confirms.
DEFERRED_MINIMUM = 1.0
#: The issue's target: ojs_kombu traced over plain Celery traced.
TARGET_MINIMUM = 1.2
TARGET_NAME = (f"traced single apply_async >= {TARGET_MINIMUM}x plain Celery with "
               "confirm_publish, both traced")
FIELDS = ("jobs_per_s", "seconds", "p50_ms", "p99_ms", "cpu_us_per_job")


@dataclass
class Settings:
    """What ``run.py`` asks for (``--jobs``, ``--rounds``, ``--blocks``, ``--timeout``)."""

    jobs: int = 2000
    rounds: int = 1
    blocks: int = 5
    timeout_s: float = 300.0


class Admin(Protocol):
    """The part of ``admin.Broker`` used here."""

    vhost: str

    def purge(self, queue: str) -> None: ...

    def delete(self, queues: list[str], exchanges: list[str]) -> None: ...


class SideProcess:
    """A ``publish_side.py`` process and the broker names it reported."""

    def __init__(self, key: str, broker_url: str, workdir: Path, timeout: float) -> None:
        kind, traced = SIDES[key]
        self.key, self.timeout = key, timeout
        self.log = workdir / f"{key}.log"
        with self.log.open("wb") as err:
            self.process = subprocess.Popen(
                [sys.executable, str(HERE / "publish_side.py"), kind,
                 "traced" if traced else "untraced", broker_url],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                start_new_session=True)
        self.names: dict[str, Any] = {}
        # A thread reads the lines, so a wait can time out (the end of output is "").
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read_lines, daemon=True).start()

    def _read_lines(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put("")

    def read(self) -> dict[str, Any]:
        """The process's next line, within the timeout; its log's tail if it died."""
        try:
            line = self.lines.get(timeout=self.timeout)
        except queue.Empty:
            line, state = "", f"gave no answer within {self.timeout:.0f}s"
        else:
            state = "ended its output"
        if not line:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])
            raise RuntimeError(f"{LABELS[self.key]}: side process {state}:\n{tail}")
        return json.loads(line)

    def ask(self, command: str) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.read()

    def close(self, broker: Admin) -> None:
        """Stop the process, then delete what it declared (OJS: everything under its
        prefix, such as the dead-letter exchange)."""
        stdin = self.process.stdin
        with suppress(OSError, ValueError):  # the process may be gone already
            if stdin is not None:
                stdin.write("quit\n")
                stdin.close()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        prefix = self.names.get("sweep_prefix")
        delete_swept(broker, broker.vhost, self.names.get("queues", []),
                     self.names.get("exchanges", []),
                     (lambda name: name.startswith(prefix)) if prefix else None)


def run(broker: Admin, broker_url: str, settings: Settings,
        log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every side for ``settings.rounds`` rounds; medians, ratios and the target."""
    keys = list(SIDES)
    rounds: dict[str, list[dict[str, Any]]] = {key: [] for key in keys}
    orders: list[list[list[str]]] = []
    workdir = Path(tempfile.mkdtemp(prefix="ojs-bench-traced-"))
    try:
        with ExitStack() as stack:
            sides: dict[str, SideProcess] = {}
            for key in keys:
                sides[key] = SideProcess(key, broker_url, workdir, settings.timeout_s)
                stack.callback(sides[key].close, broker)
            for key in keys:
                sides[key].names = sides[key].read()
            for key in keys:
                log(f"traced publish: {LABELS[key]}: warm-up")
                sides[key].read()
                broker.purge(sides[key].names["queue"])
            sizes = block_sizes(settings.jobs, settings.blocks)
            for i in range(settings.rounds):
                blocks = block_orders(keys, len(sizes), i % 2 == 0)
                orders.append(blocks)
                for b, order in enumerate(blocks):
                    log(f"traced publish: round {i + 1}/{settings.rounds}, block "
                        f"{b + 1}/{len(blocks)}")
                    for key in order:
                        job_queue = sides[key].names["queue"]
                        broker.purge(job_queue)
                        sides[key].ask(f"publish {sizes[b]}")
                        broker.purge(job_queue)
                for key in keys:
                    rounds[key].append(sides[key].ask("round"))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    medians = {key: {field: statistics.median(r[field] for r in runs) for field in FIELDS}
               for key, runs in rounds.items()}
    for key, runs in rounds.items():
        medians[key]["producer_spans"] = sum(r["producer_spans"] for r in runs)
        medians[key]["jobs"] = sum(r["jobs"] for r in runs)
    return {"jobs": settings.jobs, "medians": medians, **assess(medians), "rounds": rounds,
            "orders": orders,
            "settings": {"rounds": settings.rounds, "blocks": settings.blocks,
                         "span_processor": "BatchSpanProcessor",
                         "span_exporter": "counting, no export",
                         "instrumentation": "CeleryInstrumentor().instrument()",
                         "raw_sides": "py-amqp, one ojs_kombu job read back, one confirmed "
                                      "publish at a time; traced: between Celery's "
                                      "before/after_task_publish signals"}}


def _over(medians: dict[str, dict[str, float]], key: str, reference: str, field: str
          ) -> float | None:
    if key not in medians or reference not in medians or not medians[reference][field]:
        return None
    return medians[key][field] / medians[reference][field]


def _vs_plain(medians: dict[str, dict[str, float]], kind: str) -> dict[str, Any]:
    """``kind`` over plain Celery, traced and untraced: jobs/s, and CPU per job plain over
    ``kind`` (so above 1 is better for both)."""
    return {mode: {"jobs_per_s": _over(medians, f"{kind}_{mode}", f"plain_{mode}",
                                       "jobs_per_s"),
                   "cpu": _over(medians, f"plain_{mode}", f"{kind}_{mode}", "cpu_us_per_job")}
            for mode in ("traced", "untraced")}


def assess(medians: dict[str, dict[str, float]]) -> dict[str, Any]:
    """ojs_kombu over plain Celery (``ratios``) and raw py-amqp over plain Celery
    (``ceiling``), traced and untraced; traced over untraced per side; the target, and
    whether the traced ceiling leaves it reachable."""
    ratios, ceiling = _vs_plain(medians, "ojs"), _vs_plain(medians, "raw")
    tracing_cost = {
        kind: {"jobs_per_s": _over(medians, f"{kind}_traced", f"{kind}_untraced",
                                   "jobs_per_s"),
               "cpu": _over(medians, f"{kind}_traced", f"{kind}_untraced", "cpu_us_per_job")}
        for kind in ("plain", "ojs", "raw", "plainnc", "deferred")}
    measured, reach = ratios["traced"]["jobs_per_s"], ceiling["traced"]["jobs_per_s"]
    target = {"name": TARGET_NAME, "minimum": TARGET_MINIMUM, "ratio": measured,
              "met": measured is not None and measured >= TARGET_MINIMUM,
              "ceiling": reach,
              "reachable": None if reach is None else reach >= TARGET_MINIMUM}
    deferred = {mode: _over(medians, f"deferred_{mode}", f"plainnc_{mode}", "jobs_per_s")
                for mode in ("traced", "untraced")}
    deferred_targets = [
        {"name": f"deferred-confirm apply_async >= {DEFERRED_MINIMUM}x plain Celery without "
                 f"confirms, both {mode}", "minimum": DEFERRED_MINIMUM, "ratio": value,
         "met": value is not None and value >= DEFERRED_MINIMUM}
        for mode, value in deferred.items()]
    return {"ratios": ratios, "ceiling": ceiling, "tracing_cost": tracing_cost,
            "target": target, "deferred_targets": deferred_targets}


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def render(result: dict[str, Any]) -> list[str]:
    """One row per side (jobs/s, ratio, CPU, latencies, PRODUCER spans), what tracing
    costs each side, and the target."""
    medians, ratios = result["medians"], result["ratios"]
    ceiling = result.get("ceiling", _vs_plain(medians, "raw"))
    rows: list[tuple[str, ...]] = [(
        f"traced publish ({result['jobs']} jobs)", "jobs/s", "vs plain Celery", "CPU us/job",
        "p50 ms", "p99 ms", "PRODUCER spans")]
    for key, (kind, traced) in SIDES.items():
        if key not in medians:
            continue
        m = medians[key]
        mode = "traced" if traced else "untraced"
        vs_plain: float | None = {"ojs": ratios, "raw": ceiling}.get(kind, {}).get(mode, {}).get(
            "jobs_per_s")
        if kind == "deferred":  # against plain Celery without confirms
            vs_plain = _over(medians, key, f"plainnc_{mode}", "jobs_per_s")
        spans = f"{m['producer_spans']:.0f} of {m['jobs']:.0f}" if traced else "-"
        rows.append((LABELS[key], f"{m['jobs_per_s']:.0f}", _cell(vs_plain, ".2f"),
                     f"{m['cpu_us_per_job']:.0f}", f"{m['p50_ms']:.3f}", f"{m['p99_ms']:.3f}",
                     spans))
    lines = grid(rows)
    lines.append("  CPU us/job: the side's whole process (the span exporter's thread too); "
                 f"CPU ratio (plain/ojs): traced {_cell(ratios['traced']['cpu'], '.2f')}, "
                 f"untraced {_cell(ratios['untraced']['cpu'], '.2f')}")
    lines.append("  ceiling (raw py-amqp over plain Celery): jobs/s traced "
                 f"{_cell(ceiling['traced']['jobs_per_s'], '.2f')}x, untraced "
                 f"{_cell(ceiling['untraced']['jobs_per_s'], '.2f')}x; CPU ratio "
                 f"(plain/raw): traced {_cell(ceiling['traced']['cpu'], '.2f')}, untraced "
                 f"{_cell(ceiling['untraced']['cpu'], '.2f')}")
    cost = result["tracing_cost"]
    names = {"plain": "plain Celery", "ojs": "ojs_kombu", "raw": "raw py-amqp",
             "plainnc": "plain Celery no confirms", "deferred": "ojs_kombu deferred"}
    lines.append("  traced / untraced: " + "; ".join(
        f"{names[kind]} jobs/s {_cell(cost[kind]['jobs_per_s'], '.2f')}x, CPU per job "
        f"{_cell(cost[kind]['cpu'], '.2f')}x" for kind in names if kind in cost))
    lines.append("  PRODUCER spans: the instrumentation's apply_async spans exported, "
                 "every round, warm-up excluded")
    target = result["target"]
    verdict = "-" if target["ratio"] is None else ("met" if target["met"] else "not met")
    reachable = target.get("reachable")
    reach = "-" if reachable is None else ("reachable" if reachable else "not reachable")
    return [*lines, "", *grid([
        ("target (issue: three publish paths)", "ratio", "status"),
        (target["name"], _cell(target["ratio"], ".2f"), verdict),
        (f"  ceiling: raw py-amqp traced over plain Celery traced, >= {TARGET_MINIMUM} to "
         "reach it", _cell(target.get("ceiling"), ".2f"), reach),
        *[(t["name"], _cell(t["ratio"], ".2f"),
           "-" if t["ratio"] is None else ("met" if t["met"] else "not met"))
          for t in result.get("deferred_targets", [])]])]
