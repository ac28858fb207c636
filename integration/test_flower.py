"""Flower against an OJS app, in a real browser (headless Chromium).

A real ``celery -A integration.flowerapp worker`` and two real ``celery ... flower``
processes run on the test vhost:

* ``celery -A proj flower`` (the app's own ``ojs://`` URL): its dashboard, tasks,
  task detail and worker pages;
* the docs' command for the Broker tab, ``celery -A proj --broker amqp://...
  flower --broker_api=http://.../api/``: Flower's Broker tab recognises only
  ``amqp``/``amqps`` URLs, and reads queue depths from RabbitMQ's management API.

Skipped, with the reason, where Flower is missing, the browser tests where
Selenium, Chromium or chromedriver is, and the Broker tab test where RabbitMQ's
management API does not answer.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import amqp
import pytest
from celery import Celery

from . import management
from .apps import make_app
from .conftest import HOST, PORT, get_message, plain_celery_refused, wait_until
from .workers import launch_worker

ROOT = Path(__file__).resolve().parents[1]
QUEUE = "flower"
CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser",
                                                 "google-chrome"))), None)
CHROMEDRIVER = shutil.which("chromedriver")


def _flower_missing() -> str | None:
    if importlib.util.find_spec("flower") is None:
        return "Flower is not installed (pip install flower, or the 'test' extra)"
    return None


def _browser_missing() -> str | None:
    if importlib.util.find_spec("selenium") is None:
        return "Selenium is not installed (pip install selenium, or the 'test' extra)"
    if CHROMIUM is None:
        return "no Chromium browser on PATH (Debian: apt-get install chromium chromium-driver)"
    if CHROMEDRIVER is None:
        return "no chromedriver on PATH (Debian: apt-get install chromium-driver)"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


class Processes:
    """Subprocesses started by this module, each in a session of its own."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, broker_url: str, *argv: str) -> subprocess.Popen[bytes]:
        # Flower listens on 127.0.0.1 only: its HTTP API without authentication.
        env = {**os.environ, "OJS_TEST_BROKER_URL": broker_url, "FLOWER_UNAUTHENTICATED_API": "1"}
        with self.log.open("ab") as out:
            process = subprocess.Popen([sys.executable, "-m", "celery", *argv], cwd=ROOT,
                                       env=env, stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        self.started.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.started:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)


def _start_flower(processes: Processes, broker_url: str, *celery_options: str,
                  flower_options: tuple[str, ...] = ()) -> str:
    port = _free_port()
    process = processes.start(broker_url, "-A", "integration.flowerapp", *celery_options,
                              "flower", f"--port={port}", "--address=127.0.0.1",
                              "--inspect_timeout=5000", *flower_options)
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"flower exited: {processes.log.read_text()}")
        try:
            return _get(base + "/healthcheck") == "OK"
        except OSError:
            return False

    wait_until(healthy, timeout=60, what="Flower answering on " + base)
    return base


