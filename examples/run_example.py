#!/usr/bin/env python3
"""Run the ojs_kombu example end to end against RabbitMQ.

Starts a real Celery worker for ``examples/proj``, sends four kinds of OJS jobs
(``apply_async``, a raw AMQP publish the way a non-Python OJS producer would
send it, a job that fails, and a chain), prints what happened to each job,
stops the worker and purges the example's queues::

    python examples/run_example.py

Exit status: 0 if every job ended as expected, 1 if not, 2 if RabbitMQ is not
reachable.  ``OJS_BROKER_URL`` and ``OJS_EXAMPLE_PREFIX`` are honoured (see
``proj/celery.py``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import amqp
from celery import chain
from celery.result import AsyncResult
from kombu.utils.url import parse_url

import ojs_kombu

EXAMPLES_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(EXAMPLES_DIR))

from proj import tasks  # noqa: E402
from proj.celery import app  # noqa: E402

#: Celery queues the worker consumes (``default`` is Celery's ``celery`` queue).
WORKER_QUEUES = ("email", "default")
READY_TIMEOUT = 30.0
JOB_TIMEOUT = 20.0
CONNECT_TIMEOUT = 3.0
START_HINT = "start it with `rabbitmq-server -detached` or `docker run -p 5672:5672 rabbitmq`"

T = TypeVar("T")


class ExampleError(Exception):
    """The example could not run (as opposed to a job ending unexpectedly)."""


@dataclass
class JobReport:
    """What happened to one job."""

    job_id: str
    job_type: str
    sent_via: str
    outcome: str
    as_expected: bool

    def line(self) -> str:
        mark = "" if self.as_expected else "UNEXPECTED: "
        return f"{self.job_id}  {self.job_type:<14} {self.sent_via:<12} {mark}{self.outcome}"


# -- broker -------------------------------------------------------------------


def broker_address() -> tuple[str, dict[str, Any]]:
    """``host:port`` and the py-amqp connection arguments of the app's broker URL."""
    url = parse_url(app.conf.broker_url)
    address = f"{url['hostname'] or 'localhost'}:{url['port'] or 5672}"
    return address, {
        "host": address,
        "userid": url["userid"] or "guest",
        "password": url["password"] or "guest",
        "virtual_host": url["virtual_host"] or "/",
        "ssl": url["transport"] == "ojss",
        "connect_timeout": CONNECT_TIMEOUT,
    }


def connect() -> amqp.Connection:
    """An open py-amqp connection to the broker, or :class:`ExampleError` in one line."""
    address, arguments = broker_address()
    connection = amqp.Connection(**arguments)
    try:
        connection.connect()
    except amqp.exceptions.AccessRefused as exc:
        raise ExampleError(
            f"RabbitMQ at {address} refused the login of {arguments['userid']!r} "
            f"({exc.reply_text}); fix the credentials in OJS_BROKER_URL"
        ) from None
    except Exception as exc:
        reason = str(exc) or type(exc).__name__
        raise ExampleError(
            f"RabbitMQ is not reachable at {address} ({reason}); {START_HINT}"
        ) from None
    return connection


def publish_raw_job(connection: amqp.Connection, names: ojs_kombu.TopologyNames,
                    args: list[Any]) -> str:
    """Enqueue an ``email.send`` job as any OJS producer would: JSON envelope, plain AMQP."""
    job_id = ojs_kombu.new_job_id()
    now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    envelope = {
        "specversion": "1.0", "id": job_id, "type": "email.send", "queue": "email",
        "args": args, "created_at": now, "enqueued_at": now,
    }
    message = amqp.Message(
        json.dumps(envelope).encode(),
        content_type="application/openjobspec+json",
        content_encoding="utf-8",
        message_id=job_id,
        type="email.send",
        delivery_mode=2,
        app_id="ojs",
        timestamp=int(time.time()),
        application_headers={"x-ojs-queue": "email", "x-ojs-attempt": 1},
    )
    channel = connection.channel()
    try:
        # Publisher confirms + mandatory: an unroutable job raises instead of vanishing.
        channel.basic_publish_confirm(message, exchange=names.direct_exchange,
                                      routing_key="email", mandatory=True,
                                      confirm_timeout=10)
    finally:
        channel.close()
    return job_id


