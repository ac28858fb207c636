"""The benchmark's comparison rules: which baseline each ratio divides by, the targets of
issue #8, and the table (benchmarks/report.py, benchmarks/prefork_drain.py)."""

from __future__ import annotations

import importlib.util
import statistics
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


report = _load("report")
prefork_drain = _load("prefork_drain")

#: Distinct rates, so a ratio against the wrong baseline gives a different number.
RATES = {
    "plain_publish": 4000.0, "plain_publish_confirm": 1000.0, "ojs_publish": 1500.0,
    "ojsclassic_publish": 1700.0,
    "ojs_batch": 20000.0, "ojsclassic_batch": 17000.0, "raw_batch": 25000.0,
    "raw_publish": 1750.0,
    "dramatiq_send": 16000.0,
    "dramatiq_send_confirm": 1600.0,
    "plain_drain_threads": 3000.0, "ojs_drain_threads": 2900.0,
    "plain_drain_prefork": 2000.0, "ojs_drain_prefork": 1800.0,
    "plainpq_drain_threads": 2950.0, "plainpq_drain_prefork": 1850.0,
    "ojsmulti_drain_threads": 3100.0, "ojsmulti_drain_prefork": 1950.0,
}


def medians(**overrides: float) -> dict[str, dict[str, float]]:
    rates = {**RATES, **overrides}
    return {key: {"jobs_per_s": rate, "p50_ms": 1.0, "p99_ms": 2.0}
            if "publish" in key or "batch" in key or "send" in key else {"jobs_per_s": rate}
            for key, rate in rates.items()}


def target(assessed: dict, scenario: str, reference: str) -> dict:
    [found] = [t for t in assessed["targets"]
               if t["scenario"] == scenario and t["reference"] == reference]
    return found


def test_batch_is_compared_with_dramatiq_without_confirms_and_single_with_confirms() -> None:
    assessed = report.assess(medians())
    assert assessed["ratios"]["ojs_batch"]["dramatiq"] == pytest.approx(20000 / 16000)
    assert assessed["ratios"]["ojs_publish"]["dramatiq"] == pytest.approx(1500 / 1600)
    assert assessed["ratios"]["ojs_publish"]["plain"] == pytest.approx(1.5)
    assert assessed["batch_vs_plain_no_confirms"] == pytest.approx(5.0)
    # the raw py-amqp publisher of the same job is the ceiling the batch is read against
    assert assessed["batch_vs_raw"] == pytest.approx(0.8)
    assert assessed["ratios"]["raw_batch"]["dramatiq"] == pytest.approx(25000 / 16000)
    assert target(assessed, "ojs_batch", "dramatiq_send")["met"] is True
    # on a classic queue too (the queue type Dramatiq declares), judged on its own
    classic = target(assessed, "ojsclassic_batch", "dramatiq_send")
    assert classic["ratio"] == pytest.approx(17000 / 16000) and classic["met"] is True
    below = report.assess(medians(ojsclassic_batch=15000.0))
    assert target(below, "ojsclassic_batch", "dramatiq_send")["met"] is False
    assert target(below, "ojs_batch", "dramatiq_send")["met"] is True
    assert target(assessed, "ojs_publish", "dramatiq_send_confirm")["met"] is False
    assert target(assessed, "ojs_publish", "plain_publish_confirm")["met"] is True
    # single apply_async into a classic queue, judged against Dramatiq with confirms
    single = target(assessed, "ojsclassic_publish", "dramatiq_send_confirm")
    assert single["ratio"] == pytest.approx(1700 / 1600) and single["met"] is True
    assert assessed["ratios"]["ojsclassic_publish"]["plain"] == pytest.approx(1.7)


