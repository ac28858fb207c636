"""The reports of the traced publish, the cluster drain, the scale part and dead letters at
scale (benchmarks/traced_publish.py, cluster_drain.py, scale.py, dlq_scale.py)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from .benchmark_modules import BENCHMARKS
from .benchmark_modules import load as _load


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
