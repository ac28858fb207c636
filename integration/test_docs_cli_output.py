"""The ``topology show`` and ``conformance`` output docs/cli.rst shows is what the
commands print against a real broker (a vhost of its own, a worker of ``email``
running).  ``OJS_REGEN_DOCS=1`` writes docs/cli_output/ instead (tests/docs_output.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import amqp

from tests.docs_output import OUTPUT, check_block, normalise

from .apps import make_app
from .conftest import HOST, PORT, WorkerLauncher, private_vhost, queue_depth, wait_until

ROOT = Path(__file__).resolve().parents[1]


def ojs_kombu(broker_url: str, *args: str) -> str:
    script = Path(sys.executable).parent / "ojs-kombu"
    env = {k: v for k, v in os.environ.items()
           if k not in ("CELERY_APP", "CELERY_BROKER_URL", "OJS_BROKER_URL", "OJS_PREFIX")}
    env["COLUMNS"] = "100"
    result = subprocess.run([str(script), *args, "-b", broker_url], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_topology_show_as_docs_cli_shows_it(worker_launcher: WorkerLauncher) -> None:
    with private_vhost("ojs-kombu-docs") as vhost:
        broker_url = f"ojs://guest:guest@{HOST}:{PORT}/{vhost}"
        worker = worker_launcher("integration.cliapp", "email", broker_url=broker_url)
        try:
            producer = make_app("docs-producer", broker_url, "cache+memory://")
            producer.send_task("math.add", args=[1, 2], queue="email", countdown=600)
            connection = amqp.Connection(f"{HOST}:{PORT}", virtual_host=vhost)
            connection.connect()
            try:
                channel = connection.channel()
                wait_until(lambda: sum(queue_depth(channel, f"ojs.queue.schedule.{k}")
                                       for k in range(32)) == 1,
                           what="the scheduled job on the ladder")
            finally:
                connection.close()
            output = ojs_kombu(broker_url, "topology", "show", "-q", "email")
        finally:
            worker.stop()
    check_block("topology-show.txt", normalise(output, {vhost: "/"}))


def rows(text: str) -> list[tuple[str, str, str]]:
    """``(id, verdict, requirement)`` of each row of a conformance table."""
    return [(i, v, r.strip()) for i, v, r in
            re.findall(r"^(AMQP-\d{3})  (PASS|FAIL|WARN|N/A) +(.+?)  ", text, re.M)]


def test_conformance_as_docs_cli_shows_it(worker_launcher: WorkerLauncher) -> None:
    """Its reasons carry the run's timings, so outside ``OJS_REGEN_DOCS=1`` the rows
    (id, verdict, requirement) and the summary are compared with the block shown."""
    with private_vhost("ojs-kombu-docs") as vhost:
        broker_url = f"ojs://guest:guest@{HOST}:{PORT}/{vhost}"
        with worker_launcher("integration.cliapp", "email", broker_url=broker_url,
                             control=True, env={"OJS_TEST_CONFORMANCE_PROBES": "1",
                                                "OJS_TEST_QUEUE_MAX_PRIORITY": "10"}):
            output = ojs_kombu(broker_url, "conformance", "-q", "email", "--schedule",
                               "--recovery")
    output = normalise(re.sub(r"ojs-conformance-[0-9a-f]{10}", "ojs-conformance-5f2c8e41a0",
                              output), {vhost: "/"})
    if os.environ.get("OJS_REGEN_DOCS") == "1":
        check_block("conformance.txt", output)
        return
    shown = (OUTPUT / "conformance.txt").read_text()
    assert rows(output) == rows(shown), output
    assert output.strip().splitlines()[-1] == shown.strip().splitlines()[-1]