def test_single_publish_is_read_against_raw_py_amqp_confirming_each_message() -> None:
    """The raw single publish (the same OJS job, one confirm per message) is the ceiling
    of a confirmed apply_async: its own row compares it with Dramatiq with confirms, and
    a line gives the share apply_async keeps of it.  It is no target."""
    assessed = report.assess(medians())
    assert assessed["single_vs_raw"] == pytest.approx(1500 / 1750)
    assert assessed["ratios"]["raw_publish"]["dramatiq"] == pytest.approx(1750 / 1600)
    assert assessed["ratios"]["raw_publish"]["plain"] == pytest.approx(1.75)
    assert not [t for t in assessed["targets"] if t["scenario"].startswith("raw")]
    lines = report.render(medians(), {}, 1000)
    row = next(line for line in lines if line.startswith("raw py-amqp, same OJS job, each"))
    # per message, not per batch: no "*" on its latencies
    assert [cell.strip() for cell in row.split("|")][2:] == [
        "1750", "1.75", "-", "1.09", "1.000", "2.000"]
    assert ("  single apply_async vs raw py-amqp publishing the same OJS job, one confirm "
            "each (the ceiling for it): 0.86x") in lines
    partial = medians()
    del partial["raw_publish"]
    assert report.assess(partial)["single_vs_raw"] is None
    assert not any("one confirm each" in line for line in report.render(partial, {}, 1000))


def test_each_drain_is_compared_with_plain_celery_on_the_same_pool() -> None:
    assessed = report.assess(medians())
    threads = target(assessed, "ojs_drain_threads", "plain_drain_threads")
    prefork = target(assessed, "ojs_drain_prefork", "plain_drain_prefork")
    assert threads["ratio"] == pytest.approx(2900 / 3000) and threads["met"] is True
    assert prefork["ratio"] == pytest.approx(0.9) and prefork["met"] is False
    assert threads["minimum"] == prefork["minimum"] == 0.95


def test_each_drain_is_also_compared_with_plain_celery_on_a_priority_queue() -> None:
    """ojs_kombu's job queues have x-max-priority by default (AMQP-030), which costs the
    broker per message: the second drain ratio divides by plain Celery on such a queue."""
    assessed = report.assess(medians())
    threads = target(assessed, "ojs_drain_threads", "plainpq_drain_threads")
    prefork = target(assessed, "ojs_drain_prefork", "plainpq_drain_prefork")
    assert threads["ratio"] == pytest.approx(2900 / 2950) and threads["met"] is True
    assert prefork["ratio"] == pytest.approx(1800 / 1850) and prefork["met"] is True
    assert assessed["ratios"]["ojs_drain_prefork"]["plain_priority_queue"] == \
        pytest.approx(1800 / 1850)
    # the priority-queue plain drain itself is compared with plain Celery on a classic queue
    assert assessed["ratios"]["plainpq_drain_prefork"]["plain"] == pytest.approx(1850 / 2000)
    text = "\n".join(report.render(medians(), {}, 1000))
    row = next(line for line in text.splitlines() if line.startswith("ojs_kombu drain, pre"))
    assert [cell.strip() for cell in row.split("|")][3:5] == ["0.90", "0.97"]


def test_the_multiple_acks_drains_are_rows_compared_like_the_default_drains() -> None:
    """``ojs_acks="multiple"`` is an opt-in outside section 5.3's wording: its drains are
    shown with both ratios, and no issue target is judged on them."""
    assessed = report.assess(medians())
    ratios = assessed["ratios"]["ojsmulti_drain_prefork"]
    assert ratios["plain"] == pytest.approx(1950 / 2000)
    assert ratios["plain_priority_queue"] == pytest.approx(1950 / 1850)
    assert not [t for t in assessed["targets"] if t["scenario"].startswith("ojsmulti")]
    row = next(line for line in report.render(medians(), {}, 1000)
               if line.startswith("ojs_kombu drain, threads c4, ojs_acks=multiple"))
    assert [cell.strip() for cell in row.split("|")][2:5] == ["3100", "1.03", "1.05"]


def test_a_scenario_not_measured_gives_no_ratio_and_no_verdict() -> None:
    partial = medians()
    del partial["dramatiq_send"]
    assessed = report.assess(partial)
    missing = target(assessed, "ojs_batch", "dramatiq_send")
    assert missing["ratio"] is None and missing["met"] is False
    lines = report.render(partial, {}, 1000)
    assert any(line.startswith("batch publish >= 1.0x Dramatiq") and line.endswith("| -")
               for line in lines)


