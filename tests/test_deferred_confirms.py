"""Publishes that do not wait for their confirm (``ojs_publish_confirms="deferred"``):
a refused job is written again, a returned one is reported once, the window bounds
what is unconfirmed, and a flush settles everything (a scripted broker, no I/O)."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import amqp
import pytest

from ojs_kombu import DeferredPublishError, OJSConfigurationError
from ojs_kombu.amqp.publishing.deferred import DeferredConfirms
from ojs_kombu.amqp.publishing.ledger import ConfirmLedger, Publish
from ojs_kombu.spec.errors import (
    JobNackedError,
    JobPublishError,
    PublishConfirmTimeout,
    UnroutableJobError,
)
from ojs_kombu.spec.settings import OJSSettings

#: What the scripted broker answers to the n-th write (1-based) of a job.
Answer = Callable[[str, int], str | None]


def ack_all(_job_id: str, _nth: int) -> str:
    return "ack"


class ScriptedBroker:
    """A channel's publisher as :class:`DeferredConfirms` sees it: writes are recorded,
    and each is answered (ack, nack, return, or nothing) when the answers are read."""

    def __init__(self, answer: Answer = ack_all, **settings: Any) -> None:
        self.answer = answer
        self.settings = OJSSettings(publish_confirms="deferred", **settings)
        self.ledger = ConfirmLedger(lambda data: None)
        self.written: list[str] = []
        self.queued: deque[tuple[amqp.Message, int, str]] = deque()  # answers not yet read
        self.held = False  # answers stay with the broker until released
        self.forgotten: list[str] = []

    def confirm_mode(self) -> None:
        pass

    def send(self, message: amqp.Message, exchange: str, routing_key: str, mandatory: bool,
             timeout: float | None, *, job_id: str, queue: str,
             on_settled: Callable[[Publish], None] | None = None, **_: Any) -> Publish:
        entry = self.ledger.publish(b"", job_id=job_id, queue=queue, exchange=exchange,
                                    routing_key=routing_key, mandatory=mandatory,
                                    body=message.body, properties=message.properties,
                                    on_settled=on_settled)
        self.written.append(job_id)
        answer = self.answer(job_id, self.written.count(job_id))
        if answer is not None:
            self.queued.append((message, entry.sequence, answer))
        return entry

    def read_arrived(self, timeout: float) -> None:
        if self.held or not self.queued:
            raise TimeoutError()
        message, tag, answer = self.queued.popleft()
        if answer == "return":
            self.ledger.returned("ojs.exchange.direct", "email", message, "312 NO_ROUTE")
        if answer == "nack":
            self.ledger.nack(tag, multiple=False)
        else:
            self.ledger.ack(tag, multiple=False)

    def forget_topology(self, queue: str) -> None:
        self.forgotten.append(queue)


def publish(confirms: DeferredConfirms, job_id: str) -> None:
    message = amqp.Message(b"{}", message_id=job_id)
    confirms.publish(message, "ojs.exchange.direct", "email", job_id=job_id, queue="email",
                     mandatory=True, timeout=None)


def test_publish_returns_before_the_confirm_and_flush_settles_every_job() -> None:
    broker = ScriptedBroker()
    broker.held = True
    confirms = DeferredConfirms(broker)
    for n in range(5):
        publish(confirms, f"job-{n}")
    assert broker.written == [f"job-{n}" for n in range(5)]
    assert confirms.outstanding == 5  # returned without any confirm
    broker.held = False
    confirms.flush()
    assert confirms.outstanding == 0


def test_a_refused_job_is_written_again_until_the_broker_takes_it() -> None:
    broker = ScriptedBroker(lambda job_id, nth: "nack" if job_id == "full" and nth < 3
                            else "ack")
    confirms = DeferredConfirms(broker)
    publish(confirms, "full")
    publish(confirms, "other")
    confirms.flush()  # raises if anything was not accepted
    assert Counter(broker.written) == {"full": 3, "other": 1}


def test_a_job_refused_for_longer_than_the_confirm_timeout_is_reported() -> None:
    broker = ScriptedBroker(lambda job_id, nth: "nack", confirm_timeout=0.3)
    confirms = DeferredConfirms(broker)
    publish(confirms, "full")
    with pytest.raises(DeferredPublishError) as caught:
        # a flush far longer than the 0.3 s refusal limit: the job's refusal is decided
        # by a nack read after that limit, never cut short by the flush's own (a slow
        # machine that read no answer to the last re-send would rightly call it
        # unconfirmed: that write may or may not be enqueued)
        confirms.flush(30.0)
    assert list(caught.value.rejected) == ["full"]
    assert isinstance(caught.value.errors[0], JobNackedError)
    assert broker.written.count("full") > 1  # it was written again before giving up


def test_a_returned_job_is_raised_by_the_next_publish_which_sends_nothing() -> None:
    broker = ScriptedBroker(lambda job_id, nth: "return" if job_id == "lost" else "ack")
    confirms = DeferredConfirms(broker)
    publish(confirms, "lost")  # no error yet: its confirm was not read
    confirms.collect()
    with pytest.raises(DeferredPublishError) as caught:
        publish(confirms, "next")
    assert list(caught.value.rejected) == ["lost"]
    assert isinstance(caught.value.errors[0], UnroutableJobError)
    assert "next" not in broker.written
    assert broker.forgotten == ["email"]  # its topology is declared again next time
    publish(confirms, "next")  # reported once only
    confirms.flush()
    assert broker.written == ["lost", "next"]


def test_the_apps_callback_takes_what_was_not_accepted_instead_of_a_raise() -> None:
    seen: list[JobPublishError] = []
    broker = ScriptedBroker(lambda job_id, nth: "return" if job_id == "lost" else "ack",
                            on_publish_error=seen.append)
    confirms = DeferredConfirms(broker)
    for job_id in ("a", "lost", "b"):
        publish(confirms, job_id)
    confirms.flush()
    assert [(type(e), e.job_id) for e in seen] == [(UnroutableJobError, "lost")]


def test_a_full_window_waits_for_confirms_before_returning() -> None:
    broker = ScriptedBroker(unconfirmed_window=3)
    confirms = DeferredConfirms(broker)
    for n in range(10):
        publish(confirms, f"job-{n}")
        assert confirms.outstanding <= 3


def test_a_full_window_the_broker_never_confirms_raises() -> None:
    broker = ScriptedBroker(lambda job_id, nth: None, unconfirmed_window=2,
                            confirm_timeout=0.2)
    confirms = DeferredConfirms(broker)
    publish(confirms, "a")
    publish(confirms, "b")
    with pytest.raises(PublishConfirmTimeout, match="stopped confirming"):
        publish(confirms, "c")


def test_jobs_of_a_lost_channel_are_reported_as_unconfirmed() -> None:
    broker = ScriptedBroker(lambda job_id, nth: None)
    confirms = DeferredConfirms(broker)
    publish(confirms, "a")
    confirms.channel_lost()
    with pytest.raises(DeferredPublishError) as caught:
        confirms.flush()
    assert caught.value.unconfirmed == ("a",)
    assert "may or may not be enqueued" in str(caught.value)


def test_a_long_list_of_failures_is_summed_up_in_the_message() -> None:
    broker = ScriptedBroker(lambda job_id, nth: "return")
    confirms = DeferredConfirms(broker)
    for n in range(20):
        publish(confirms, f"job-{n}")
    with pytest.raises(DeferredPublishError) as caught:
        confirms.flush()
    assert len(caught.value.errors) == 20
    assert "and 15 more" in str(caught.value)


@pytest.mark.parametrize("options", [{"ojs_publish_confirms": "later"},
                                     {"ojs_unconfirmed_window": 0},
                                     {"ojs_on_publish_error": "print"}])
def test_bad_settings_are_refused_by_name(options: dict[str, Any]) -> None:
    with pytest.raises(OJSConfigurationError, match=next(iter(options))[4:]):
        OJSSettings.from_options(options, source="app.conf")


def test_the_default_is_the_waiting_publish() -> None:
    assert OJSSettings().publish_confirms == "wait"