@pytest.fixture(scope="module")
def flower_setup(broker_url: str, vhost: str,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The worker, Flower on the app's own URL, Flower with the Broker tab's flags,
    and the jobs sent (three that succeed, one that fails)."""
    if (missing := _flower_missing()) is not None:
        pytest.skip(missing)
    log = tmp_path_factory.mktemp("flower") / "processes.log"
    processes = Processes(log)
    worker_name = f"flower-{uuid.uuid4().hex[:8]}@{socket.gethostname()}"
    client: Celery = make_app("flower-client", broker_url, "rpc://")
    worker = launch_worker(broker_url, "integration.flowerapp", QUEUE, hostname=worker_name,
                           pool="prefork", concurrency=1, log=log, options=("-E",))
    try:
        wait_until(lambda: client.control.inspect(timeout=1, destination=[worker_name]).ping(),
                   timeout=60, what="the worker")
        ojs_flower = _start_flower(processes, broker_url)
        amqp_url = f"amqp://guest:guest@{HOST}:{PORT}/{quote(vhost, safe='')}"
        # The Broker tab's Flower is plain Celery on amqp://: where plain Celery cannot
        # receive events on this broker, its tests skip with the reason.
        broker_tab_flower = None if plain_celery_refused() else _start_flower(
            processes, broker_url, "--broker", amqp_url,
            flower_options=(f"--broker_api={management.MANAGEMENT_API}",))
        # Flower learns of jobs from the worker's events: send them once both Flowers
        # have had one (a worker heartbeat, every 2 s).
        for base in filter(None, (ojs_flower, broker_tab_flower)):
            wait_until(lambda base=base: json.loads(_get(base + "/api/workers?status=1"))
                       .get(worker_name), timeout=60, what=f"{base} seeing the worker's events")
        succeeded = [client.send_task("flower.add", (n, n), queue=QUEUE) for n in range(1, 4)]
        failed = client.send_task("flower.fail", ("no such account",), queue=QUEUE)
        assert [r.get(timeout=60) for r in succeeded] == [2, 4, 6], log.read_text()
        yield {"worker": worker_name, "flower": ojs_flower, "broker_tab_flower": broker_tab_flower,
               "succeeded": [r.id for r in succeeded], "failed": failed.id, "log": log}
    finally:
        processes.stop_all()
        worker.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if (missing := _browser_missing()) is not None:
        pytest.skip(missing)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _page_text(driver: Any) -> str:
    """All text of the page, hidden tabs included."""
    return str(driver.execute_script("return document.body.textContent"))


def _wait_for_page(driver: Any, url: str, condition: Callable[[str], bool], what: str,
                   timeout: float = 60.0) -> str:
    """Load ``url`` until its text satisfies ``condition`` (Flower fills tables by XHR)."""
    deadline = time.monotonic() + timeout
    text = ""
    driver.get(url)
    while time.monotonic() < deadline:
        for _ in range(10):  # let the page's own requests land before reloading
            text = _page_text(driver)
            if condition(text):
                return text
            time.sleep(0.3)
        driver.get(url)
    raise AssertionError(f"{url}: timed out waiting for {what}; the page said:\n{text[:3000]}")


def test_dashboard_lists_the_ojs_worker_online(flower_setup: dict[str, Any],
                                               browser: Any) -> None:
    worker = flower_setup["worker"]
    script = ("return [...document.querySelectorAll('#workers-table tbody tr')]"
              ".filter(tr => tr.textContent.includes(arguments[0]))"
              ".map(tr => [...tr.cells].map(td => td.textContent.trim()))")

    def row() -> list[str]:
        rows = browser.execute_script(script, worker)
        return list(rows[0]) if rows else []

    def counted() -> bool:
        # Worker, Status, Active, Processed, Failed, Succeeded, Load Average; the
        # fixture's jobs: three succeed, one fails (later tests may add some).
        cells = row()
        return (len(cells) >= 6 and cells[:2] == [worker, "Online"]
                and int(cells[3]) >= 4 and int(cells[4]) >= 1 and int(cells[5]) >= 3)

    _wait_for_page(browser, flower_setup["flower"] + "/", lambda _: counted(),
                   f"{worker} online with the fixture's jobs counted")


def test_tasks_page_lists_every_job_id(flower_setup: dict[str, Any], browser: Any) -> None:
    ids = [*flower_setup["succeeded"], flower_setup["failed"]]
    text = _wait_for_page(browser, flower_setup["flower"] + "/tasks",
                          lambda text: all(job_id in text for job_id in ids), "the job ids")
    assert "flower.add" in text and "flower.fail" in text


def test_task_detail_pages_show_state_and_result(flower_setup: dict[str, Any],
                                                 browser: Any) -> None:
    base = flower_setup["flower"]
    ok = flower_setup["succeeded"][2]
    text = _wait_for_page(browser, f"{base}/task/{ok}", lambda text: "SUCCESS" in text,
                          "the SUCCESS state")
    assert ok in text and "flower.add" in text
    result = browser.execute_script(
        "return [...document.querySelectorAll('dt')].find(dt => dt.textContent.trim() == "
        "'Result').nextElementSibling.textContent.trim()")
    assert result == "6"

    failed = flower_setup["failed"]
    text = _wait_for_page(browser, f"{base}/task/{failed}", lambda text: "FAILURE" in text,
                          "the FAILURE state")
    assert "ValueError" in text and "no such account" in text


def test_worker_page_shows_stats(flower_setup: dict[str, Any], browser: Any) -> None:
    worker = flower_setup["worker"]
    text = _wait_for_page(browser, f"{flower_setup['flower']}/worker/{worker}",
                          lambda text: "Worker pool options" in text
                          or "Unable to get stats" in text, "the worker's stats")
    assert "Unable to get stats" not in text, text[:2000]
    # The Pool tab: the worker's own stats (Flower capitalises the value).
    assert "concurrency.prefork:TaskPool" in text and "Max concurrency" in text
    assert f"ojs.queue.{QUEUE}" in text  # the Queues tab: the AMQP name of the OJS queue
    broker = browser.execute_script(
        "return document.getElementById('tab-broker').textContent")
    assert "ojs" in broker.split()  # the Broker tab: the worker's transport


def _skip_without_broker_tab(flower_setup: dict[str, Any]) -> None:
    if flower_setup["broker_tab_flower"] is None:
        pytest.skip(str(plain_celery_refused()))


def test_broker_tab_shows_the_ojs_queues(flower_setup: dict[str, Any], browser: Any) -> None:
    _skip_without_broker_tab(flower_setup)
    if not management.answers():
        pytest.skip(f"RabbitMQ's management API does not answer at {management.MANAGEMENT_API} "
                    "(rabbitmq-plugins enable rabbitmq_management)")
    from selenium.webdriver.common.by import By

    name = f"ojs.queue.{QUEUE}"
    _wait_for_page(browser, flower_setup["broker_tab_flower"] + "/broker",
                   lambda text: name in text or "not supported" in text, f"the row of {name}")
    assert "not supported" not in _page_text(browser)
    cells = [cell.text for cell in browser.find_element(By.ID, name).find_elements(
        By.TAG_NAME, "td")]
    # Queue, Messages, Unacked, Ready, Consumers, Idle since: the worker consumes it.
    assert cells[0] == name
    if _metrics_collection_denied():  # RabbitMQ 4 without management metrics: names only
        assert set(cells[1:]) == {"—"}, cells
    else:
        assert cells[4] == "1", cells
    # The other pages keep working in this mode.
    worker = flower_setup["worker"]
    _wait_for_page(browser, flower_setup["broker_tab_flower"] + "/",
                   lambda text: worker in text, f"{worker} on the dashboard")


def _metrics_collection_denied() -> bool:
    """Whether the broker under test denies ``management_metrics_collection`` (a RabbitMQ
    4 deprecated feature, denied in CI's 4.x node): its management API then reports no
    message or consumer counts, and Flower's Broker tab shows only the queues' names."""
    conf = os.environ.get("OJS_RABBITMQ_EXTRA_CONF", "")
    return bool(conf) and Path(conf).is_file() and \
        "management_metrics_collection = false" in Path(conf).read_text()


def test_the_docs_give_the_broker_tab_flags_this_test_uses() -> None:
    readme = (ROOT / "docs" / "getting-started.rst").read_text()
    assert "celery -A proj --broker amqp://" in readme
    assert "flower --broker_api=http://guest:guest@localhost:15672/api/" in readme


def _post_json(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return dict(json.loads(response.read()))


def test_flower_api_sends_ojs_jobs_from_the_apps_own_url(flower_setup: dict[str, Any]) -> None:
    base = flower_setup["flower"]
    sent = _post_json(f"{base}/api/task/async-apply/flower.add",
                      {"args": [20, 22], "queue": QUEUE})

    def info() -> dict[str, Any] | None:
        try:
            found = json.loads(_get(f"{base}/api/task/info/{sent['task-id']}"))
        except OSError:  # 404 until Flower has seen the job's first event
            return None
        return dict(found) if found.get("state") == "SUCCESS" else None

    assert wait_until(info, timeout=60, what="the job run")["result"] == "42"


def test_flower_api_jobs_are_dead_lettered_in_broker_tab_mode(
        flower_setup: dict[str, Any], amqp_channel: amqp.Channel) -> None:
    """With ``--broker amqp://`` (the docs' Broker tab command) Flower's own
    connection is plain py-amqp: what its API sends is a plain Celery message, which
    the OJS worker dead-letters instead of running (as the docs say)."""
    _skip_without_broker_tab(flower_setup)
    sent = _post_json(f"{flower_setup['broker_tab_flower']}/api/task/async-apply/flower.add",
                      {"args": [1, 1], "queue": QUEUE})
    seen: list[dict[str, Any]] = []

    def dead_letter() -> dict[str, Any] | None:
        # The DLQ also holds the failed job of the fixture: read until this one.
        message = get_message(amqp_channel, f"ojs.queue.dlx.{QUEUE}", timeout=30)
        headers = dict(message.properties.get("application_headers") or {})
        seen.append(headers)
        # A Celery message names its task id in a header and the correlation id.
        ids = {headers.get("id"), message.properties.get("correlation_id")}
        return headers if sent["task-id"] in ids else None

    headers = wait_until(dead_letter, timeout=40, what="the API's message in the DLQ")
    assert headers["x-ojs-error-code"] == "UNSUPPORTED_CONTENT_TYPE", seen