def test_table_shows_rates_ratios_amortised_batch_latency_and_verdicts() -> None:
    data = medians()
    data["ojs_batch"].update(p50_ms=50.0, p99_ms=80.0)
    jobs = {key: 20000 if key in ("plain_publish", "ojs_batch", "raw_batch", "dramatiq_send")
            else 2000
            for key in RATES}
    text = "\n".join(report.render(data, jobs, 1000))
    batch_row = next(line for line in text.splitlines() if line.startswith("ojs_kombu enq"))
    assert [cell.strip() for cell in batch_row.split("|")] == [
        "ojs_kombu enqueue_many (all confirmed)", "20000", "20000", "20.00", "-", "1.25",
        "50.000*", "80.000*"]
    assert "per job amortised: p50 50.0 us, p99 80.0 us" in text
    assert "(the broker's ceiling for it): 0.80x" in text
    assert "drain prefork c2 >= 0.95x plain Celery" in text
    verdicts = [line.rsplit("|", 1)[1].strip() for line in text.splitlines()
                if ">=" in line]
    assert verdicts == ["met", "met", "not met", "met", "met", "met", "not met", "met", "met"]
    classic_row = next(line for line in text.splitlines()
                       if line.startswith("ojs_kombu enqueue_many, classic"))
    # per call, as the batch's
    assert [cell.strip() for cell in classic_row.split("|")][-2:] == ["1.000*", "2.000*"]
    assert "classic queue: an ojs_kombu job queue without x-max-priority" in text


def test_prefork_record_skips_a_line_still_being_written(tmp_path: Path) -> None:
    record = tmp_path / "r"
    record.write_text("10.000000 10.000100\n10.500000 10.600000\n11.0000")
    assert prefork_drain.read_record(record) == [(10.0, 10.0001), (10.5, 10.6)]



def test_publish_blocks_cover_every_job_and_rotate_the_scenarios() -> None:
    """Interleaved publishing times every job of a scenario once, in near-equal blocks,
    and each block starts with another scenario (so a slow patch hits all alike)."""
    assert report.block_sizes(10, 3) == [4, 3, 3]
    assert report.block_sizes(2, 5) == [1, 1]
    assert sum(report.block_sizes(2000, 7)) == 2000
    orders = report.block_orders(["a", "b", "c"], 4, True)
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert report.block_orders(["a", "b", "c"], 2, False) == [["c", "b", "a"], ["b", "a", "c"]]


