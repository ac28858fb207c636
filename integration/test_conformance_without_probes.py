"""``ojs-kombu conformance`` against a worker whose app has no conformance probes: the
worker checks are n/a and say what to add, and the app's dead-letter queue is left as
it was (a real worker subprocess in a vhost of its own).

The command runs as its own process, as users run it: with ``-A`` it imports the app's
module, whose tasks Celery shares with every app finalized later in the importing
process (``shared=True``), so run inside the test process it would hand its
``email.send`` to the apps of the modules that come after it on the same xdist worker."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import HOST, PORT, private_vhost, rabbitmqctl
from .test_cli import run
from .workers import launch_worker

APP = textwrap.dedent("""
    import os

    from celery import Celery

    import ojs_kombu

    app = Celery("noprobes", broker=os.environ["OJS_BROKER_URL"])
    ojs_kombu.install(app)


    @app.task(name="email.send")
    def send(to):
        return to
""")


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with private_vhost("ojs-kombu-noprobes") as vhost:
        yield f"ojs://guest:guest@{HOST}:{PORT}/{vhost}"


@pytest.fixture(scope="module")
def worker(url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("noprobes")
    (home / "noprobes.py").write_text(APP)
    # OJS_BROKER_URL: the app reads it, as a user's does
    with launch_worker(url, "noprobes", "email", cwd=home, env={"OJS_BROKER_URL": url},
                       loglevel="WARNING", control=True):
        yield home


def dead_letters(url: str) -> int:
    return int(dict(line.split("\t") for line in rabbitmqctl(
        "list_queues", "-p", url.rsplit("/", 1)[1], "name", "messages").splitlines()
        if "\t" in line)["ojs.queue.dlx.email"])


def conformance(url: str, home: Path, *args: str) -> dict[str, dict[str, str]]:
    """``ojs-kombu --broker URL ARGS conformance -q email --json`` run from ``home``
    (where the app's module is), with ``OJS_BROKER_URL`` set as the app reads it."""
    result = run(url, "--broker", url, *args, "conformance", "-q", "email",
                 "--job-timeout", "20", "--json", cwd=home, timeout=300)
    try:
        data = json.loads(result.stdout)
    except ValueError:
        raise AssertionError(f"not JSON (rc {result.returncode}): {result.stdout!r} "
                             f"{result.stderr[-2000:]!r}") from None
    return {check["id"]: check for check in data["checks"]}


@pytest.mark.parametrize("with_app", [False, True], ids=["on the wire", "with -A"])
def test_the_worker_checks_say_what_to_add_and_leave_no_dead_letter(
        url: str, worker: Path, with_app: bool) -> None:
    before = dead_letters(url)
    checks = conformance(url, worker, *(["-A", "noprobes"] if with_app else []))
    for check_id in ("AMQP-009", "AMQP-019", "AMQP-020"):
        assert checks[check_id]["status"] == "n/a", checks[check_id]
        assert "ojs_kombu.register_conformance_probes(app)" in checks[check_id]["reason"]
    assert dead_letters(url) == before == 0
