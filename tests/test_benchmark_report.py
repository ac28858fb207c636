"""The benchmark's comparison rules: which baseline each ratio divides by, the targets of
issues #8 and #49, the throughput table and its chart (benchmarks/report.py,
benchmarks/workers.py, benchmarks/charts.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .benchmark_modules import BENCHMARKS
from .benchmark_modules import load as _load

report = _load("report")
workers = _load("workers")

#: Distinct rates, so a ratio against the wrong baseline gives a different number.
RATES = {
    "plain_publish": 4000.0, "plain_publish_confirm": 1000.0, "ojs_publish": 1500.0,
    "ojsclassic_publish": 1700.0,
    "ojs_batch": 20000.0, "ojsclassic_batch": 17000.0, "raw_batch": 25000.0,
    "raw_publish": 1750.0, "ojs_publish_deferred": 3800.0,
    "ojsclassic_publish_deferred": 4100.0,
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
    """The benchmark's ojs_kombu sides declare their job queues with x-max-priority
    (AMQP-030, ``sides.BENCH_MAX_PRIORITY``), which costs the broker per message: the
    second drain ratio divides by plain Celery on such a queue."""
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


def test_each_target_shows_the_ratio_its_ceiling_reaches_against_the_same_reference(
) -> None:
    data = medians(plaindef_drain_prefork=2500.0, plaindef_drain_threads=2600.0)
    assessed = report.assess(data)
    # raw py-amqp publishing the same job, against the target's own reference
    assert target(assessed, "ojs_batch", "dramatiq_send")["ceiling"] == pytest.approx(
        25000 / 16000)
    assert target(assessed, "ojs_publish", "dramatiq_send_confirm")["ceiling"] == \
        pytest.approx(1750 / 1600)
    # a drain against plain Celery's defaults: plain Celery acking late on a priority queue
    prefork = target(assessed, "ojs_drain_prefork", "plaindef_drain_prefork")
    assert prefork["ceiling"] == pytest.approx(1850 / 2500)
    assert prefork["ratio"] == pytest.approx(1800 / 2500) and prefork["met"] is False
    assert target(assessed, "ojs_drain_threads", "plain_drain_threads")["ceiling"] is None
    row = next(line for line in report.render(data, {}, 1000)
               if line.startswith("drain prefork c2 >= 1.05x"))
    assert [cell.strip() for cell in row.split("|")][1:] == ["0.72", "0.74", "not met"]
    text = "\n".join(report.render(data, {}, 1000))
    assert "plain Celery itself acking after the job on a priority queue" in text


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
    deferred_row = next(line for line in text.splitlines()
                        if line.startswith("ojs_kombu apply_async, confirms deferred"))
    assert [cell.strip() for cell in deferred_row.split("|")][3:6] == ["0.95", "-", "0.24"]
    verdicts = [line.rsplit("|", 1)[1].strip() for line in text.splitlines()
                if ">=" in line]
    assert verdicts == ["met", "met", "not met", "met", "met", "not met", "met", "-", "-", "met",
                        "not met", "met", "met"]
    classic_row = next(line for line in text.splitlines()
                       if line.startswith("ojs_kombu enqueue_many, classic"))
    # per call, as the batch's
    assert [cell.strip() for cell in classic_row.split("|")][-2:] == ["1.000*", "2.000*"]
    assert "classic queue: an ojs_kombu job queue without x-max-priority" in text


def test_prefork_record_skips_a_line_still_being_written(tmp_path: Path) -> None:
    record = tmp_path / "r"
    record.write_text("10.000000 10.000100\n10.500000 10.600000\n11.0000")
    assert workers.read_record(record) == [(10.0, 10.0001), (10.5, 10.6)]



def test_publish_blocks_cover_every_job_and_rotate_the_scenarios() -> None:
    """Interleaved publishing times every job of a scenario once, in near-equal blocks,
    and each block starts with another scenario (so a slow patch hits all alike)."""
    assert report.block_sizes(10, 3) == [4, 3, 3]
    assert report.block_sizes(2, 5) == [1, 1]
    assert sum(report.block_sizes(2000, 7)) == 2000
    orders = report.block_orders(["a", "b", "c"], 4, True)
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert report.block_orders(["a", "b", "c"], 2, False) == [["c", "b", "a"], ["b", "a", "c"]]


def test_issue_49_drain_targets_divide_by_plain_celery_on_its_defaults() -> None:
    """Celery's defaults ack on receipt; the issue-49 targets (>= 1.05x) compare each ojs_kombu
    drain with that, and the acks-late plain drain is itself a row compared with it."""
    measured = {**medians(), "plaindef_drain_threads": {"jobs_per_s": 2500.0},
                "plaindef_drain_prefork": {"jobs_per_s": 1700.0}}
    assessed = report.assess(measured)
    threads = target(assessed, "ojs_drain_threads", "plaindef_drain_threads")
    prefork = target(assessed, "ojs_drain_prefork", "plaindef_drain_prefork")
    assert threads["minimum"] == prefork["minimum"] == 1.05
    assert prefork["ratio"] == pytest.approx(1800 / 1700) and prefork["met"] is True
    assert threads["met"] is (measured["ojs_drain_threads"]["jobs_per_s"] / 2500 >= 1.05)
    assert assessed["ratios"]["plain_drain_prefork"]["plain"] == pytest.approx(2000 / 1700)
    text = "\n".join(report.render(measured, {}, 1000))
    assert "plain Celery drain, prefork c2, its defaults (acks on receipt)" in text


def test_the_ratio_chart_sets_a_drain_beside_plain_celerys_defaults_and_the_binding_bound(
) -> None:
    charts = _load("charts")
    data = medians(plaindef_drain_prefork=2500.0, plaindef_drain_threads=2600.0)
    rows = {label: (own, peers, ceiling, tick)
            for label, own, peers, ceiling, tick in charts.ratio_rows(data)}
    own, peers, ceiling, tick = rows["ojs_kombu drain, prefork c2"]
    assert (own, peers, ceiling, tick) == (
        1800.0, {"plain Celery": 2000.0, "plain Celery, its defaults": 2500.0}, 1850.0,
        "drain")
    own, peers, ceiling, tick = rows["ojs_kombu enqueue_many (all confirmed)"]
    assert (peers, ceiling, tick) == ({"plain Celery": 1000.0, "Dramatiq": 16000.0},
                                      25000.0, "raw")
    # a scenario not measured is no row; a peer not measured has no rate
    del data["ojs_drain_threads"], data["plaindef_drain_prefork"]
    rows = {row[0]: row for row in charts.ratio_rows(data)}
    assert "ojs_kombu drain, threads c4" not in rows
    assert rows["ojs_kombu drain, prefork c2"][2]["plain Celery, its defaults"] is None


def test_typed_publish_table_is_lines_with_each_ojs_side_read_against_plain_celery(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """run.py joins each part's lines: a table given as one string printed a character
    per line."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # typed_publish imports report
    typed_publish = _load("typed_publish")
    sides = ("plain_untyped", "ojs_untyped", "plain_typed", "ojs_typed")
    result = {"jobs": 200,
              "jobs_per_s": dict(zip(sides, (700.0, 770.0, 600.0, 480.0), strict=True)),
              "ratio_to_plain": {"untyped": 1.1, "typed": 0.8},
              "cpu_us_per_publish": dict(zip(sides, (600.0, 500.0, 700.0, 900.0), strict=True)),
              "cpu_ratio_to_plain": {"untyped": 500 / 600, "typed": 900 / 700},
              "encode_us": {f"{side}_us": 10.0 for side in sides}}
    lines = typed_publish.render(result)
    assert isinstance(lines, list) and all("\n" not in line for line in lines)
    [typed_row] = [line for line in lines if line.startswith("ojs_kombu") and "typed args" in
                   line and "untyped" not in line]
    assert [cell.strip() for cell in typed_row.split("|")][1:5] == ["480", "0.80x", "900",
                                                                     "1.29x"]
    assert lines[-1] == ("jobs/s: typed 0.80x vs untyped 1.10x plain Celery; CPU per publish: "
                         "typed 1.29x vs untyped 0.83x")
