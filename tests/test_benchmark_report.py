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


def _storm_modules(monkeypatch: pytest.MonkeyPatch) -> tuple[ModuleType, ModuleType]:
    """storm_report (the rules and the table) and storm_messages (what the storm sends and
    how it is counted); both import siblings."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return _load("storm_report"), _load("storm_messages")


def storm_side(key: str, *, dead: int, expected: int, seconds: float, left: int = 0,
               published: int = 600, exit_s: float | None = 1.0, killed: bool = False,
               answered: bool = True, timed_out: bool = False) -> dict[str, Any]:
    storm_report = sys.modules["bench_storm_report"]
    return {"side": key, "published": published, "expected_dead_letters": expected,
            "dead_lettered": dead, "left_in_queue": left, "seconds": seconds,
            "timed_out": timed_out,
            "rate": storm_report.rate(key, published, dead, left, seconds),
            "pings": [{"at_s": 0.1, "answered": answered, "ms": 12.0 if answered else None,
                       "during_storm": True}],
            "exit_s": None if killed else exit_s, "killed": killed, "kinds": {},
            "lost": 0, "dead_letter_codes": {}}


def test_storm_rate_counts_what_each_side_must_do_with_its_poison(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """ojs_kombu must dead-letter every poison delivery; plain Celery dead-letters its
    unregistered tasks and acks its undecodable messages, so every delivery that left
    its queue counts.  Dividing dead letters alone would credit ojs_kombu twice."""
    storm_report, _ = _storm_modules(monkeypatch)
    # plain: 300 dead letters, its 300 undecodable acked; ojs: all 600 dead-lettered
    assert storm_report.settled("plain", 600, 300, 0) == 600
    assert storm_report.settled("ojs", 600, 600, 0) == 600
    # ojs_kombu gets no credit for deliveries that left the queue without a dead letter
    assert storm_report.settled("ojs", 600, 4, 590) == 4
    assert storm_report.settled("plain", 600, 300, None) == 300
    pool = {"plain": storm_side("plain", dead=300, expected=300, seconds=2.0),
            "ojs": storm_side("ojs", dead=600, expected=600, seconds=2.0)}
    assert pool["plain"]["rate"] == pool["ojs"]["rate"] == pytest.approx(300.0)
    assert storm_report.ratio(pool) == pytest.approx(1.0)
    assert storm_report.assess(pool)["rate_met"] is True
    slow = {**pool, "ojs": storm_side("ojs", dead=40, expected=600, seconds=40.0, left=550,
                                      timed_out=True)}
    assert storm_report.ratio(slow) == pytest.approx(1.0 / 300)
    assert storm_report.assess(slow)["met"] is False
    assert storm_report.ratio({"plain": pool["plain"]}) is None


def test_storm_target_needs_every_ping_answered_and_an_exit_no_later_than_plain(
        monkeypatch: pytest.MonkeyPatch) -> None:
    storm_report, _ = _storm_modules(monkeypatch)
    plain = storm_side("plain", dead=300, expected=300, seconds=2.0, exit_s=2.0)

    def verdict(**ojs: Any) -> dict[str, Any]:
        side = storm_side("ojs", dead=600, expected=600, seconds=1.5, **ojs)
        return storm_report.assess({"plain": plain, "ojs": side})

    assert verdict(exit_s=2.5)["met"] is True  # within the tolerance
    assert verdict(exit_s=2.0 + storm_report.EXIT_TOLERANCE_S + 0.1)["exit_met"] is False
    assert verdict(killed=True)["exit_met"] is False
    unanswered = verdict(answered=False)
    assert unanswered["ping_met"] is False and unanswered["met"] is False
    no_ping = storm_side("ojs", dead=600, expected=600, seconds=1.5)
    no_ping["pings"] = []
    assert storm_report.assess({"plain": plain, "ojs": no_ping})["ping_met"] is False
    # a plain worker that had to be killed is beaten by any exit
    killed_plain = storm_side("plain", dead=300, expected=300, seconds=2.0, killed=True)
    ojs = storm_side("ojs", dead=600, expected=600, seconds=1.5, exit_s=30.0)
    assert storm_report.assess({"plain": killed_plain, "ojs": ojs})["exit_met"] is True


def test_storm_table_shows_rates_ratio_ping_exit_timeouts_and_the_target_per_pool(
        monkeypatch: pytest.MonkeyPatch) -> None:
    storm_report, _ = _storm_modules(monkeypatch)
    plain = storm_side("plain", dead=300, expected=300, seconds=0.5, exit_s=10.04)
    plain["kinds"] = {"unregistered task": {"published": 300, "dead_lettered": 300, "left": 0,
                                            "lost": 0, "duplicated": 0},
                      "undecodable": {"published": 300, "dead_lettered": 0, "left": 0,
                                      "lost": 300, "duplicated": 0}}
    ojs = storm_side("ojs", dead=4, expected=600, seconds=40.0, left=590, killed=True,
                     timed_out=True)
    ojs["dead_letter_codes"] = {"UNKNOWN_JOB_TYPE": 3, "none": 1}
    fast = storm_side("ojs", dead=600, expected=600, seconds=0.4, exit_s=9.9)
    result = {"pools": {"solo": {"plain": plain, "ojs": ojs},
                        "threads": {"plain": plain, "ojs": fast}}}
    lines = storm_report.render(result)
    rows = [[c.strip() for c in line.split("|")] for line in lines if line.count("|") == 7]
    assert rows[0][:6] == ["poison storm", "side", "dead-lettered", "seconds", "poison/s",
                           "ratio (ojs/plain)"]
    assert rows[1] == ["solo", "plain Celery", "300/300", "0.50", "1200", "-", "y 12 ms",
                       "10.04"]
    assert rows[2] == ["solo", "ojs_kombu", "4/600 (timeout)", "40.00", "0.10", "<0.01",
                       "y 12 ms", "killed"]
    assert rows[4][4:6] == ["1500", "1.25"]
    text = "\n".join(lines)
    assert ("ojs_kombu, solo: timed out after 40 s: 4 of 600 in the DLQ, 590 still in the "
            "job queue") in text
    assert "undecodable 300: 0 dead-lettered, 0 in the job queue, 300 lost (acked and " \
           "dropped)" in text
    assert "x-ojs-error-code of its dead letters: UNKNOWN_JOB_TYPE 3, none 1" in text
    assert storm_report.TARGET_LINE in lines
    assert "  solo: not met (rate <0.01x: not met; ping: met; exit killed vs 10.04 s: " \
           "not met)" in lines
    assert "  threads: met (rate 1.25x: met; ping: met; exit 9.90 s vs 10.04 s: met)" in lines


def test_storm_ping_cell_says_unanswered_pings_and_pings_after_the_storm(
        monkeypatch: pytest.MonkeyPatch) -> None:
    storm_report, _ = _storm_modules(monkeypatch)
    pings = [{"at_s": 0.1, "answered": True, "ms": 8.0, "during_storm": True},
             {"at_s": 3.2, "answered": False, "ms": None, "during_storm": True}]
    assert storm_report.ping_cell({"pings": pings}) == "n (1/2)"
    assert storm_report.ping_cell({"pings": pings[:1]}) == "y 8 ms"
    late = [{**pings[0], "during_storm": False}]
    assert storm_report.ping_cell({"pings": late}) == "y 8 ms, after"
    assert storm_report.ping_cell({"pings": []}) == "-"


def test_storm_ojs_messages_are_valid_jobs_of_an_unknown_type_or_not_jobs_at_all(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Half the storm must pass every check but the type lookup (so the worker reads the
    envelope), the rest must fail on the body: checked against ojs_kombu's own decoder."""
    from ojs_kombu.spec.decode import decode_job_message
    from ojs_kombu.spec.errors import JobRejected

    _, storm_messages = _storm_modules(monkeypatch)
    messages = storm_messages.ojs_poison(4, "storm")
    assert [kind for kind, _b, _p in messages] == [
        "unknown type", "not JSON", "unknown type", "JSON, not a job"] * 2
    codes = []
    for _kind, body, properties in messages:
        assert properties["message_id"] == properties["correlation_id"]
        assert properties["application_headers"]["x-ojs-queue"] == "storm"
        with pytest.raises(JobRejected) as info:
            decode_job_message(body, properties, resolve_task=lambda t: None)
        codes.append(info.value.code)
    assert codes == ["UNKNOWN_JOB_TYPE", "INVALID_PAYLOAD", "UNKNOWN_JOB_TYPE",
                     "INVALID_ENVELOPE"] * 2
    # a task for the type would run it: the valid half is a real OJS job
    valid = messages[0]
    job = decode_job_message(valid[1], valid[2], resolve_task=lambda t: "storm.noop")
    assert job.envelope.type == "storm.unknown_type"
    assert len({p["message_id"] for _k, _b, p in messages}) == len(messages)


