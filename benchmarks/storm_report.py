"""The poison storm's comparison rules and table: pure functions on the measured numbers,
so they can be tested without a broker (tests/test_benchmark_report.py).

A side's *poison rate* counts the poison deliveries it got through per second.
ojs_kombu must dead-letter every one of them, so only what reached its
dead-letter queue counts.  Plain Celery dead-letters its unregistered tasks but
acks (drops) its undecodable messages, so every delivery that left its queue
counts: dividing dead letters alone would credit ojs_kombu twice for the same
speed, since it dead-letters both kinds.
"""

from __future__ import annotations

from typing import Any

from report import grid

SIDES = ("plain", "ojs")
LABELS = {"plain": "plain Celery", "ojs": "ojs_kombu"}
TARGET_RATE = 1.0
#: SIGTERM-to-exit varies by a few tenths of a second from run to run: an ojs_kombu
#: worker exiting up to this much later than plain Celery's counts as no later.
EXIT_TOLERANCE_S = 1.0
TARGET_LINE = ("target: dead-lettering rate >= 1.0x plain Celery's; ping answered; "
               "exit no later than plain")


def settled(side: str, published: int, dead_lettered: int, left: int | None) -> int:
    """Poison deliveries a side got through: ojs_kombu's dead letters; plain Celery's
    deliveries that left its queue (dead-lettered or acked), at least its dead letters."""
    if side == "ojs" or left is None:
        return dead_lettered
    return max(dead_lettered, published - left)


def rate(side: str, published: int, dead_lettered: int, left: int | None,
         seconds: float) -> float:
    """Poison deliveries per second (see :func:`settled`)."""
    return settled(side, published, dead_lettered, left) / seconds if seconds > 0 else 0.0


def ratio(pool: dict[str, Any]) -> float | None:
    """ojs_kombu's poison rate over plain Celery's; ``None`` without both (or plain at 0)."""
    plain, ojs = pool.get("plain"), pool.get("ojs")
    if not plain or not ojs or not plain["rate"]:
        return None
    return ojs["rate"] / plain["rate"]


def pings_answered(side: dict[str, Any]) -> bool:
    """Every ping sent during the side answered (and at least one was sent)."""
    pings = side.get("pings") or []
    return bool(pings) and all(p["answered"] for p in pings)


def exit_no_later(plain: dict[str, Any], ojs: dict[str, Any]) -> bool:
    """ojs_kombu's worker exited after SIGTERM, within the tolerance of plain Celery's
    exit (a plain worker that had to be killed is beaten by any exit)."""
    if ojs["killed"] or ojs["exit_s"] is None:
        return False
    if plain["killed"] or plain["exit_s"] is None:
        return True
    return ojs["exit_s"] <= plain["exit_s"] + EXIT_TOLERANCE_S


def assess(pool: dict[str, Any]) -> dict[str, Any]:
    """The three parts of the target for one pool and the overall verdict."""
    plain, ojs = pool.get("plain"), pool.get("ojs")
    measured = ratio(pool)
    rate_met = measured is not None and measured >= TARGET_RATE
    ping_met = bool(ojs) and pings_answered(ojs)
    exit_met = bool(plain and ojs) and exit_no_later(plain, ojs)
    return {"ratio": measured, "minimum": TARGET_RATE, "rate_met": rate_met,
            "ping_met": ping_met, "exit_met": exit_met,
            "exit_tolerance_s": EXIT_TOLERANCE_S,
            "met": rate_met and ping_met and exit_met}


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def ping_cell(side: dict[str, Any]) -> str:
    """``y 12 ms`` (slowest answer) when every ping answered, ``n (1/2)`` otherwise;
    ``, after`` when no ping was sent while the storm was still on."""
    pings = side.get("pings") or []
    if not pings:
        return "-"
    answered = [p for p in pings if p["answered"]]
    if len(answered) == len(pings):
        text = f"y {max(p['ms'] for p in answered):.0f} ms"
    else:
        text = f"n ({len(answered)}/{len(pings)})"
    return text if any(p["during_storm"] for p in pings) else f"{text}, after"


