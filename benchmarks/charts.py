"""Charts of the latest figures, drawn from the benchmarks' JSON results into docs/_static/perf.

* ``ratios.png``: each ojs_kombu throughput scenario's ratio to plain Celery and to
  Dramatiq (the same delivery guarantee), a drain's also to plain Celery on its
  defaults (acks on receipt), parity (1.0) marked, and the ceiling as the ratio the
  ceiling reaches against that peer: raw py-amqp publishing the same OJS job (the
  broker's limit for a publisher); for a drain, plain Celery acking late on a priority
  queue (what AMQP-008 and AMQP-030 ask of any OJS worker);
* ``drains.png``: jobs/s of every round of every drain scenario (the spread the medians
  hide);
* ``latency.png`` and ``memory.png``: publish-to-start latency distributions and worker
  RSS from ``latency_memory.py``.

The docs include the committed PNGs, so building them needs no matplotlib (the
``bench`` extra brings it for whoever draws them)::

    .venv/bin/python benchmarks/charts.py benchmarks/results/latest.json

``run.py --charts`` draws them at the end of its run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE.parent / "docs" / "_static" / "perf"
#: ojs_kombu scenario -> the raw py-amqp scenario that is its ceiling
CEILING = {"ojs_publish": "raw_publish", "ojsclassic_publish": "raw_publish",
           "ojs_batch": "raw_batch", "ojsclassic_batch": "raw_batch"}
#: the tick of each kind of ceiling: (colour, legend)
_TICKS = {"raw": ("black", "ceiling (raw py-amqp)"),
          "drain": ("#c44e52", "bound (plain Celery acking late on a priority queue)")}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _rate(medians: dict[str, dict[str, float]], key: str | None) -> float | None:
    if key is None or key not in medians:
        return None
    return medians[key].get("jobs_per_s")


#: One bar group of the ratio chart: label, ojs_kombu's jobs/s, each peer's, the
#: ceiling's jobs/s and its kind (a key of ``_TICKS``).
RatioRow = tuple[str, float | None, dict[str, float | None], float | None, str]


def ratio_rows(medians: dict[str, dict[str, float]]) -> list[RatioRow]:
    """The ratio chart's rows: every ojs_kombu scenario measured, with its peers and its
    ceiling (a drain: plain Celery acking late and on its defaults, and the bound)."""
    sys.path.insert(0, str(HERE))
    import report

    # ojs_kombu drain -> (plain Celery on its defaults, plain Celery acking late on a
    # priority queue): the reference and the ceiling of its issue-49 target
    drain_peers = {t.scenario: (t.reference, t.ceiling) for t in report.TARGETS
                   if t.scenario in report.PRIORITY_QUEUE_REF and t.ceiling}
    rows: list[RatioRow] = []
    for scenario in report.SCENARIOS:
        if not scenario.key.startswith("ojs") or scenario.key not in medians:
            continue
        own = _rate(medians, scenario.key)
        peers = {"plain Celery": _rate(medians, scenario.plain_ref),
                 "Dramatiq": _rate(medians, scenario.dramatiq_ref)}
        ceiling, tick = _rate(medians, CEILING.get(scenario.key)), "raw"
        if scenario.key in drain_peers:
            defaults, bound = drain_peers[scenario.key]
            peers = {"plain Celery": peers["plain Celery"],
                     "plain Celery, its defaults": _rate(medians, defaults)}
            ceiling, tick = _rate(medians, bound), "drain"
        rows.append((scenario.label, own, peers, ceiling, tick))
    return rows


def ratio_chart(throughput: dict[str, Any], out: Path, note: str) -> Path:
    """Horizontal bars: ratio to each peer; the ceiling as a tick."""
    plt = _pyplot()
    rows = ratio_rows(throughput["medians"])
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(rows) + 1.5))
    height = 0.38
    colors = {"plain Celery": "#4c72b0", "Dramatiq": "#dd8452",
              "plain Celery, its defaults": "#8172b3"}
    labelled: set[str] = set()

    def once(name: str) -> str | None:
        """A legend entry the first time only."""
        if name in labelled:
            return None
        labelled.add(name)
        return name

    for i, (_label, own, peers, ceiling, tick) in enumerate(rows):
        for j, (peer, rate) in enumerate(peers.items()):
            if not own or not rate:
                continue
            y = i + (j - 0.5) * height
            ax.barh(y, own / rate, height, color=colors[peer], label=once(peer))
            ax.text(own / rate + 0.01, y, f"{own / rate:.2f}x", va="center", fontsize=7)
            if ceiling:
                color, name = _TICKS[tick]
                ax.plot([ceiling / rate] * 2, [y - height / 2, y + height / 2], color=color,
                        linewidth=2, label=once(name))
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("jobs/s ratio to the peer (1.0 = parity; higher is faster)")
    ax.set_title(f"ojs_kombu against its peers, medians ({note})", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = out / "ratios.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def drain_chart(throughput: dict[str, Any], out: Path, note: str) -> Path:
    """Every round's drain rate per drain scenario, the median as a bar."""
    sys.path.insert(0, str(HERE))
    import report

    plt = _pyplot()
    rounds = throughput["rounds"]
    keys = [s.key for s in report.SCENARIOS if s.kind == "drain" and rounds.get(s.key)]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(keys) + 1.5))
    for i, key in enumerate(keys):
        rates = [r["jobs_per_s"] for r in rounds[key]]
        median = throughput["medians"][key]["jobs_per_s"]
        color = "#55a868" if key.startswith("ojs") else "#4c72b0"
        ax.barh(i, median, 0.6, color=color, alpha=0.4)
        ax.plot(rates, [i] * len(rates), "o", color=color, markersize=4)
    ax.set_yticks(range(len(keys)), [report.BY_KEY[k].label for k in keys], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("jobs/s (bar: median; dots: each round)")
    ax.set_title(f"Drains of a no-op backlog ({note})", fontsize=9)
    fig.tight_layout()
    path = out / "drains.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def latency_chart(latency: dict[str, Any], out: Path, note: str) -> list[Path]:
    """Publish-to-start latency CDF per side, and RSS bars idle and after N jobs."""
    plt = _pyplot()
    sides = latency["sides"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, side in sides.items():
        values = sorted(side["latency_ms"]["values"])
        n = len(values)
        ax.plot(values, [(i + 1) / n for i in range(n)],
                label=f"{label}: p50 {side['latency_ms']['p50']} ms, "
                      f"p99 {side['latency_ms']['p99']} ms")
    ax.set_xscale("log")
    ax.set_xlabel("publish to start, ms (log)")
    ax.set_ylabel("share of jobs")
    ax.set_title(f"Publish-to-start latency, idle worker ({note})", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths = [out / "latency.png"]
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    labels, width = list(sides), 0.2
    readings = [("idle", "main_mib"), ("idle", "with_pool_mib"),
                ("after_jobs", "main_mib"), ("after_jobs", "with_pool_mib")]
    for j, (when, what) in enumerate(readings):
        values = [sides[s].get(when, {}).get(what, 0) for s in labels]
        xs = [i + (j - 1.5) * width for i in range(len(labels))]
        jobs = next((sides[s][when]["jobs"] for s in labels
                     if "jobs" in sides[s].get(when, {})), None)
        name = (f"after {jobs:,} jobs" if jobs else when) + (
            ", main process" if what == "main_mib" else ", with pool")
        ax.bar(xs, values, width, label=name)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylabel("RSS, MiB")
    ax.set_title(f"Worker memory, prefork c2 ({note})", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out / "memory.png")
    fig.savefig(paths[1], dpi=110)
    plt.close(fig)
    return paths


def draw(document: dict[str, Any], out: Path = DEFAULT_OUT) -> list[Path]:
    """Every chart whose part ``document`` (run.py's JSON) holds."""
    out.mkdir(parents=True, exist_ok=True)
    results, written = document.get("results", {}), []
    machine = document.get("machine", {})
    load = (f", load {machine['load_start']}-{machine.get('load_end')}"
            if "load_start" in machine else "")
    note = f"{document.get('timestamp', '')[:10]}, {document.get('rounds')} rounds{load}"
    if "throughput" in results:
        written += [ratio_chart(results["throughput"], out, note),
                    drain_chart(results["throughput"], out, note)]
    if "latency_memory" in results:
        latency = results["latency_memory"]
        written += latency_chart(latency, out, f"load {latency.get('load_before', 0):.1f}")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, nargs="+",
                        help="run.py JSON files (throughput and/or latency_memory parts)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    for path in args.results:
        for written in draw(json.loads(path.read_text()), args.out):
            print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
