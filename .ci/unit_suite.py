"""Run the unit suite with this interpreter: the seam test first, then the rest.

A release of kombu, py-amqp, Celery or OpenTelemetry that changes an internal
ojs_kombu relies on fails ``tests/test_seams.py`` first, by name, before the
tests that would fail because of it.  Used by ``.ci/matrix`` and ``tox``;
arguments go to both pytest runs.  Exits non-zero if either run fails.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEAMS = "tests/test_seams.py"


def pytest(*args: str) -> int:
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
    print("+", " ".join(command[1:]), flush=True)
    return subprocess.run(command, cwd=ROOT, check=False).returncode


def main(args: list[str]) -> int:
    seams = 0
    if (ROOT / SEAMS).is_file():
        seams = pytest(SEAMS, *args)
        if seams != 0:
            print(f"SEAM TEST FAILED ({SEAMS}): a dependency changed an internal "
                  "ojs_kombu relies on", flush=True)
    rest = pytest("tests", f"--ignore={SEAMS}", *args)
    return seams or rest


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
