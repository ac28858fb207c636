"""Where a waiting publish spends its time, per call (``--only publish_phases``).

One confirmed publish at a time, as a web request enqueues, on four sides: plain
Celery with ``confirm_publish``, ojs_kombu's ``apply_async`` (it waits for its
confirm), Dramatiq's ``actor.send`` with ``confirm_delivery``, and raw py-amqp
publishing a copy of one job ojs_kombu published (no encoding: the same bytes
each call).  Each side runs in a process of its own (``python
benchmarks/publish_phases.py side KIND BROKER_URL JOBS``), once per round, the
side order rotated each round.

Inside it, a few functions of the libraries are wrapped with a clock before any
connection is made, and each wrapped call's time *minus the wrapped calls inside
it* goes to its phase, so the phases add up to the call:

* **encode**: the message body's one serialization (kombu's ``dumps``,
  ojs_kombu's ``encode_task``, Dramatiq's ``Message.encode``);
* **frames**: the AMQP frames (py-amqp's ``_basic_publish`` and frame writer,
  ojs_kombu's ``PublishFrames.encode``, pika's ``Channel.basic_publish``);
* **write**: the socket write (py-amqp's ``transport.write``; pika writes while
  it waits, so there it is in the wait);
* **reads, confirm wait**: reading the socket until the confirm came (py-amqp's
  ``drain_events`` and ``Channel.wait``, ojs_kombu's wait for the settle, pika's
  ``_flush_output``), py-amqp's poll for ``connection.blocked`` before each
  publish included;
* **producer**: the producer's own work around those (kombu's
  ``Producer.publish``, ojs_kombu's ``JobProducer.publish``: the job's route,
  the confirm tracking, the metrics hooks; Dramatiq's ``broker.enqueue``);
* **send path**: the rest of the call: Celery's ``apply_async`` and
  ``send_task_message`` with its publish signals (ojs_kombu's wrapper of it
  included), Dramatiq's middleware.

Wall µs per call, each phase's µs per call and the process's CPU µs per call are
medians over the rounds.  The wrap costs about a microsecond per wrapped call.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial, wraps
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

SIDES = {
    "plain": "plain Celery apply_async, confirm_publish",
    "ojs": "ojs_kombu apply_async (waits for its confirm)",
    "dramatiq": "Dramatiq actor.send, confirm_delivery",
    "raw": "raw py-amqp, the same OJS job, one confirm each",
}
PHASES = ("send path", "producer", "encode", "frames", "write", "reads, confirm wait")


class PhaseClock:
    """Exclusive time per phase: a wrapped call's time minus its wrapped inner calls'."""

    def __init__(self) -> None:
        self.totals: Counter[str] = Counter()
        self._inner: list[float] = []

    def wrap(self, owner: Any, name: str, phase: str) -> None:
        original = getattr(owner, name)
        inner, totals, clock = self._inner, self.totals, time.perf_counter

        @wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            inner.append(0.0)
            started = clock()
            try:
                return original(*args, **kwargs)
            finally:
                spent = clock() - started
                totals[phase] += spent - inner.pop()
                if inner:
                    inner[-1] += spent

        setattr(owner, name, timed)

    def reset(self) -> None:
        self.totals.clear()


def instrument(kind: str, phases: PhaseClock) -> None:
    """Wrap the functions each phase is made of, before any connection is made (py-amqp's
    frame writer keeps the transport's ``write`` it found)."""
    import amqp.abstract_channel
    import amqp.channel
    import amqp.connection
    import amqp.transport

    reads = "reads, confirm wait"
    phases.wrap(amqp.transport._AbstractTransport, "write", "write")
    phases.wrap(amqp.connection.Connection, "drain_events", reads)
    phases.wrap(amqp.abstract_channel.AbstractChannel, "wait", reads)
    phases.wrap(amqp.channel.Channel, "_basic_publish", "frames")  # kombu's path
    phases.wrap(amqp.channel.Channel, "basic_publish", "frames")  # the same, its alias
    if kind == "plain":
        import kombu.messaging

        phases.wrap(kombu.messaging, "dumps", "encode")
        phases.wrap(kombu.messaging.Producer, "publish", "producer")
    elif kind == "ojs":
        from ojs_kombu.amqp.publishing.publisher import JobPublisher
        from ojs_kombu.amqp.wire.publish_frames import PublishFrames
        from ojs_kombu.celery import task_sender

        phases.wrap(task_sender, "encode_task", "encode")
        phases.wrap(task_sender.JobProducer, "publish", "producer")
        phases.wrap(PublishFrames, "encode", "frames")
        phases.wrap(JobPublisher, "_wait_settled", reads)
    elif kind == "dramatiq":
        import dramatiq
        import pika.adapters.blocking_connection as blocking
        import pika.channel
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        phases.wrap(dramatiq.Message, "encode", "encode")
        phases.wrap(RabbitmqBroker, "enqueue", "producer")
        phases.wrap(pika.channel.Channel, "basic_publish", "frames")
        phases.wrap(blocking.BlockingConnection, "_flush_output", reads)


def side(kind: str, broker_url: str, jobs: int) -> dict[str, Any]:
    """Publish ``jobs`` one at a time on side ``kind``; wall, CPU and phase µs per call."""
    phases = PhaseClock()
    instrument(kind, phases)
    from admin import Broker  # benchmarks/ is sys.path[0] when this file runs as a script
    from dramatiq_side import DramatiqPublisher, queues_of
    from raw_side import raw_publisher
    from sides import TASK_ARGS, WARMUP, make_ojs_side, make_plain_side

    broker, pid = Broker(broker_url), os.getpid()
    with ExitStack() as stack:
        stack.callback(broker.close)
        send: Callable[[], Any]
        if kind == "dramatiq":
            queue = f"bench-dq-{pid}"
            stack.callback(broker.delete, queues_of(queue), [])
            dramatiq_side = DramatiqPublisher(broker_url, queue, confirm=True)
            stack.callback(dramatiq_side.close)
            send, purge = partial(dramatiq_side.actor.send, *TASK_ARGS), queue
        else:
            made = (make_plain_side(broker_url, pid) if kind == "plain"
                    else make_ojs_side(broker_url, pid))
            stack.callback(broker.delete_side, made)
            stack.callback(made.app.close)
            made.declare()
            purge = made.amqp_queue
            send = partial(made.task.apply_async, TASK_ARGS)
            if kind == "raw":
                raw = stack.enter_context(raw_publisher(broker, broker_url, made))
                send = partial(raw.send, 1, 1)
        for _ in range(WARMUP):
            send()
        broker.purge(purge)
        phases.reset()
        cpu, started = time.process_time(), time.perf_counter()
        for _ in range(jobs):
            send()
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        measured = {phase: phases.totals[phase] for phase in PHASES[1:]}
        broker.purge(purge)
    measured["send path"] = wall - sum(measured.values())
    per_call = 1e6 / jobs
    return {"wall_us": wall * per_call, "cpu_us": cpu * per_call,
            "phases_us": {phase: seconds * per_call for phase, seconds in measured.items()}}


def run_part(broker_url: str, jobs: int, rounds: int,
             log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every side once per round, each in a process of its own; medians per side."""
    order, samples = list(SIDES), {kind: [] for kind in SIDES}
    for number in range(rounds):
        turn = order[number % len(order):] + order[:number % len(order)]
        for kind in turn:
            log(f"publish phases: round {number + 1}/{rounds}, {kind}")
            done = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "side", kind, broker_url,
                 str(jobs)], capture_output=True, text=True, timeout=600, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"publish phases, side {kind}: {done.stderr.strip()[-2000:]}")
            samples[kind].append(json.loads(done.stdout.strip().splitlines()[-1]))
    medians: dict[str, Any] = {}
    for kind, runs in samples.items():
        medians[kind] = {
            "wall_us": statistics.median(r["wall_us"] for r in runs),
            "cpu_us": statistics.median(r["cpu_us"] for r in runs),
            "phases_us": {p: statistics.median(r["phases_us"][p] for r in runs)
                          for p in PHASES}}
    return {"jobs": jobs, "rounds": rounds, "medians": medians, "samples": samples}


def render(result: dict[str, Any]) -> list[str]:
    """One row per phase, one column per side, µs per call; then wall, CPU and ratios (the
    table's lines)."""
    medians = result["medians"]
    head = ["µs per call (median)", *SIDES]
    rows = [[phase, *(f"{medians[k]['phases_us'][phase]:,.0f}" for k in SIDES)]
            for phase in PHASES]
    rows.append(["wall (the call)", *(f"{medians[k]['wall_us']:,.0f}" for k in SIDES)])
    rows.append(["CPU of the process", *(f"{medians[k]['cpu_us']:,.0f}" for k in SIDES)])
    plain = medians["plain"]["wall_us"]
    rows.append(["plain Celery's wall / this", *(f"{plain / medians[k]['wall_us']:.2f}x"
                                                  for k in SIDES)])
    widths = [max(len(str(row[i])) for row in [head, *rows]) for i in range(len(head))]
    lines = [f"Where a waiting publish spends its time ({result['jobs']} calls per side, "
             f"{result['rounds']} rounds; sides: "
             + "; ".join(f"{k} = {label}" for k, label in SIDES.items()) + ")"]
    for row in [head, *rows]:
        lines.append("  ".join(str(cell).rjust(w) if i else str(cell).ljust(w)
                               for i, (cell, w) in enumerate(zip(row, widths, strict=True))))
    return lines


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "side":
        print(json.dumps(side(sys.argv[2], sys.argv[3], int(sys.argv[4]))), flush=True)
    else:
        sys.exit("usage: publish_phases.py side plain|ojs|dramatiq|raw BROKER_URL JOBS "
                 "(run.py --only publish_phases runs every side)")
