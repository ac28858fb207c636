"""Celery apps used by the integration suite (real RabbitMQ, real workers)."""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime
from typing import Any

from celery import Celery
from celery.exceptions import Reject

import ojs_kombu

#: Queues the session's in-process worker consumes.
WORKER_QUEUES = ["default", "email", "malformed", "failing", "canvas", "errbacks", "retries",
                 "events", "semantics"]
#: Short delays so retry tests take seconds, not minutes.
FAST_RETRY = {"initial_interval": "PT0.2S", "max_interval": "PT1S", "jitter": False}
#: Switches the integration tests flip to make a job fail or succeed.
SWITCHES: dict[str, bool] = {"toggle.fail": True}


def hold(seconds: float, gate: str = "") -> None:
    """Sleep ``seconds``; given a ``gate`` (a file's path), until the test creates it
    (at most ``seconds``): a job that must still be running when the test looks then
    runs as long as the test needs, however slow the machine."""
    if not gate:
        time.sleep(seconds)
        return
    deadline = time.monotonic() + seconds
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)


class CallLog:
    """Thread-safe record of task executions, so tests can wait for a job id."""

    def __init__(self) -> None:
        self._calls: list[dict[str, Any]] = []
        self._cond = threading.Condition()

    def add(self, **call: Any) -> None:
        with self._cond:
            self._calls.append(call)
            self._cond.notify_all()

    def wait_for(self, job_id: str | None = None, timeout: float = 20.0,
                 **match: Any) -> dict[str, Any]:
        """The first call with ``job_id`` (and/or the given field values), waiting for it."""
        if job_id is not None:
            match["id"] = job_id
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for call in self._calls:
                    if all(call.get(k) == v for k, v in match.items()):
                        return call
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"no call matching {match} within {timeout}s")
                self._cond.wait(remaining)

    def all(self) -> list[dict[str, Any]]:
        with self._cond:
            return list(self._calls)

    def count(self, job_id: str) -> int:
        with self._cond:
            return sum(call["id"] == job_id for call in self._calls)


def make_app(name: str, broker_url: str, backend: str | None = None, **conf: Any) -> Celery:
    app = Celery(name, broker=broker_url, backend=backend, set_as_current=False)
    ojs_kombu.install(app)
    app.conf.update(broker_connection_retry_on_startup=False, **conf)
    app.calls = CallLog()  # type: ignore[attr-defined]
    register_tasks(app)
    return app


