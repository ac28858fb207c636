"""CLI output shown in the docs: each block is a file of ``docs/cli_output/``, which
docs/cli.rst includes, and a test runs the command it shows and compares.

``OJS_REGEN_DOCS=1`` makes those tests write the files instead (docs/development.rst:
"CLI output in the docs").
"""

from __future__ import annotations

import os
import re
from pathlib import Path

OUTPUT = Path(__file__).resolve().parents[1] / "docs" / "cli_output"


def normalise(text: str, replacements: dict[str, str] | None = None) -> str:
    """``text`` with what changes from run to run replaced (given strings, then UUIDs and
    times), and trailing spaces and blank lines dropped."""
    for old, new in (replacements or {}).items():
        text = text.replace(old, new)
    text = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
                  "01937f2e-0000-7000-8000-000000000000", text)
    text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?",
                  "2026-01-01T00:00:00Z", text)
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()) + "\n"


def check_block(name: str, output: str) -> None:
    """Compare ``output`` (normalised) with ``docs/cli_output/{name}``, or write it there
    under ``OJS_REGEN_DOCS=1``."""
    path = OUTPUT / name
    if os.environ.get("OJS_REGEN_DOCS") == "1":
        path.write_text(output)
        return
    shown = path.read_text() if path.exists() else ""
    assert output == shown, (
        f"docs/cli_output/{name} is not what the command prints now; regenerate it "
        f"(OJS_REGEN_DOCS=1, docs/development.rst) and read the diff:\n{output}")
