"""kombu's own py-amqp integration suite passes on ``ojs://``.

kombu's ``t/integration/test_py_amqp.py`` (queues, exchanges, purge, priorities,
TTLs, failover, the event loop) is fetched from the sdist of the installed kombu
at test time, never copied here, and run as released in a pytest subprocess
whose ``pyamqp://`` scheme is the ``ojs`` transport
(:mod:`integration.kombu_suite_plugin`), in a vhost of its own.  A plain queue
is a plain queue through ``ojs://``: every test must pass.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from .conftest import HOST, PORT, private_vhost

PROJECT = Path(__file__).resolve().parents[1]
#: Minutes of this module on one xdist worker: it goes out before the other modules
#: (integration/conftest.py), not last and alone at the end of the run.
XDIST_LONG = True
SUITE = "t/integration/test_py_amqp.py"


@pytest.fixture(scope="module")
def kombu_tests(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """kombu's source tree (``t/``) of the installed version, from its sdist."""
    version = importlib.metadata.version("kombu")
    download = tmp_path_factory.mktemp("kombu-sdist")
    fetched = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary",
         ":all:", "--dest", str(download), f"kombu=={version}"],
        capture_output=True, text=True, timeout=300, check=False)
    sdists = list(download.glob("kombu-*.tar.gz"))
    if fetched.returncode != 0 or not sdists:
        pytest.skip(f"cannot download the kombu {version} sdist: "
                    f"{fetched.stderr.strip()[-300:] or 'no archive'}")
    with tarfile.open(sdists[0]) as archive:
        members = [m for m in archive.getmembers()
                   if m.name.startswith(f"kombu-{version}/t/")]
        archive.extractall(download, members=members, filter="data")
    root = download / f"kombu-{version}"
    assert (root / SUITE).is_file(), f"no {SUITE} in the kombu {version} sdist"
    return root


def test_kombus_py_amqp_suite_passes_on_ojs(kombu_tests: Path, tmp_path: Path) -> None:
    junit = tmp_path / "kombu.xml"
    with private_vhost("kombu-suite") as vhost:
        env = dict(os.environ, RABBITMQ_HOST=f"guest:guest@{HOST}",
                   RABBITMQ_5672_TCP=f"{PORT}/{vhost}",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(PROJECT),
                                                            os.environ.get("PYTHONPATH")])))
        run = subprocess.run(
            [sys.executable, "-m", "pytest", SUITE, "-p", "integration.kombu_suite_plugin",
             "-p", "no:cacheprovider", "-o", "python_classes=test_*", "-rfE",
             f"--junitxml={junit}"],
            cwd=kombu_tests, env=env, capture_output=True, text=True, timeout=900,
            check=False)
    output = run.stdout + run.stderr
    assert "kombu transport for pyamqp://: <class 'ojs_kombu" in output, output[-2000:]
    suite = ElementTree.parse(junit).getroot().find("testsuite")
    assert suite is not None, output[-2000:]
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors",
                                                       "skipped")}
    assert counts["tests"] > 0 and run.returncode == 0, output[-4000:]
    assert (counts["failures"], counts["errors"], counts["skipped"]) == (0, 0, 0), \
        output[-4000:]