def register_tasks(app: Celery) -> None:
    calls: CallLog = app.calls  # type: ignore[attr-defined]

    @app.task(name="email.send", bind=True, shared=False)
    def send_email(self: Any, to: str, template: str) -> str:
        calls.add(id=self.request.id, task="email.send", args=[to, template],
                  scheduled_at=getattr(self.request, "x-ojs-scheduled-at", None),
                  eta=self.request.eta, started=datetime.now(UTC),
                  retries=self.request.retries)
        return f"sent {template} to {to}"

    @app.task(name="math.add", bind=True, shared=False)
    def add(self: Any, x: int, y: int) -> int:
        calls.add(id=self.request.id, task="math.add", args=[x, y])
        return x + y

    @app.task(name="math.tsum", shared=False)
    def tsum(numbers: list[int]) -> int:
        return sum(numbers)

    @app.task(name="proj.tasks.Legacy", ojs_type="legacy.run", bind=True, shared=False)
    def legacy(self: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        calls.add(id=self.request.id, task="legacy.run", args=list(args), kwargs=kwargs)
        return {"args": list(args), "kwargs": kwargs}

    # ojs_retry={}: OJS retry semantics under the default policy (3 attempts), which
    # the default ojs_retry_semantics="celery" keeps for tasks that ask for it only.
    @app.task(name="always.fail", bind=True, shared=False, ojs_retry={})
    def fail(self: Any) -> None:
        calls.add(id=self.request.id, task="always.fail", args=[])
        raise RuntimeError("boom")

    @app.task(name="always.requeue", bind=True, shared=False, ojs_retry={})
    def requeue(self: Any) -> None:
        calls.add(id=self.request.id, task="always.requeue", args=[])
        raise Reject("asked to be requeued", requeue=True)

    @app.task(name="semantics.no_options", bind=True, shared=False)
    def no_options(self: Any) -> None:
        """No retry options: under Celery's semantics a failure is not retried."""
        calls.add(id=self.request.id, task="semantics.no_options", args=[],
                  attempt=getattr(self.request, "x-ojs-attempt", None))
        raise RuntimeError("sent one email, then failed")

    @app.task(name="semantics.autoretry", bind=True, shared=False, autoretry_for=(ValueError,),
              max_retries=2, retry_backoff=False, default_retry_delay=0.1)
    def autoretry(self: Any, error: str) -> None:
        calls.add(id=self.request.id, task="semantics.autoretry", args=[error],
                  attempt=getattr(self.request, "x-ojs-attempt", None),
                  retries=self.request.retries)
        raise {"ValueError": ValueError, "KeyError": KeyError}[error](f"{error} raised")

    @app.task(name="flaky.twice", bind=True, shared=False, ojs_retry=FAST_RETRY)
    def flaky_twice(self: Any) -> str:
        attempt = getattr(self.request, "x-ojs-attempt", None)
        calls.add(id=self.request.id, task="flaky.twice", args=[], attempt=attempt,
                  retries=self.request.retries)
        if self.request.retries < 2:
            raise ConnectionError(f"attempt {attempt} failed")
        return f"done on attempt {attempt}"

    @app.task(name="reject.value", bind=True, shared=False,
              ojs_retry={**FAST_RETRY, "non_retryable_errors": ["ValueError"]})
    def reject_value(self: Any) -> None:
        calls.add(id=self.request.id, task="reject.value", args=[])
        raise ValueError("invalid input is not worth retrying")

    @app.task(name="explicit.retry", bind=True, shared=False)
    def explicit_retry(self: Any) -> str:
        calls.add(id=self.request.id, task="explicit.retry", args=[],
                  retries=self.request.retries)
        if self.request.retries == 0:
            raise self.retry(countdown=0.5, exc=TimeoutError("upstream busy"))
        return "done"

    @app.task(name="retry.gives_up", bind=True, shared=False, ojs_retry=FAST_RETRY)
    def retry_gives_up(self: Any) -> None:
        """Its policy leaves 3 attempts; ``self.retry(max_retries=0)`` allows none."""
        calls.add(id=self.request.id, task="retry.gives_up", args=[])
        raise self.retry(exc=TimeoutError("upstream gone"), max_retries=0)

    @app.task(name="retry.after", bind=True, shared=False)
    def retry_after(self: Any, countdown: float, how: str = "self.retry") -> str:
        """Fails its first attempt, asking for its next one ``countdown`` s later:
        ``self.retry(countdown=...)``, or (``how="raise"``) by raising, for the job's
        own OJS retry policy or Celery's ``autoretry_for`` to time the retry."""
        attempt = getattr(self.request, "x-ojs-attempt", None) or self.request.retries + 1
        calls.add(id=self.request.id, task="retry.after", args=[countdown, how],
                  attempt=attempt, at=time.time())
        if attempt == 1:
            if how == "raise":
                raise TimeoutError("429 Too Many Requests")
            raise self.retry(countdown=countdown, exc=TimeoutError("Retry-After"))
        return "done"

    @app.task(name="retry.backoff", bind=True, shared=False, autoretry_for=(TimeoutError,),
              retry_backoff=5, retry_jitter=False, max_retries=1)
    def retry_backoff(self: Any) -> str:
        """``retry_backoff=5`` without jitter: Celery asks for its first retry after 5 s
        (just past the 4.096 s rung, the nearest one)."""
        calls.add(id=self.request.id, task="retry.backoff", args=[],
                  attempt=self.request.retries + 1, at=time.time())
        if self.request.retries == 0:
            raise TimeoutError("busy")
        return "done"

    @app.task(name="delivery.priority", bind=True, shared=False)
    def delivery_priority(self: Any) -> Any:
        """The priority Celery's request reports (kombu's producer always sends one)."""
        return self.request.delivery_info["priority"]

    @app.task(name="retry.new_args", bind=True, shared=False)
    def retry_new_args(self: Any, value: int) -> int:
        calls.add(id=self.request.id, task="retry.new_args", args=[value],
                  job_id=self.ojs.info().job_id)
        if value == 1:
            raise self.retry(args=[2], countdown=0.2)
        return value

    @app.task(name="toggle.fail", bind=True, shared=False, ojs_retry={"max_attempts": 1})
    def toggle_fail(self: Any) -> str:
        calls.add(id=self.request.id, task="toggle.fail", args=[],
                  attempt=getattr(self.request, "x-ojs-attempt", None))
        if SWITCHES["toggle.fail"]:
            raise RuntimeError("switched off")
        return "ran"

    @app.task(name="progress.report", bind=True, shared=False)
    def progress_report(self: Any) -> str:
        self.ojs.progress(50, "half way")
        self.ojs.progress(100)
        return "reported"

    @app.task(name="loop.until_cancelled", bind=True, shared=False)
    def loop_until_cancelled(self: Any, seconds: float) -> str:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.ojs.cancelled:
                calls.add(id=self.request.id, task="loop.until_cancelled", args=["cancelled"])
                return "stopped early"
            time.sleep(0.05)
        return "ran to the end"

    @app.task(name="sleep.for", bind=True, shared=False)
    def sleep_for(self: Any, seconds: float, gate: str = "") -> float:
        hold(seconds, gate)
        calls.add(id=self.request.id, task="sleep.for", args=[seconds])
        return seconds


def cli_app() -> Celery:
    """The app ``celery -A integration.cliapp worker`` runs (broker from the environment)."""
    events_file = os.environ.get("OJS_TEST_EVENTS_FILE")
    return make_app("cli", os.environ["OJS_TEST_BROKER_URL"], "rpc://",
                    worker_hijack_root_logger=False,
                    ojs_event_sinks=[f"file:{events_file}"] if events_file else [],
                    ojs_worker_heartbeat=1, ojs_job_heartbeat=1,
                    ojs_control_queues=not os.environ.get("OJS_TEST_NO_CONTROL"),
                    ojs_acks=os.environ.get("OJS_TEST_ACKS", "batched"),
                    ojs_retry_semantics=os.environ.get("OJS_TEST_RETRY_SEMANTICS", "celery"))
