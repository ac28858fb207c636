"""The reference tables docs/ writes from the code (docs/_ext/ojs_docs.py): every
command with the options it takes, every setting with its default and meaning."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("sphinx", reason="the docs extra (pip install -e '.[docs]') builds docs/")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs" / "_ext"))

import ojs_docs

from ojs_kombu.spec.settings import OJSSettings


def rows_by_command() -> dict[str, str]:
    return {command: usage for command, usage, _ in ojs_docs.command_rows()}


def test_every_command_is_in_the_table_with_the_flags_it_accepts() -> None:
    rows = rows_by_command()
    assert {"ojs-kombu dlq replay", "ojs-kombu dlq purge", "ojs-kombu migrate check",
            "ojs-kombu conformance", "ojs-kombu topology show", "ojs-kombu enqueue",
            "ojs-kombu events tail", "ojs-kombu dedup clear"} <= set(rows)
    assert "--yes" in rows["ojs-kombu dlq purge"]
    assert "--yes" in rows["ojs-kombu dlq replay"]  # accepted: replay never asks
    assert "--all" in rows["ojs-kombu dlq replay"]
    assert "--recovery" in rows["ojs-kombu conformance"]


def test_every_setting_is_in_the_table_with_its_meaning() -> None:
    rows = {name: (default, meaning) for name, default, meaning in ojs_docs.setting_rows()}
    assert set(rows) == {f"ojs_{name}" for name in OJSSettings.model_fields}
    assert rows["ojs_prefix"][0] == "``''``"
    assert rows["ojs_confirm_timeout"][0] == "``30.0``"
    assert all(meaning for _, meaning in rows.values()), [
        name for name, (_, meaning) in rows.items() if not meaning]