def take_from_queue(connection: amqp.Connection, queue: str, job_id: str,
                    timeout: float) -> amqp.Message | None:
    """Wait for the message of ``job_id`` in ``queue``; ack it (other messages stay)."""
    channel = connection.channel()
    try:
        def find() -> amqp.Message | None:
            others: list[int] = []
            found = None
            while (message := channel.basic_get(queue, no_ack=False)) is not None:
                if message.properties.get("message_id") == job_id:
                    channel.basic_ack(message.delivery_tag)
                    found = message
                    break
                others.append(message.delivery_tag)
            for tag in others:
                channel.basic_reject(tag, requeue=True)
            return found

        return poll(find, timeout)
    finally:
        channel.close()


def purge_queues(connection: amqp.Connection, names: ojs_kombu.TopologyNames) -> None:
    """Empty the example's job and dead-letter queues so reruns start clean."""
    for queue in WORKER_QUEUES:
        for name in (names.job_queue(queue), names.dead_letter_queue(queue)):
            channel = connection.channel()
            try:
                channel.queue_purge(name)
            except amqp.exceptions.NotFound:
                pass
            finally:
                if channel.is_open:
                    channel.close()


# -- worker -------------------------------------------------------------------


def start_worker(hostname: str, log_path: Path, outbox: Path) -> subprocess.Popen[bytes]:
    """A real ``celery worker`` subprocess for ``proj``, logging to ``log_path``."""
    command = [
        sys.executable, "-m", "celery", "-A", "proj", "worker",
        "-Q", ",".join(WORKER_QUEUES), "--pool", "threads", "-c", "4",
        "--loglevel", "WARNING", "--hostname", hostname,
        # Do not sync state with, or ping, other workers that share the broker.
        "--without-mingle", "--without-gossip",
    ]
    env = {**os.environ, tasks.OUTBOX_ENV: str(outbox)}
    with log_path.open("wb") as log:
        return subprocess.Popen(command, cwd=EXAMPLES_DIR, env=env, stdout=log,
                                stderr=subprocess.STDOUT)


def wait_until_ready(worker: subprocess.Popen[bytes], hostname: str) -> float:
    """Seconds until the worker answers a ping; :class:`ExampleError` if it never does."""
    started = time.monotonic()
    while time.monotonic() - started < READY_TIMEOUT:
        if worker.poll() is not None:
            raise ExampleError(f"the worker exited with status {worker.returncode}")
        if app.control.inspect(destination=[hostname], timeout=0.5).ping():
            return time.monotonic() - started
    raise ExampleError(f"the worker did not answer a ping within {READY_TIMEOUT:.0f}s")


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    """Warm shutdown (SIGTERM); kill the worker if it has not exited after 10 s."""
    if worker.poll() is not None:
        return
    worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(timeout=10)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


# -- jobs ---------------------------------------------------------------------


