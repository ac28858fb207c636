"""What typed arguments cost: plain Celery and ojs_kombu, untyped and typed, side by side.

Celery's JSON tags ``date``, ``Decimal``, ``UUID`` and ``datetime`` values; ojs_kombu
writes them in their natural JSON forms with their types in ``meta.x_celery_types``.
The question is whether that costs more than plain Celery's tagging does: four
contenders, each a single confirmed ``apply_async`` at a time (plain Celery with
``confirm_publish``), with :data:`UNTYPED` and with :data:`TYPED` arguments, their
blocks interleaved in turns as the throughput part's publishes, the order reversed on
odd rounds.  Reported: jobs/s, and ojs_kombu's ratio to plain Celery with the same
arguments, untyped and typed.

Beside it, without a broker, the encoding alone in CPU µs per job (the best of seven
blocks): kombu's JSON of the task message (what plain Celery writes) and ojs_kombu's
envelope (``encode_task_message``), for both argument sets.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from report import block_orders, block_sizes, grid

UNTYPED = (42, "benchmark", 1.5, "2026-07-01")
TYPED = (42, "benchmark", Decimal("19.90"), date(2026, 7, 1),
         uuid.UUID("0f8fad5b-d9cb-469f-a165-70867728950e"),
         datetime(2026, 7, 1, 9, 30, tzinfo=UTC))
CONTENDERS = {
    "plain_untyped": ("plain", UNTYPED), "ojs_untyped": ("ojs", UNTYPED),
    "plain_typed": ("plain", TYPED), "ojs_typed": ("ojs", TYPED),
}
LABELS = {
    "plain_untyped": "plain Celery apply_async, confirm_publish, untyped args",
    "ojs_untyped": "ojs_kombu apply_async (confirmed), untyped args",
    "plain_typed": "plain Celery apply_async, confirm_publish, typed args",
    "ojs_typed": "ojs_kombu apply_async (confirmed), typed args",
}

TimeBlock = Callable[[Callable[[int], list[float]], str, Any, int], tuple[float, list[float]]]


def _publisher(task: Any, args: tuple[Any, ...]) -> Callable[[int], list[float]]:
    def send(n: int) -> list[float]:
        apply_async, clock = task.apply_async, time.perf_counter
        latencies = []
        for _ in range(n):
            started = clock()
            apply_async(args)
            latencies.append(clock() - started)
        return latencies
    return send


def encode_cost(app: Any, repeat: int = 5000) -> dict[str, float]:
    """µs per job of each side's encoding of one call, untyped and typed (no broker)."""
    from kombu.serialization import dumps

    from ojs_kombu.spec.encode import CELERY_CALL, encode_task_message
    from ojs_kombu.spec.job_ids import new_job_id

    costs: dict[str, float] = {}
    for kind, args in (("untyped", UNTYPED), ("typed", TYPED)):
        message = app.amqp.as_task_v2(new_job_id(), "bench.noop", args, {})
        headers = dict(message.headers)

        def kombu_json(message: Any = message) -> Any:
            return dumps(message.body, serializer="json")

        def envelope(message: Any = message, headers: dict[str, Any] = headers) -> Any:
            return encode_task_message(body=message.body, content_type=CELERY_CALL,
                                       properties={}, headers=headers,
                                       job_type="bench.noop", queue="bench")

        for name, call in (("plain", kombu_json), ("ojs", envelope)):
            samples = []
            for _ in range(7):  # CPU time of this process: other work on the machine
                started = time.process_time()  # does not count, the best of 7 is kept
                for _ in range(repeat):
                    call()
                samples.append((time.process_time() - started) / repeat * 1e6)
            costs[f"{name}_{kind}_us"] = min(samples)
    return costs


def run(plain: Any, ojs: Any, broker: Any, time_block: TimeBlock, *, jobs: int,
        rounds: int, blocks: int, log: Callable[[str], None]) -> dict[str, Any]:
    """``plain`` and ``ojs`` are the throughput part's sides (declared and warmed up)."""
    sides = {"plain": plain, "ojs": ojs}
    senders = {key: (_publisher(sides[side].task, args), sides[side].amqp_queue)
               for key, (side, args) in CONTENDERS.items()}
    for send, queue in senders.values():
        send(50)
        broker.purge(queue)
    per_round: dict[str, list[float]] = {key: [] for key in CONTENDERS}
    cpu_round: dict[str, list[float]] = {key: [] for key in CONTENDERS}
    for r in range(rounds):
        spent = dict.fromkeys(CONTENDERS, 0.0)
        cpu = dict.fromkeys(CONTENDERS, 0.0)
        sizes = block_sizes(jobs, blocks)
        for b, order in enumerate(block_orders(list(CONTENDERS), blocks, r % 2 == 0)):
            for key in order:
                log(f"typed_publish: round {r + 1}/{rounds}, block {b + 1}, {LABELS[key]}")
                send, queue = senders[key]
                started = time.process_time()
                seconds, _ = time_block(send, queue, broker, sizes[b])
                cpu[key] += time.process_time() - started
                spent[key] += seconds
        for key in CONTENDERS:
            per_round[key].append(jobs / spent[key])
            cpu_round[key].append(cpu[key] / jobs * 1e6)
    medians = {key: statistics.median(rates) for key, rates in per_round.items()}
    cpu_us = {key: statistics.median(values) for key, values in cpu_round.items()}
    ratios = {"untyped": medians["ojs_untyped"] / medians["plain_untyped"],
              "typed": medians["ojs_typed"] / medians["plain_typed"]}
    cpu_ratios = {"untyped": cpu_us["ojs_untyped"] / cpu_us["plain_untyped"],
                  "typed": cpu_us["ojs_typed"] / cpu_us["plain_typed"]}
    return {"jobs_per_s": medians, "rounds": per_round, "ratio_to_plain": ratios,
            "cpu_us_per_publish": cpu_us, "cpu_rounds": cpu_round,
            "cpu_ratio_to_plain": cpu_ratios, "encode_us": encode_cost(ojs.app),
            "jobs": jobs, "typed_args": repr(TYPED), "untyped_args": repr(UNTYPED)}


def render(result: dict[str, Any]) -> list[str]:
    """The table's lines, as every part's ``render`` gives them to ``run.py``."""
    rates, ratios, us = result["jobs_per_s"], result["ratio_to_plain"], result["encode_us"]
    cpu, cpu_ratios = result["cpu_us_per_publish"], result["cpu_ratio_to_plain"]

    def ratio(table: dict[str, float], key: str) -> str:
        return f"{table[key.split('_')[1]]:.2f}x" if key.startswith("ojs") else "1.00x"

    rows = [(LABELS[key], f"{rates[key]:,.0f}", ratio(ratios, key), f"{cpu[key]:.0f}",
             ratio(cpu_ratios, key), f"{us[key + '_us']:.1f}") for key in CONTENDERS]
    return [
        f"Typed arguments ({result['jobs']} confirmed apply_async per contender and round; "
        "median of rounds)",
        *grid([("contender", "jobs/s", "jobs/s to plain, same args", "CPU µs/publish",
                "CPU to plain, same args", "encode µs/job"), *rows]),
        f"jobs/s: typed {ratios['typed']:.2f}x vs untyped {ratios['untyped']:.2f}x plain "
        f"Celery; CPU per publish: typed {cpu_ratios['typed']:.2f}x vs untyped "
        f"{cpu_ratios['untyped']:.2f}x"]