def test_events_table_counts_publish_events_against_the_jobs_published(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The publish measurement and the drain run different numbers of jobs: each row
    counts against its own."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # events_scenario imports report
    events_scenario = _load("events_scenario")
    drained = [f"job-{i}" for i in range(8)]
    arrived = [(kind, job) for job in drained for kind in events_scenario.JOB_EVENTS]

    def side(rate: float) -> dict[str, Any]:
        return {"publish": {"jobs_per_s": rate, "p50_ms": 1.0, "p99_ms": 2.0},
                "drain": {"jobs_per_s": rate}}

    rounds = [{"off": side(100.0), "on": {
        **side(80.0), "drain_events_lag_s": 0.01,
        "publish_events": {"sink_backlog_s": 0.0, "enqueued_events": 2, "published": 3,
                           "every_job_enqueued_event": False},
        "events": {**events_scenario.count_events(arrived, drained),
                   "sink": {"delivered": 26, "failed": 0, "dropped": 0}, "metrics": {}}}}]
    result = events_scenario.summarize(
        rounds, lambda results: {"jobs_per_s": statistics.median(
            r["jobs_per_s"] for r in results), "p50_ms": 1.0, "p99_ms": 2.0})
    cells = dict(tuple(cell.strip() for cell in line.split("|"))
                 for line in events_scenario.render(result) if line.count("|") == 1)
    assert cells["publish: job.enqueued received"] == "2 of 3"
    assert cells["drain: job.completed for every job"] == "yes (8/8)"
    assert result["drain"]["ratio"] == pytest.approx(0.8) and not result["drain"]["met"]


def test_events_table_shows_drain_cpu_per_job_and_its_ratio_off_over_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU per job is the steadier reading of what events cost; jobs/s stays the target."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    events_scenario = _load("events_scenario")
    drained = ["job-0"]
    arrived = [(kind, "job-0") for kind in events_scenario.JOB_EVENTS]

    def side(rate: float, cpu: float) -> dict[str, Any]:
        return {"publish": {"jobs_per_s": rate, "p50_ms": 1.0, "p99_ms": 2.0},
                "drain": {"jobs_per_s": rate, "cpu_us_per_job": cpu}}

    rounds = [{"off": side(100.0, 250.0), "on": {
        **side(85.0, 280.0), "drain_events_lag_s": 0.01,
        "publish_events": {"sink_backlog_s": 0.0, "enqueued_events": 1, "published": 1,
                           "every_job_enqueued_event": True},
        "events": {**events_scenario.count_events(arrived, drained),
                   "sink": {"delivered": 3, "failed": 0, "dropped": 0}, "metrics": {}}}}]

    def median_of(results: list[dict[str, Any]]) -> dict[str, float]:
        return {key: statistics.median(r[key] for r in results) for key in results[0]}

    result = events_scenario.summarize(rounds, median_of)
    assert result["drain"]["cpu_ratio"] == pytest.approx(250 / 280)
    assert result["drain"]["ratio"] == pytest.approx(0.85) and not result["drain"]["met"]
    row = next(line for line in events_scenario.render(result)
               if line.startswith("drain CPU us/job"))
    assert [cell.strip() for cell in row.split("|")][1:4] == ["250", "280", "0.89*"]


def test_events_table_shows_the_sink_alone_and_the_metrics_alone_against_events_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The events-on side's two costs, each measured alone in the same rounds, are rows of
    their own (informational; the target stays on events on)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    events_scenario = _load("events_scenario")
    arrived = [(kind, "job-0") for kind in events_scenario.JOB_EVENTS]

    def side(rate: float, cpu: float) -> dict[str, Any]:
        return {"publish": {"jobs_per_s": rate, "p50_ms": 1.0, "p99_ms": 2.0},
                "drain": {"jobs_per_s": rate, "cpu_us_per_job": cpu}}

    on = {**side(80.0, 220.0), "drain_events_lag_s": 0.01,
          "publish_events": {"sink_backlog_s": 0.0, "enqueued_events": 1, "published": 1,
                             "every_job_enqueued_event": True},
          "events": {**events_scenario.count_events(arrived, ["job-0"]),
                     "sink": {"delivered": 3, "failed": 0, "dropped": 0}, "metrics": {}}}
    rounds = [{"off": side(100.0, 180.0), "on": on, "sink": side(90.0, 200.0),
               "metrics": side(92.0, 195.0)}]

    def median_of(results: list[dict[str, Any]]) -> dict[str, float]:
        return {key: statistics.median(r[key] for r in results) for key in results[0]}

    result = events_scenario.summarize(rounds, median_of)
    assert result["split"]["sink"]["ratio"] == pytest.approx(0.9)
    assert result["split"]["metrics"]["cpu_ratio"] == pytest.approx(180 / 195)
    assert result["drain"]["ratio"] == pytest.approx(0.8)  # the target reads events on
    lines = events_scenario.render(result)
    rows = {cells[0]: cells[1:4] for cells in (
        [c.strip() for c in line.split("|")] for line in lines if line.count("|") == 5)}
    assert rows["drain jobs/s, AMQP sink only"] == ["100", "90", "0.90"]
    assert rows["drain CPU us/job, metrics only"] == ["180", "195", "0.92*"]
    # without those sides (--no-events-split) the table has no such rows
    plain = events_scenario.summarize([{"off": rounds[0]["off"], "on": on}], median_of)
    assert "split" not in plain
    assert not any("sink only" in line for line in events_scenario.render(plain))
    # each side runs once in every position over as many rounds as there are sides
    kinds = list(events_scenario.SIDES)
    orders = [events_scenario.rotated(kinds, i) for i in range(len(kinds))]
    assert all(sorted(order) == sorted(kinds) for order in orders)
    assert all(sorted(o[p] for o in orders) == sorted(kinds) for p in range(len(kinds)))
    assert events_scenario.rotated(["off", "on"], 1) == ["on", "off"]