def poll(check: Callable[[], T | None], timeout: float, interval: float = 0.1) -> T | None:
    """Call ``check`` until it returns something other than ``None`` or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value is not None or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def read_outbox(outbox: Path, job_id: str) -> dict[str, Any] | None:
    """The line the email task wrote to ``outbox`` for ``job_id``, if any."""
    for line in outbox.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record.get("id") == job_id:
            return record
    return None


def is_ojs_job(body: bytes | str, job_id: str) -> bool:
    """Whether ``body`` is the OJS envelope of ``job_id`` (any OJS consumer can read it)."""
    try:
        return ojs_kombu.JobEnvelope.from_json(body).id == job_id
    except ValueError:  # pydantic's ValidationError
        return False


def run_jobs(connection: amqp.Connection, names: ojs_kombu.TopologyNames,
             outbox: Path) -> list[JobReport]:
    """Send the four kinds of job, then report on each."""
    email = tasks.send_email.apply_async(("alice@example.com", "Welcome!"))
    raw_id = publish_raw_job(connection, names, ["bob@example.com", "Sent without Celery"])
    failing = tasks.charge.delay("cus_42", 1999)
    report = chain(tasks.fetch_report.s("q3"), tasks.render_report.s()).apply_async()
    fetch = report.parent
    dlq = names.dead_letter_queue("default")
    deadline = time.monotonic() + JOB_TIMEOUT

    def remaining() -> float:
        return max(0.5, deadline - time.monotonic())

    def completed(result: AsyncResult, job_type: str, via: str, expected: Any) -> JobReport:
        try:
            value = result.get(timeout=remaining())
        except Exception as exc:
            return JobReport(result.id, job_type, via, f"failed: {exc!r}", False)
        ok = value == expected
        outcome = f"completed (result {value!r})" + ("" if ok else f", expected {expected!r}")
        return JobReport(result.id, job_type, via, outcome, ok)

    reports = [completed(email, "email.send", "apply_async", "sent to alice@example.com")]

    record = poll(lambda: read_outbox(outbox, raw_id), remaining())
    reports.append(JobReport(
        raw_id, "email.send", "raw AMQP",
        f"completed (outbox: sent to {record['to']})" if record
        else f"not completed: no outbox line after {JOB_TIMEOUT:.0f}s",
        record is not None,
    ))

    try:
        error = failing.get(timeout=remaining(), propagate=False)
    except Exception as exc:  # no result (timeout): still look for the job in the DLQ
        error = exc
    dead = take_from_queue(connection, dlq, failing.id, remaining())
    if dead is None:
        outcome = f"not dead-lettered: not in {dlq} after {JOB_TIMEOUT:.0f}s ({error!r})"
    elif not is_ojs_job(dead.body, failing.id):
        outcome = f"found in {dlq}, but not as its OJS job envelope: {dead.body[:80]!r}"
    else:
        headers = dead.properties.get("application_headers") or {}
        deaths = headers.get("x-death") or [{}]
        # nacked (the default): the broker's reason; a copy the worker published with
        # its error (ojs_dead_letter_mode="republish") carries x-ojs-error-code
        why = (f"x-ojs-error-code {headers['x-ojs-error-code']!r}"
               if headers.get("x-ojs-error-code") and not headers.get("x-death")
               else f"x-death reason {deaths[0].get('reason')!r}")
        outcome = (f"dead-lettered (found in {dlq}, {why}) after "
                   f"{headers.get('x-ojs-attempt')} attempts retried by the broker; "
                   f"last error: {error!r}")
    reports.append(JobReport(failing.id, "billing.charge", "delay", outcome,
                             outcome.startswith("dead-lettered")))

    expected_rows = {"quarter": "q3", "rows": [12, 30, 18]}
    reports.append(completed(fetch, "report.fetch", "chain 1/2", expected_rows))
    reports.append(completed(report, "report.render", "chain 2/2", "Q3: 3 rows, total 60"))
    return reports


def log_tail(path: Path, lines: int = 8) -> str:
    """The last ``lines`` lines of the worker log, indented for the error message."""
    if not path.exists():
        return ""
    tail = path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    return "".join(f"\n  | {line}" for line in tail)


def main() -> int:
    started = time.monotonic()
    try:
        connection = connect()
    except ExampleError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        names = ojs_kombu.TopologyNames(prefix=app.conf.ojs_prefix or "")
    except ojs_kombu.OJSConfigurationError as exc:
        connection.close()
        print(f"example misconfigured: {exc}", file=sys.stderr)
        return 1

    hostname = f"ojs-example-{os.getpid()}@{socket.gethostname()}"
    workdir = Path(tempfile.mkdtemp(prefix="ojs-example-"))
    log_path, outbox = workdir / "worker.log", workdir / "outbox.jsonl"
    outbox.touch()
    worker: subprocess.Popen[bytes] | None = None
    reports: list[JobReport] = []
    try:
        ojs_kombu.declare_topology(app, WORKER_QUEUES)
        worker = start_worker(hostname, log_path, outbox)
        ready_after = wait_until_ready(worker, hostname)
        queues = ", ".join(names.job_queue(q) for q in WORKER_QUEUES)
        print(f"worker {hostname} ready after {ready_after:.1f}s, consuming {queues}")
        reports = run_jobs(connection, names, outbox)
        for report in reports:
            print(report.line())
    except (ExampleError, ojs_kombu.OJSError) as exc:
        print(f"example failed: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    finally:
        if worker is not None:
            stop_worker(worker)
        try:
            purge_queues(connection, names)
        except Exception as exc:
            print(f"could not purge the example's queues: {exc!r}", file=sys.stderr)
        connection.close()

    elapsed = time.monotonic() - started
    if reports and all(r.as_expected for r in reports):
        print(f"all {len(reports)} jobs ended as expected ({elapsed:.1f}s); "
              "worker stopped, example queues purged")
        for path in (log_path, outbox):
            path.unlink(missing_ok=True)
        workdir.rmdir()
        return 0
    failed = sum(not r.as_expected for r in reports)
    summary = (f"{failed} of {len(reports)} jobs did not end as expected" if reports
               else "the example did not run to the end")
    print(f"{summary} ({elapsed:.1f}s); worker log {log_path}:{log_tail(log_path)}",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
