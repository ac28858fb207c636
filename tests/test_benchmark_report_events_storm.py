"""The reports of the events part, the poison storm and its backlog form
(benchmarks/events_scenario.py, storm_report.py, storm_messages.py, storm_backlog.py)."""

from __future__ import annotations

import statistics
import sys
from types import ModuleType
from typing import Any

import pytest

from .benchmark_modules import BENCHMARKS
from .benchmark_modules import load as _load


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
