"""``celery inspect`` against a real OJS worker: every answer is JSON.

Celery's remote control serialises a worker's answer as JSON; ``stats``
includes the broker connection's transport options, where ``install()`` puts
the key of the app's binding.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .workers import launch_worker

ROOT = Path(__file__).resolve().parents[1]
NODE = "stats@inspect-test"


def _celery(broker_url: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "integration.cliapp", *args],
        cwd=ROOT, env={**os.environ, "OJS_TEST_BROKER_URL": broker_url},
        capture_output=True, text=True, timeout=timeout, check=False)


def _inspect(broker_url: str, command: str) -> dict[str, Any]:
    """``celery inspect COMMAND --json`` to the test's worker; its parsed stdout."""
    done = _celery(broker_url, "inspect", command, "--json", "-d", NODE, "-t", "10")
    assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def prefork_worker(broker_url: str, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[Path]:
    """A ``celery worker`` subprocess (prefork pool); yields its log file."""
    log = tmp_path_factory.mktemp("stats") / "worker.log"
    with launch_worker(broker_url, "integration.cliapp", "stats", hostname=NODE,
                       pool="prefork", concurrency=1, log=log):
        yield log


def test_inspect_stats_answers_with_json(broker_url: str, prefork_worker: Path) -> None:
    stats = _inspect(broker_url, "stats")
    assert list(stats) == [NODE]
    answer = stats[NODE]
    assert answer["pool"]["max-concurrency"] == 1
    assert answer["broker"]["transport"] == "ojs"
    options = answer["broker"]["transport_options"]
    assert isinstance(options["ojs_binding"], str)
    assert "EncodeError" not in prefork_worker.read_text()


def test_inspect_conf_and_report_answer_with_json(broker_url: str,
                                                  prefork_worker: Path) -> None:
    conf = _inspect(broker_url, "conf")[NODE]
    assert conf["task_acks_late"] is True and conf["ojs_worker_heartbeat"] == 1
    assert not [key for key, value in conf.items()
                if isinstance(value, str) and "object at 0x" in value]  # nothing repr'd
    report = _inspect(broker_url, "report")[NODE]
    assert "ojs_kombu" in report["ok"] or "ojs" in report["ok"]
    assert "Binding(" not in report["ok"]