def test_storm_counts_where_each_kind_ended_up_by_message_id(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Lost (in neither queue) and duplicated (a dead letter whose original went back to
    the job queue) are counted per kind, so neither can hide in a total."""
    _, storm_messages = _storm_modules(monkeypatch)

    class Got:
        def __init__(self, message_id: str) -> None:
            self.properties = {"message_id": message_id}

    published = [("unregistered task", b"", {"message_id": "a"}),
                 ("undecodable", b"", {"message_id": "b"}),
                 ("unregistered task", b"", {"message_id": "c"}),
                 ("undecodable", b"", {"message_id": "d"})]
    kinds = storm_messages.count_kinds(published, [Got("a"), Got("c"), Got("x")],
                                     [Got("c"), Got("d")])
    assert kinds["unregistered task"] == {"published": 2, "dead_lettered": 2, "left": 1,
                                          "lost": 0, "duplicated": 1}
    assert kinds["undecodable"] == {"published": 2, "dead_lettered": 0, "left": 1, "lost": 1,
                                    "duplicated": 0}


def _traced_publish(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # traced_publish imports report, scheduling
    return _load("traced_publish")


def traced_medians(**rates: float) -> dict[str, dict[str, float]]:
    """Per side jobs/s (distinct), CPU per job and, for the traced sides, PRODUCER spans."""
    rates = {"plain_traced": 900.0, "ojs_traced": 1200.0, "plain_untraced": 1000.0,
             "ojs_untraced": 1500.0, "raw_traced": 1350.0, "raw_untraced": 1800.0, **rates}
    cpu = {"plain_traced": 400.0, "ojs_traced": 320.0, "plain_untraced": 300.0,
           "ojs_untraced": 200.0, "raw_traced": 200.0, "raw_untraced": 100.0}
    return {key: {"jobs_per_s": rate, "seconds": 2.0, "p50_ms": 0.7, "p99_ms": 3.0,
                  "cpu_us_per_job": cpu[key], "jobs": 6000,
                  "producer_spans": 6000 if key.endswith("_traced") else 0}
            for key, rate in rates.items()}


def test_traced_publish_compares_each_side_with_plain_celery_traced_alike(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's target reads ojs_kombu traced over plain Celery traced; the untraced pair
    and what tracing costs each side are shown next to it."""
    traced_publish = _traced_publish(monkeypatch)
    assessed = traced_publish.assess(traced_medians())
    assert assessed["ratios"]["traced"]["jobs_per_s"] == pytest.approx(1200 / 900)
    assert assessed["ratios"]["untraced"]["jobs_per_s"] == pytest.approx(1.5)
    assert assessed["ratios"]["traced"]["cpu"] == pytest.approx(400 / 320)  # plain over ojs
    assert assessed["tracing_cost"]["ojs"]["jobs_per_s"] == pytest.approx(0.8)
    assert assessed["tracing_cost"]["plain"]["cpu"] == pytest.approx(400 / 300)
    assert assessed["target"]["minimum"] == 1.2 and assessed["target"]["met"] is True
    assert assessed["ceiling"]["traced"]["jobs_per_s"] == pytest.approx(1.5)  # raw over plain
    assert assessed["ceiling"]["untraced"]["jobs_per_s"] == pytest.approx(1.8)
    assert assessed["ceiling"]["traced"]["cpu"] == pytest.approx(2.0)
    assert assessed["target"]["ceiling"] == pytest.approx(1.5)
    assert assessed["target"]["reachable"] is True
    assert assessed["tracing_cost"]["raw"]["jobs_per_s"] == pytest.approx(0.75)
    unreachable = traced_publish.assess(traced_medians(raw_traced=1000.0))
    assert unreachable["target"]["ceiling"] == pytest.approx(1000 / 900)
    assert unreachable["target"]["reachable"] is False
    below = traced_publish.assess(traced_medians(ojs_traced=1000.0))
    assert below["target"]["ratio"] == pytest.approx(1000 / 900)
    assert below["target"]["met"] is False
    partial = traced_medians()
    del partial["plain_traced"]
    missing = traced_publish.assess(partial)
    assert missing["target"]["ratio"] is None and missing["target"]["met"] is False
    assert missing["tracing_cost"]["plain"]["jobs_per_s"] is None
    assert missing["target"]["ceiling"] is None and missing["target"]["reachable"] is None


def test_traced_publish_table_shows_rates_ratios_cpu_spans_and_the_verdict(
        monkeypatch: pytest.MonkeyPatch) -> None:
    traced_publish = _traced_publish(monkeypatch)
    medians = traced_medians()
    medians["ojs_traced"]["producer_spans"] = 5990  # a dropped span shows
    lines = traced_publish.render({"jobs": 2000, "medians": medians,
                                   **traced_publish.assess(medians)})
    rows = {cells[0]: cells[1:] for cells in (
        [c.strip() for c in line.split("|")] for line in lines if line.count("|") == 6)}
    assert rows["plain Celery apply_async, confirm_publish, traced"] == [
        "900", "-", "400", "0.700", "3.000", "6000 of 6000"]
    assert rows["ojs_kombu apply_async (confirmed), traced"][:3] == ["1200", "1.33", "320"]
    assert rows["ojs_kombu apply_async (confirmed), traced"][-1] == "5990 of 6000"
    assert rows["ojs_kombu apply_async (confirmed), untraced"][:2] == ["1500", "1.50"]
    assert rows["plain Celery apply_async, confirm_publish, untraced"][-1] == "-"
    assert rows["raw py-amqp, confirmed, Celery's publish signals, traced"] == [
        "1350", "1.50", "200", "0.700", "3.000", "6000 of 6000"]
    assert rows["raw py-amqp, confirmed, untraced"][:2] == ["1800", "1.80"]
    text = "\n".join(lines)
    assert "CPU ratio (plain/ojs): traced 1.25, untraced 1.50" in text
    assert ("traced / untraced: plain Celery jobs/s 0.90x, CPU per job 1.33x; ojs_kombu "
            "jobs/s 0.80x, CPU per job 1.60x") in text
    assert "ceiling (raw py-amqp over plain Celery): jobs/s traced 1.50x, untraced 1.80x" in text
    verdict = next(line for line in lines if line.startswith("traced single apply_async"))
    assert [c.strip() for c in verdict.split("|")][1:] == ["1.33", "met"]
    reach = next(line for line in lines if line.strip().startswith("ceiling: raw py-amqp"))
    assert [c.strip() for c in reach.split("|")][1:] == ["1.50", "reachable"]


def _cluster_drain(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # cluster_drain imports report
    return _load("cluster_drain")


def cluster_round(jobs_per_s: float, worker_us: float, broker_us: float,
                  global_prefetch: int = 0) -> dict[str, Any]:
    return {"jobs_per_s": jobs_per_s, "seconds": 4000 / jobs_per_s,
            "worker_cpu_us_per_job": worker_us, "broker_cpu_us_per_job": broker_us,
            "consumers": 1, "prefetch_count": [16], "global_prefetch_count": [global_prefetch]}


def test_cluster_drain_ratio_is_ojs_over_plain_per_pool_against_the_0_9_target(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Medians per side and pool; the ratio and the 0.9x target per pool; CPU ratios
    ojs over plain; a consumer that asked for global QoS is flagged for its side."""
    cluster_drain = _cluster_drain(monkeypatch)
    rounds = {
        "threads": {"plain": [cluster_round(1000, 300, 400), cluster_round(1200, 320, 420),
                              cluster_round(1100, 310, 410)],
                    "ojs": [cluster_round(990, 330, 380), cluster_round(500, 360, 390),
                            cluster_round(1000, 340, 400)]},
        "prefork": {"plain": [cluster_round(800, 500, 600, global_prefetch=8)],
                    "ojs": [cluster_round(712, 450, 500)]},
    }
    pools = cluster_drain.summarize(rounds)["pools"]
    threads = pools["threads"]
    assert threads["plain"]["jobs_per_s"] == 1100 and threads["ojs"]["jobs_per_s"] == 990
    assert threads["ratio"] == pytest.approx(0.9)
    assert threads["target"] == {"minimum": 0.9, "met": True}
    assert threads["worker_cpu_ratio"] == pytest.approx(340 / 310)
    assert threads["broker_cpu_ratio"] == pytest.approx(390 / 410)
    assert threads["global_qos"] == {"plain": False, "ojs": False}
    prefork = pools["prefork"]
    assert prefork["ratio"] == pytest.approx(0.89)
    assert prefork["target"]["met"] is False
    assert prefork["global_qos"] == {"plain": True, "ojs": False}


def test_cluster_drain_skips_a_pool_without_both_sides_and_keeps_missing_cpu_empty(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cluster_drain = _cluster_drain(monkeypatch)
    unseen = {**cluster_round(1000, 0, 0), "worker_cpu_us_per_job": None,
              "broker_cpu_us_per_job": None}
    pools = cluster_drain.summarize({
        "threads": {"plain": [cluster_round(1000, 300, 400)], "ojs": [unseen]},
        "prefork": {"plain": [cluster_round(800, 500, 600)], "ojs": []}})["pools"]
    assert list(pools) == ["threads"]
    assert pools["threads"]["ojs"]["worker_cpu_us_per_job"] is None
    assert pools["threads"]["worker_cpu_ratio"] is None


def test_cluster_drain_swaps_the_sides_every_round(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster_drain = _cluster_drain(monkeypatch)
    calls: list[tuple[str, str, int]] = []

    def measure(key: str, pool: str, i: int) -> dict[str, Any]:
        calls.append((key, pool, i))
        return cluster_round(1000 if key == "plain" else 950, 300, 400)

    result = cluster_drain.run(cluster_drain.Settings(jobs=4000, rounds=2), measure,
                               log=lambda _: None)
    assert calls == [("plain", "threads", 0), ("ojs", "threads", 0),
                     ("plain", "prefork", 0), ("ojs", "prefork", 0),
                     ("ojs", "threads", 1), ("plain", "threads", 1),
                     ("ojs", "prefork", 1), ("plain", "prefork", 1)]
    assert result["orders"] == [["plain", "ojs"], ["ojs", "plain"]]
    assert result["pools"]["prefork"]["ratio"] == pytest.approx(0.95)


def test_cluster_drain_table_shows_rates_cpu_qos_and_the_verdicts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cluster_drain = _cluster_drain(monkeypatch)
    result = cluster_drain.summarize({
        "threads": {"plain": [cluster_round(1000, 300, 400)],
                    "ojs": [cluster_round(850, 320, 380)]},
        "prefork": {"plain": [cluster_round(700, 500, 600, global_prefetch=8)],
                    "ojs": [cluster_round(700, 450, 500)]}})
    lines = cluster_drain.render({**result, "jobs": 4000,
                                  "leaders": {"plain": "ojs-b1@localhost",
                                              "ojs": "ojs-b1@localhost"}})
    rows = {cells[0]: cells[1:] for cells in (
        [c.strip() for c in line.split("|")] for line in lines if line.count("|") == 5)}
    assert rows["plain Celery, threads"] == ["1000", "", "300", "400", "no"]
    assert rows["ojs_kombu, threads"] == ["850", "0.85", "320", "380", "no"]
    assert rows["plain Celery, prefork"][-1] == "yes"
    verdicts = {cells[0]: cells[1:] for cells in (
        [c.strip() for c in line.split("|")] for line in lines if line.startswith("drain "))}
    assert verdicts["drain threads on the cluster >= 0.9x plain Celery"] == ["0.85", "not met"]
    assert verdicts["drain prefork on the cluster >= 0.9x plain Celery"] == ["1.00", "met"]
    assert "queue leaders: plain Celery ojs-b1@localhost, ojs_kombu ojs-b1@localhost" in (
        "\n".join(lines))


def _scale(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # scale imports scale_app, scheduling, report
    return _load("scale")


def _scale_result(side: str, n: int, start_s: float) -> dict[str, Any]:
    objects = {"queues": n, "exchanges": n, "bindings": n, "queue_memory_mb": 1.0,
               "retry_queues": 0, "retry_queue_expires_s": []}
    return {"side": side, "job_queues": n, "start_s": start_s, "rest": objects,
            "after": objects, "rss_rest_mb": 70.0, "rss_after_mb": 71.0, "retried": n,
            "restart_s": 1.0}


def test_scale_table_puts_the_bare_clients_declaration_times_beside_the_first_starts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker's share of ojs_kombu's slower first start: the bare client's difference
    next to the workers' difference, at the largest queue count."""
    scale = _scale(monkeypatch)
    result = {"results": [_scale_result("plain", 100, 1.25), _scale_result("ojs", 100, 2.5)],
              "per_queue": {}, "start_ratio": {100: 2.0}, "restart_ratio": {100: 1.0},
              "quorum": False, "target": {"name": "start", "ratio": 2.0, "met": False},
              "ceiling": {"job_queues": 100,
                          "seconds": {"plain": 0.25, "ojs": 1.5, "ojs_no_priority": 0.5}}}
    lines = scale.render(result)
    ceiling = next(line for line in lines if "broker's ceiling" in line)
    assert "plain Celery's objects 0.25s" in ceiling and "ojs_kombu's 1.50s" in ceiling
    assert "(0.50s without x-max-priority)" in ceiling
    difference = next(line for line in lines if "ojs_kombu minus plain Celery" in line)
    assert "workers +1.25s" in difference and "bare client +1.25s" in difference
    del result["ceiling"]
    assert not any("broker's ceiling" in line for line in scale.render(result))


def test_dlq_scale_reads_the_replay_against_enqueue_many_and_the_bare_clients_move(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    dlq_scale = _load("dlq_scale")
    step = {"seconds": 10.0, "peak_rss_mb": 50.0, "exit_code": 0, "job_queue_after": 0,
            "dlq_after": 0}
    result = {"results": [{"dead_letters": 1000, "enqueue_many_jobs_per_s": 4000.0,
                           "steps": {"replay": step}, "replay_jobs_per_s": 3000.0,
                           "replay_counts_exact": True, "raw_move_jobs_per_s": 3750.0}]}
    summary = dlq_scale.render(result)[-1]
    assert "replay 3000 jobs/s vs enqueue_many 4000 jobs/s (0.75x)" in summary
    assert "bare py-amqp moving them back 3750 jobs/s (0.94x, replay at 0.80x it)" in summary
    assert "exactly n and 0" in summary


def test_scale_table_reports_each_node_restart_with_its_counts_and_the_recovery_ratio(
        monkeypatch: pytest.MonkeyPatch) -> None:
    scale = _scale(monkeypatch)
    plain, ojs = _scale_result("plain", 100, 4.0), _scale_result("ojs", 100, 6.0)
    plain["recovery"] = {"published": 2000, "node_back_s": 7.0, "queues_online_s": 8.0,
                         "drained_s": 11.0, "ran": 2000, "lost": 0, "duplicates": 0}
    ojs["recovery"] = {**plain["recovery"], "queues_online_s": 10.0, "ran": 1999, "lost": 1}
    summary = scale.summarize(
        [scale.ScaleResult(**{**r, "rest": scale.Objects(**r["rest"]),
                              "after": scale.Objects(**r["after"])}) for r in (plain, ojs)],
        scale.Settings(counts=(100,), quorum=True))
    assert summary["recovery_ratio"] == {100: 1.25}
    lines = scale.render(summary)
    restart = next(line for line in lines if "node restart, ojs_kombu x100" in line)
    assert "every quorum queue online 10.0s" in restart and "ran 1999, lost 1" in restart
    assert any("recovery ratio" in line and "100 queues 1.25x" in line for line in lines)


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


def test_storm_backlog_puts_its_ratio_beside_the_raw_copys_at_the_workers_prefetch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    storm_backlog = _load("storm_backlog")
    prefetch = storm_backlog.CEILING_PREFETCH[0]
    side = {"dead_lettered": 5000, "lost": 0, "duplicated": 0, "span_s": 2.0, "rate": 2500.0,
            "timed_out": False}
    result = {
        "settings": {"jobs": 5000, "pool": "solo", "rounds": 1},
        "rounds": {"plain": [side], "ojs": [{**side, "rate": 2000.0}]},
        "median_rate": {"plain": 2500.0, "ojs": 2000.0}, "ratio": 0.8, "target": 1.0,
        "met": False,
        "ceiling": [{"mode": "copy", "prefetch": prefetch, "dead_lettered": 5000,
                     "rate": 2600.0},
                    {"mode": "copy", "prefetch": 64, "dead_lettered": 5000, "rate": 4000.0},
                    {"mode": "reject", "prefetch": prefetch, "dead_lettered": 5000,
                     "rate": 4200.0}]}
    lines = storm_backlog.render(result)
    assert lines[-1] == (f"ceiling beside the target (prefetch {prefetch}): raw copy / plain "
                         "Celery 1.04x; ojs_kombu / raw copy 0.77x")
    assert not any("ceiling beside" in line
                   for line in storm_backlog.render({**result, "ceiling": []}))


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
