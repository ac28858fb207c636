"""CLI output docs/cli.rst shows, checked against the CLI without a broker
(``integration/test_docs_cli_output.py`` runs ``topology show`` on a real one).
``OJS_REGEN_DOCS=1`` writes docs/cli_output/ instead (tests/docs_output.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from ojs_kombu.cli.conformance_report import REQUIREMENTS

from .docs_output import OUTPUT, check_block, normalise

LAYOUTS = Path(__file__).resolve().parent / "celery_layouts"


def test_migrate_check_as_docs_cli_shows_it() -> None:
    script = Path(sys.executable).parent / "ojs-kombu"
    env = {k: v for k, v in os.environ.items() if k != "CELERY_APP"}
    env["COLUMNS"] = "100"
    result = subprocess.run([str(script), "migrate", "check", "-A", "shop"], cwd=LAYOUTS,
                            env=env, capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    check_block("migrate-check.txt", normalise(result.stdout))


def test_the_conformance_run_shown_has_the_commands_rows_and_summary() -> None:
    """Each row of the run shown is the command's requirement, in its order, and the
    summary counts the rows' verdicts (the integration test compares the verdicts
    with a run)."""
    text = (OUTPUT / "conformance.txt").read_text()
    rows = re.findall(r"^(AMQP-\d{3})  (PASS|FAIL|WARN|N/A) +(.+?)  ", text, re.M)
    assert [row[0] for row in rows] == list(REQUIREMENTS)
    for check_id, _, requirement in rows:
        assert requirement.strip() == REQUIREMENTS[check_id][0][:48]
    counts = {s: sum(row[1] == s for row in rows) for s in ("PASS", "FAIL", "WARN", "N/A")}
    assert text.rstrip().endswith(
        f"{counts['PASS']} pass, {counts['FAIL']} fail, {counts['WARN']} warn (SHOULD not "
        f"met), {counts['N/A']} n/a")
