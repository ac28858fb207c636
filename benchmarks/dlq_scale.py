"""Dead letters at scale: ``ojs-kombu dlq list``, ``show``, ``replay --all`` and
``purge --all`` on a dead-letter queue of N jobs, for two sizes of N (issue 39).

Each size gets a private vhost.  Its DLQ is filled the way jobs get there: N jobs
are published with ``enqueue_many`` (timed: the reference rate for replay), then
consumed and rejected (``Basic.Reject``, no requeue), so the broker dead-letters
them.  Each command runs as a subprocess; its wall time and its peak
RSS (its ``VmHWM`` at exit) are recorded, and the counts of the job queue and
the DLQ after each step (nothing lost, nothing doubled: after ``replay`` the job
queue holds exactly N and the DLQ none); before ``purge`` the
replayed jobs are dead-lettered again.  ``show`` asks for the
newest dead letter (the whole queue is browsed to find it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import amqp
from celery import Celery

import ojs_kombu

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from admin import local_ctl, private_vhost  # noqa: E402
from sides import celery_app, connect  # noqa: E402

SIZES = (10_000, 100_000)
QUEUE = "dead"
FILL_BATCH = 1000
NACK_WINDOW = 1000
COMMANDS = ("list", "show", "replay", "purge")


@dataclass
class Step:
    seconds: float
    peak_rss_mb: float
    exit_code: int
    job_queue_after: int
    dlq_after: int


@dataclass
class SizeResult:
    dead_letters: int
    enqueue_many_jobs_per_s: float
    steps: dict[str, Step]
    replay_jobs_per_s: float
    #: after the replay the job queue holds exactly n jobs and the DLQ none
    replay_counts_exact: bool
    #: :func:`raw_move`'s rate: the ceiling of a replay by a py-amqp client
    raw_move_jobs_per_s: float


def _app(url: str) -> Celery:
    app = celery_app("bench_dlq", url, ojs_prefix="")
    app.conf.update(task_ignore_result=True, result_backend=None)

    @app.task(name="bench.dead", shared=False, ignore_result=True)
    def dead(n: int) -> None:  # never runs: the benchmark rejects every job
        return None

    return app


def fill(url: str, amqp_url: str, n: int) -> tuple[float, list[str]]:
    """``n`` jobs through ``enqueue_many`` (jobs/s), then all of them dead-lettered."""
    app = _app(url)
    ids: list[str] = []
    try:
        task = app.tasks["bench.dead"]
        started = time.perf_counter()
        for done in range(0, n, FILL_BATCH):
            results = ojs_kombu.enqueue_many(
                app, [task.s(i).set(queue=QUEUE) for i in range(done, min(done + FILL_BATCH, n))])
            ids += [r.id for r in results]
        rate = n / (time.perf_counter() - started)
    finally:
        app.close()
    connection = connect(amqp_url)
    try:
        reject_all(connection.channel(), n)
    finally:
        connection.close()
    return rate, ids


def counts(channel: amqp.Channel) -> tuple[int, int]:
    return (channel.queue_declare(f"ojs.queue.{QUEUE}", passive=True).message_count,
            channel.queue_declare(f"ojs.queue.dlx.{QUEUE}", passive=True).message_count)


#: Runs ``ojs-kombu`` and writes its peak RSS (``VmHWM``, this process's own pages since
#: its ``exec``: a forked child's ``ru_maxrss`` also counts the parent's pages it
#: shared before ``exec``) to the file named by its first argument, at exit.
_MEASURED_CLI = """
import atexit, sys
out = sys.argv[1]
def peak():
    with open("/proc/self/status") as status, open(out, "w") as f:
        f.write(next(l.split()[1] for l in status if l.startswith("VmHWM:")))
