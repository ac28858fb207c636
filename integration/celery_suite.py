"""Run Celery's own integration tests on ``pyamqp://`` and on ``ojs://``, side by side.

    python integration/celery_suite.py [--only pyamqp|ojs] [--files NAME,...] [--report]
                                       [-- PYTEST ARGS]

Fetches the source distribution of the installed Celery with pip (``pip download
--no-binary :all: --no-deps celery==<version>``) into a cache directory, never into
this repository, and runs its ``t/integration/test_tasks.py``, ``test_canvas.py``,
``test_inspect.py``, ``test_group_chains.py`` and ``test_redis_backend.py``
unedited, twice: on ``pyamqp://`` and on ``ojs://`` with
``ojs_kombu.install(app)`` applied to Celery's test apps by
:mod:`integration.celery_suite_plugin`.  Each run gets a RabbitMQ vhost of its
own (``rabbitmqctl``); the result backend is Redis (``--backend``).  Each test
runs once per broker (reruns of Celery's ``flaky`` tests are off, so they cannot
hide a difference), with pytest-timeout's ``--timeout`` (300 s, as Celery's own).

Prints each run's pytest result line, then every test that passed on
``pyamqp://`` but not on ``ojs://``.  Exit status 0 when each of those is one of
:data:`KNOWN_DIFFERENCES` (by-design differences, listed in docs/development.rst), 1
otherwise.  Not part of the default test run: it takes several minutes.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
FILE_NAMES = ("test_tasks", "test_canvas", "test_inspect", "test_group_chains",
              "test_redis_backend")
TEST_FILES = tuple(f"t/integration/{name}.py" for name in FILE_NAMES)
PLUGIN = "integration.celery_suite_plugin"

_REJECT = ("Reject(requeue=True) is a failed attempt that the broker retries while "
           "max_attempts allows (1 here, so the job is dead-lettered), never an "
           "immediate requeue that comes back with redelivered=True")
_APP_ID = "job messages carry the binding's properties (app_id 'ojs'): app_id=... does not travel"
_ACKS_LATE = ("a job is acked after it ran (task_acks_late, AMQP-008/009), so a running job "
              "shows acknowledged=False; it came through ojs.exchange.direct with its OJS "
              "queue as routing key ('default', Celery's 'celery')")
_QUEUES = ("job queues are ojs.queue.{q} on ojs.exchange.direct with a dead-letter exchange "
           "(AMQP-031, 004), Celery's 'celery' is 'default'")
_SCHEDULED = ("countdown and eta jobs wait in the broker until due, so a worker holds none "
              "and inspect().scheduled() is empty")
_CONFIRM = ("apply_async returns once the broker confirmed the job, so the worker can "
            "receive it first; the test clears its flag after delay() returns")

#: Tests that pass on ``pyamqp://`` and cannot pass on ``ojs://``, with the OJS reason.
KNOWN_DIFFERENCES: dict[str, str] = {
    "t.integration.test_tasks.test_tasks::test_reject_with_requeue_redelivers_and_succeeds":
        _REJECT,
    "t.integration.test_tasks.test_tasks::test_properties": _APP_ID,
    "t.integration.test_tasks.test_task_replacement::test_replaced_task_nesting_level_0":
        _CONFIRM,
    "t.integration.test_inspect.test_Inspect::test_active": _ACKS_LATE,
    "t.integration.test_inspect.test_Inspect::test_query_task": _ACKS_LATE,
    "t.integration.test_inspect.test_Inspect::test_active_queues": _QUEUES,
    "t.integration.test_inspect.test_Inspect::test_scheduled": _SCHEDULED,
}


def _files(value: str) -> tuple[str, ...]:
    """``--files``: names of the five files (with or without ``.py``), in the given order."""
    names = [name.strip().removesuffix(".py") for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in FILE_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"the files are {', '.join(FILE_NAMES)}; got "
                                         f"{', '.join(unknown) or 'none'}")
    return tuple(f"t/integration/{name}.py" for name in names)


def celery_version() -> str:
    return importlib.metadata.version("celery")


def fetch_tests(version: str, cache: Path) -> Path:
    """Celery's source tree (``t/`` and ``pyproject.toml``) of ``version``, from its sdist."""
    root = cache / f"celery-{version}"
    if all((root / name).is_file() for name in TEST_FILES):
        return root
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as download:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-binary",
                        ":all:", "--no-deps", "--dest", download, f"celery=={version}"],
                       check=True)
        sdist = next(Path(download).glob("celery-*.tar.gz"))
        staging = Path(download) / "tree"
        with tarfile.open(sdist) as archive:
            members = [m for m in archive.getmembers()
                       if m.name.startswith((f"celery-{version}/t/",
                                             f"celery-{version}/pyproject.toml"))]
            archive.extractall(staging, members=members, filter="data")
        shutil.rmtree(root, ignore_errors=True)
        shutil.move(staging / f"celery-{version}", root)
    return root


def rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=120)


@contextmanager
def private_vhost(label: str) -> Iterator[str]:
    """A vhost for one run, deleted afterwards: the runs never see each other's queues."""
    name = f"celery-suite-{label}-{uuid.uuid4().hex[:8]}"
    rabbitmqctl("add_vhost", name)
    try:
        rabbitmqctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
        yield name
    finally:
        rabbitmqctl("delete_vhost", name)


