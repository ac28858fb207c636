"""Recovery from a node restart, for the scale part's quorum-queue run on the three-node
cluster (``--only scale_cluster``).

After a side's worker was timed (and stopped), :data:`JOBS_PER_QUEUE` jobs are
published to each of its job queues, each confirmed; then the first node (where the
clients declared the queues, so the node of every leader) is stopped and started
again.  Timed from the stop: the node answering AMQP again (*node back*) and every
quorum queue of the vhost with all three members online (*queues online*, read on
the second node).  Then a worker drains the queues; every job is a distinct tag in its
record file, so the run counts jobs published, ran, lost and run twice.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scale_app import make_app, queue_names
from scale_worker import Worker

JOBS_PER_QUEUE = 20
ONLINE_TIMEOUT_S = 300.0
DRAIN_TIMEOUT_S = 300.0


@dataclass
class Recovery:
    published: int
    node_back_s: float
    queues_online_s: float
    drained_s: float
    ran: int
    lost: int
    duplicates: int


def all_online(ctl: Any, vhost: str) -> bool:
    """Every quorum queue of ``vhost`` lists three online members."""
    out = ctl("list_queues", "-p", vhost, "--no-table-headers", "name", "type", "online",
              check=False)
    rows = [line.split("\t") for line in out.splitlines() if line.strip()]
    quorum = [row for row in rows if len(row) > 2 and row[1] == "quorum"]
    return bool(quorum) and all(row[2].count("@") == 3 for row in quorum)


def measure(side: str, n: int, broker_url: str, vhost: str, workdir: Path,
            cluster: Any) -> Recovery:
    app = make_app(broker_url, side, quorum=True)
    jobs = [(queue, f"recover-{queue}-{i}") for queue in queue_names(n)
            for i in range(JOBS_PER_QUEUE)]
    tags = [tag for _, tag in jobs]
    try:
        noop = app.tasks["scale.noop"]
        for queue, tag in jobs:
            noop.apply_async((tag,), queue=queue)
    finally:
        app.close()
    first, second = cluster.nodes[0], cluster.nodes[1]
    started = time.perf_counter()
    first.stop()
    first.start()
    first.await_up()
    node_back = time.perf_counter() - started
    deadline = time.monotonic() + ONLINE_TIMEOUT_S
    while not all_online(second.ctl, vhost):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{side} x{n}: quorum queues not all online after "
                               f"{ONLINE_TIMEOUT_S:.0f}s")
        time.sleep(0.2)
    online = time.perf_counter() - started
    worker = Worker(side, broker_url, n, workdir, quorum=True, tag="-recovery")  # own record
    try:
        worker.wait_ready()
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while worker.done() < len(tags) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # a job run twice would show up now
        drained = time.perf_counter() - started
    finally:
        worker.stop()
    ran = Counter(worker.record.read_text().splitlines())
    return Recovery(len(tags), node_back, online, drained, sum(1 for t in tags if t in ran),
                    sum(1 for t in tags if t not in ran),
                    sum(count - 1 for count in ran.values() if count > 1))