def exit_cell(side: dict[str, Any], unit: str = "") -> str:
    return "killed" if side["killed"] else _cell(side["exit_s"], ".2f") + unit


def rate_cell(value: float) -> str:
    """Whole jobs/s, but a trickle (a few per second or less) keeps its digits."""
    return format(value, ".0f" if value >= 100 else ".1f" if value >= 1 else ".2f")


def ratio_cell(value: float | None) -> str:
    if value is not None and 0 < value < 0.01:
        return "<0.01"
    return _cell(value, ".2f")


def dead_cell(side: dict[str, Any]) -> str:
    cell = f"{side['dead_lettered']}/{side['expected_dead_letters']}"
    return f"{cell} (timeout)" if side["timed_out"] else cell


def _verdict(met: bool) -> str:
    return "met" if met else "not met"


def render(result: dict[str, Any]) -> list[str]:
    """The storm table (a row per pool and side), notes, then the target per pool."""
    rows: list[tuple[str, ...]] = [(
        "poison storm", "side", "dead-lettered", "seconds", "poison/s", "ratio (ojs/plain)",
        "ping", "exit after SIGTERM s")]
    notes: list[str] = []
    for pool_name, pool in result["pools"].items():
        measured = ratio(pool)
        for key in SIDES:
            side = pool.get(key)
            if side is None:
                continue
            rows.append((pool_name, LABELS[key], dead_cell(side), f"{side['seconds']:.2f}",
                         rate_cell(side["rate"]), ratio_cell(measured) if key == "ojs" else "-",
                         ping_cell(side), exit_cell(side)))
            notes += side_notes(pool_name, key, side)
    lines = grid(rows)
    lines.append("  poison/s: poison deliveries got through per second (ojs_kombu: "
                 "dead-lettered; plain Celery: unregistered tasks dead-lettered, undecodable "
                 "messages acked)")
    lines += [f"  {note}" for note in notes]
    lines += ["", TARGET_LINE]
    for pool_name, pool in result["pools"].items():
        verdict = assess(pool)
        plain, ojs = pool.get("plain") or {}, pool.get("ojs") or {}
        exit_text = (f"{exit_cell(ojs, ' s')} vs {exit_cell(plain, ' s')}"
                     if plain and ojs else "-")
        lines.append(f"  {pool_name}: {_verdict(verdict['met'])} (rate "
                     f"{ratio_cell(verdict['ratio'])}x: {_verdict(verdict['rate_met'])}; "
                     f"ping: {_verdict(verdict['ping_met'])}; exit {exit_text}: "
                     f"{_verdict(verdict['exit_met'])})")
    lines.append(f"  exit: up to {EXIT_TOLERANCE_S:g} s after plain Celery's counts as no later")
    return lines


def side_notes(pool: str, key: str, side: dict[str, Any]) -> list[str]:
    """What the row alone does not say: a timeout, where each kind of poison ended up once
    the worker exited (dead-lettered, back in the job queue, or lost), and the error codes
    ojs_kombu's dead letters carry."""
    who = f"{LABELS[key]}, {pool}"
    notes = []
    if side["timed_out"]:
        notes.append(f"{who}: timed out after {side['seconds']:.0f} s: {side['dead_lettered']} "
                     f"of {side['expected_dead_letters']} in the DLQ, "
                     f"{_cell(side['left_in_queue'], 'd')} still in the job queue")
    kinds = side.get("kinds") or {}
    if kinds:
        parts = [f"{kind} {n['published']}: {n['dead_lettered']} dead-lettered, {n['left']} "
                 f"in the job queue, {n['lost']} lost"
                 + (" (acked and dropped)" if n["lost"] and key == "plain" else "")
                 + (f", {n['duplicated']} duplicated" if n.get("duplicated") else "")
                 for kind, n in kinds.items()]
        notes.append(f"{who}, after exit: " + "; ".join(parts))
    codes = side.get("dead_letter_codes") or {}
    if codes:
        notes.append(f"{who}: x-ojs-error-code of its dead letters: "
                     + ", ".join(f"{code} {count}" for code, count in sorted(codes.items())))
    return notes
