"""A migrated app's own test suite, run as its team runs it, on ``amqp://`` and ``ojs://``.

``examples/shopapp`` is a small Celery app whose tests use only
``celery.contrib.pytest``'s fixtures (``celery_app``/``celery_worker`` per test,
``celery_session_app``/``celery_session_worker`` for the session) against a real
broker; its ``pytest.ini`` holds the one line ojs_kombu asks for
(``-p ojs_kombu.testing``).  The suite runs unchanged on both brokers in a
subprocess; both runs must pass every test (plain Celery's run only where plain
Celery can run on the broker under test: ``conftest.plain_celery_refused``).
Each run's teardown times are printed (``-s`` shows them) for comparison; no time
is asserted.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from .conftest import HOST, PORT, plain_celery_refused, private_vhost
from .workers import ROOT

SHOPAPP = ROOT / "examples" / "shopapp"
#: ``--durations=0`` lines: ``0.51s teardown tests/test_orders.py::test_price_order``.
DURATION = re.compile(r"^(\d+\.\d+)s (setup|call|teardown)\s+(\S+)$", re.MULTILINE)
SUMMARY = re.compile(r"=+ (.*?) in [\d.]+s")


@pytest.fixture(scope="module")
def shop_vhost() -> Iterator[str]:
    with private_vhost("ojs-kombu-shopapp") as name:
        yield name


def run_shop_suite(scheme: str, vhost: str) -> tuple[dict[str, int], list[float], str]:
    """Run the shop's suite on ``scheme://``: its outcome counts, its teardown times,
    and its output."""
    env = {**os.environ, "SHOPAPP_BROKER_URL": f"{scheme}://guest:guest@{HOST}:{PORT}/{vhost}"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "--durations=0", "-vv",
                          "-p", "no:cacheprovider"], cwd=SHOPAPP, env=env,
                         capture_output=True, text=True, timeout=900, check=False)
    output = run.stdout + run.stderr
    summary = SUMMARY.findall(output)
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", summary[-1])} \
        if summary else {}
    teardowns = [float(seconds) for seconds, phase, _ in DURATION.findall(output)
                 if phase == "teardown"]
    return counts, teardowns, output


def test_the_shop_suite_passes_unchanged_on_amqp_and_on_ojs(shop_vhost: str) -> None:
    refused = plain_celery_refused()
    if refused:
        print(f"amqp:// not run: {refused}")
    schemes = ("ojs",) if refused else ("amqp", "ojs")
    results = {scheme: run_shop_suite(scheme, shop_vhost) for scheme in schemes}
    for scheme, (counts, teardowns, output) in results.items():
        print(f"{scheme}://  {counts}  teardowns: {len(teardowns)}, "
              f"{sum(teardowns):.2f} s in all, longest {max(teardowns, default=0):.2f} s")
        assert set(counts) == {"passed"}, f"{scheme}://\n{output[-4000:]}"
    assert results["ojs"][0]["passed"] == 6
    if not refused:
        assert results["amqp"][0] == results["ojs"][0]