atexit.register(peak)
from ojs_kombu.cli.main import main
main(sys.argv[2:])
"""


def run_command(url: str, *args: str) -> tuple[float, float, int, str]:
    """``ojs-kombu dlq ...`` (its human output: ``--json`` would keep every replayed id
    for the document): seconds, peak RSS in MB, exit code, stdout."""
    with tempfile.NamedTemporaryFile("r", suffix=".hwm") as peak:
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", _MEASURED_CLI, peak.name, "dlq", *args, "-q", QUEUE,
             "-b", url], capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - started
        kb = peak.read().strip()
    return seconds, int(kb) / 1024 if kb else 0.0, done.returncode, done.stdout


def measure(base_url: str, n: int, log: Callable[[str], None]) -> SizeResult:
    with private_vhost(local_ctl, f"ojs-dlq-{os.getpid()}-{n}") as vhost:
        parts = urlsplit(base_url)
        url = f"ojs://{parts.netloc}/{vhost}"
        amqp_url = f"amqp://{parts.netloc}/{vhost}"
        log(f"dlq scale: filling {n} dead letters ...")
        rate, ids = fill(url, amqp_url, n)
        newest = ids[-1]
        probe = connect(base_url, vhost=vhost)
        steps: dict[str, Step] = {}
        try:
            channel = probe.channel()
            for command in COMMANDS:
                log(f"dlq scale: {n}: dlq {command} ...")
                args = {"list": ("list",), "show": ("show", newest),
                        "replay": ("replay", "--all"), "purge": ("purge", "--all", "--yes")
                        }[command]
                if command == "purge":  # dead-letter the replayed jobs again first
                    reject_all(channel, n)
                    log(f"dlq scale: {n}: the same move by a bare py-amqp client ...")
                    raw_s = raw_move(probe, n)
                    reject_all(channel, n)
                seconds, rss, code, _ = run_command(url, *args)
                steps[command] = Step(seconds, rss, code, *counts(channel))
        finally:
            probe.close()
        replay = steps["replay"]
        return SizeResult(n, rate, steps, n / replay.seconds,
                          replay.job_queue_after == n and replay.dlq_after == 0, n / raw_s)


def raw_move(connection: amqp.Connection, n: int) -> float:
    """Seconds a bare py-amqp client takes to move the DLQ's ``n`` dead letters back to
    the job queue as they are (no decoding, no re-encoding): consumed with the replay's
    prefetch, republished pipelined with confirms a window at a time, then acked
    together, as ``dlq replay`` does.  The ceiling of any replay written on py-amqp."""
    from ojs_kombu.amqp.broker.dead_letters import REPLAY_WINDOW, REPLAY_WINDOWS_AHEAD

    channel = connection.channel()
    channel.confirm_select()
    confirmed = [0]
    channel.events["basic_ack"].add(  # RabbitMQ confirms a channel's publishes in order
        lambda tag, multiple: confirmed.__setitem__(0, max(confirmed[0], tag)))
    channel.basic_qos(0, REPLAY_WINDOWS_AHEAD * REPLAY_WINDOW, False)
    arrived: list[amqp.Message] = []
    started = time.perf_counter()
    tag = channel.basic_consume(f"ojs.queue.dlx.{QUEUE}", callback=arrived.append)
    published = 0
    while published < n:
        want = min(REPLAY_WINDOW, n - published)
        while len(arrived) < want:
            connection.drain_events(timeout=30)
        batch, arrived[:] = arrived[:want], arrived[want:]
        for message in batch:
            channel.basic_publish(amqp.Message(message.body, **message.properties),
                                  exchange="ojs.exchange.direct", routing_key=QUEUE)
        published += want
        while confirmed[0] < published:
            connection.drain_events(timeout=30)
        channel.basic_ack(batch[-1].delivery_tag, multiple=True)
    seconds = time.perf_counter() - started
    channel.basic_cancel(tag)
    channel.close()
    return seconds


def reject_all(channel: amqp.Channel, n: int) -> None:
    """Consume the job queue's ``n`` jobs and reject each (no requeue): the broker
    dead-letters them into the DLQ."""
    channel.basic_qos(0, NACK_WINDOW, False)
    rejected = [0]

    def reject(message: amqp.Message) -> None:
        channel.basic_reject(message.delivery_tag, requeue=False)
        rejected[0] += 1

    tag = channel.basic_consume(f"ojs.queue.{QUEUE}", callback=reject)
    while rejected[0] < n:
        channel.connection.drain_events(timeout=30)
    channel.basic_cancel(tag)


def run(base_url: str, sizes: tuple[int, ...] = SIZES,
        log: Callable[[str], None] = print) -> dict[str, Any]:
    results = [measure(base_url, n, log) for n in sizes]
    return {"results": [asdict(r) for r in results]}


def render(result: dict[str, Any]) -> list[str]:
    from report import grid

    rows: list[tuple[str, ...]] = [("dlq at scale", "dead letters", "seconds", "jobs/s",
                                    "peak RSS MB", "exit", "job queue / DLQ after")]
    for r in result["results"]:
        n = r["dead_letters"]
        for command, step in r["steps"].items():
            rate = f"{n / step['seconds']:.0f}" if command in ("replay", "purge") else "-"
            rows.append((f"ojs-kombu dlq {command}", str(n), f"{step['seconds']:.1f}", rate,
                         f"{step['peak_rss_mb']:.0f}", str(step["exit_code"]),
                         f"{step['job_queue_after']} / {step['dlq_after']}"))
    lines = grid(rows)
    for r in result["results"]:
        lines.append(f"  {r['dead_letters']}: replay {r['replay_jobs_per_s']:.0f} jobs/s vs "
                     f"enqueue_many {r['enqueue_many_jobs_per_s']:.0f} jobs/s "
                     f"({r['replay_jobs_per_s'] / r['enqueue_many_jobs_per_s']:.2f}x); "
                     f"bare py-amqp moving them back {r['raw_move_jobs_per_s']:.0f} jobs/s "
                     f"({r['raw_move_jobs_per_s'] / r['enqueue_many_jobs_per_s']:.2f}x, "
                     f"replay at {r['replay_jobs_per_s'] / r['raw_move_jobs_per_s']:.2f}x it); "
                     "job queue and DLQ after it: "
                     f"{'exactly n and 0' if r['replay_counts_exact'] else 'NOT n and 0'}")
    return lines


if __name__ == "__main__":
    sizes = tuple(int(s) for s in sys.argv[1].split(",")) if len(sys.argv) > 1 else SIZES
    outcome = run("amqp://guest:guest@127.0.0.1:5672//", sizes)
    print("\n".join(render(outcome)))
    if len(sys.argv) > 2:
        Path(sys.argv[2]).write_text(json.dumps(outcome, indent=1))