def run_suite(root: Path, scheme: str, host: str, backend: str, timeout: float,
              results: Path, pytest_args: Sequence[str],
              files: Sequence[str] = TEST_FILES) -> str:
    """Run the tests with ``TEST_BROKER=<scheme>://...``; return pytest's result line."""
    with private_vhost(scheme) as vhost:
        env = dict(os.environ, TEST_BROKER=f"{scheme}://guest:guest@{host}/{vhost}",
                   TEST_BACKEND=backend,
                   PYTHONPATH=os.pathsep.join(filter(None, [str(PROJECT),
                                                            os.environ.get("PYTHONPATH")])))
        command = [sys.executable, "-m", "pytest", *files, "-p", "no:cacheprovider",
                   "-p", "no:rerunfailures", f"--timeout={timeout:g}", f"--junitxml={results}",
                   "-q", "-rfE",
                   *(["-p", PLUGIN] if scheme == "ojs" else []), *pytest_args]
        log = results.with_suffix(".log")
        print(f"== {scheme}:// ({' '.join(command[1:])}), output in {log}", flush=True)
        with log.open("w") as out:
            subprocess.run(command, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                           check=False)
    return result_line(log)


def result_line(log: Path) -> str:
    """pytest's closing line (``N failed, N passed, ... in Ns``) of a run's output."""
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    return lines[-1].strip("= ") if lines else f"no output in {log}"


def outcomes(junit: Path) -> dict[str, str]:
    """``{test id: passed|failed|error|skipped}`` from a JUnit XML report."""
    found: dict[str, str] = {}
    for case in ET.parse(junit).iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        tags = {child.tag for child in case}
        outcome = ("error" if "error" in tags else "failed" if "failure" in tags
                   else "skipped" if "skipped" in tags else "passed")
        # A teardown error is reported as a second entry of the same test.
        if found.get(test_id, "passed") == "passed":
            found[test_id] = outcome
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("pyamqp", "ojs"), help="Run one broker only.")
    parser.add_argument("--host", default="127.0.0.1:5672", help="RabbitMQ host:port.")
    parser.add_argument("--backend", default="redis://127.0.0.1:6379/0",
                        help="Result backend URL (TEST_BACKEND).")
    parser.add_argument("--timeout", type=float, default=300,
                        help="Seconds per test (pytest-timeout; 300 as in Celery's own markers).")
    parser.add_argument("--cache", type=Path,
                        default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                        / "ojs_kombu" / "celery-suite",
                        help="Where Celery's sdist is unpacked and the reports are written.")
    parser.add_argument("--files", type=_files, default=TEST_FILES,
                        help="Comma-separated subset of the five files "
                             f"({', '.join(FILE_NAMES)}); all five by default.")
    parser.add_argument("--report", action="store_true",
                        help="Run nothing: compare the reports of the last run.")
    parser.add_argument("pytest_args", nargs="*", help="Passed to pytest (after --).")
    args = parser.parse_args(argv)

    if importlib.util.find_spec("pytest_timeout") is None:
        parser.error("needs pytest-timeout (a hung test must not stop the run): "
                     f"{sys.executable} -m pip install pytest-timeout")
    version = celery_version()
    root = args.cache if args.report else fetch_tests(version, args.cache)
    schemes = [args.only] if args.only else ["pyamqp", "ojs"]
    lines: dict[str, str] = {}
    for scheme in schemes:
        report = args.cache / f"results-{version}-{scheme}.xml"
        if args.report:
            lines[scheme] = result_line(report.with_suffix(".log"))
            continue
        lines[scheme] = run_suite(root, scheme, args.host, args.backend, args.timeout,
                                  report, args.pytest_args, args.files)
        print(f"{scheme}://: {lines[scheme]}", flush=True)
    print(f"\nCelery {version} {' + '.join(args.files)}")
    for scheme, line in lines.items():
        print(f"  {scheme + '://':10} {line}")
    if len(schemes) < 2:
        return 0

    plain = outcomes(args.cache / f"results-{version}-pyamqp.xml")
    ojs = outcomes(args.cache / f"results-{version}-ojs.xml")
    differ = sorted(t for t, o in plain.items() if o == "passed" and ojs.get(t) != "passed")
    unexpected = [t for t in differ if t not in KNOWN_DIFFERENCES]
    if differ:
        print(f"\npassed on pyamqp://, not on ojs:// ({len(differ)}), by reason:")
        by_reason: dict[str, list[str]] = {}
        for test in differ:
            reason = KNOWN_DIFFERENCES.get(test, "UNEXPECTED: not a known OJS difference")
            by_reason.setdefault(reason, []).append(test)
        for reason, tests in by_reason.items():
            print(f"  {reason}:")
            for test in tests:
                print(f"    {test} ({ojs.get(test, 'not run')})")
    only_ojs = sorted(t for t, o in ojs.items() if o == "passed" and plain.get(t) != "passed")
    if only_ojs:
        print(f"\npassed on ojs://, not on pyamqp:// ({len(only_ojs)}):")
        for test in only_ojs:
            print(f"  {test}: {plain.get(test, 'not run')}")
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
