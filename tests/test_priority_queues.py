"""Priority queues where the app asks for them, as in Celery (AMQP-030): which job
queues are declared with ``x-max-priority``, and the one a queue already holds."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery
from kombu import Queue

import ojs_kombu
from ojs_kombu.cli.config import Options
from ojs_kombu.spec.inequivalent import kept_max_priority


def make_app(**conf: Any) -> Celery:
    app = Celery("priorities", broker="ojs://guest:guest@127.0.0.1:5672//",
                 set_as_current=False)
    ojs_kombu.install(app)
    app.conf.update(conf)
    return app


def priority(app: Celery, queue: str) -> Any:
    """The ``x-max-priority`` the app declares ``queue`` with (``None``: none), as the
    worker's queue table shows it to Celery and as the transport declares it."""
    job_queue = app.amqp.queues[queue]
    declared = app.amqp.binding.declare_arguments(job_queue.ojs_queue)
    shown = (job_queue.queue_arguments or {}).get("x-max-priority")
    assert shown == declared.get("x-max-priority")
    return shown


def test_job_queues_are_classic_queues_without_priorities_by_default() -> None:
    app = make_app()
    assert priority(app, "celery") is None and priority(app, "email") is None


def test_task_default_priority_is_a_message_priority_only_as_in_celery() -> None:
    """Celery sends it as each message's priority and declares no priority queue for
    it (only ``task_queue_max_priority`` does); a classic queue ignores it."""
    app = make_app(task_default_priority=5)
    assert priority(app, "email") is None


def test_task_queue_max_priority_makes_every_classic_queue_a_priority_queue() -> None:
    app = make_app(task_queue_max_priority=10, ojs_queues={"fast": {"type": "quorum"}})
    assert priority(app, "celery") == 10 and priority(app, "email") == 10
    assert priority(app, "fast") is None  # quorum queues refuse x-max-priority
    assert app.amqp.binding.declare_arguments("fast")["x-queue-type"] == "quorum"


def test_ojs_max_priority_given_wins_over_task_queue_max_priority() -> None:
    assert priority(make_app(task_queue_max_priority=10, ojs_max_priority=5), "email") == 5
    assert priority(make_app(task_queue_max_priority=10, ojs_max_priority=None),
                    "email") is None
    assert priority(make_app(ojs_max_priority=3), "email") == 3


def test_a_celery_queue_of_its_own_asks_for_its_priority() -> None:
    app = make_app(task_queues=[Queue("email", queue_arguments={"x-max-priority": 5}),
                                Queue("reports", max_priority=3), Queue("bulk")])
    assert priority(app, "email") == 5 and priority(app, "reports") == 3
    assert priority(app, "bulk") is None


def test_an_ojs_queues_entry_asks_for_its_priority() -> None:
    app = make_app(ojs_queues={"email": {"priority": True}, "reports": {"priority": 4}})
    assert priority(app, "email") == 10 and priority(app, "reports") == 4
    assert priority(app, "bulk") is None


def test_the_command_line_reads_task_queue_max_priority_of_its_app() -> None:
    options = Options(_app=make_app(task_queue_max_priority=7))
    assert options.binding().declare_arguments("email") == {"x-max-priority": 7}
    assert Options(_app=make_app()).binding().declare_arguments("email") == {}


@pytest.mark.parametrize(("reply", "kept"), [
    ("PRECONDITION_FAILED - inequivalent arg 'x-max-priority' for queue 'ojs.queue.email' in "
     "vhost '/': received none but current is the value '10' of type 'signedint'", 10),
    ("PRECONDITION_FAILED - inequivalent arg 'x-max-priority' for queue 'ojs.queue.email' in "
     "vhost 'v': received none but current is the value '255' of type 'unsignedbyte'", 255),
    # the app asked for another priority: a real conflict
    ("PRECONDITION_FAILED - inequivalent arg 'x-max-priority' for queue 'ojs.queue.email' in "
     "vhost '/': received '5' but current is '10'", None),
    # the app asks for a priority the queue lacks: a real conflict
    ("PRECONDITION_FAILED - inequivalent arg 'x-max-priority' for queue 'ojs.queue.email' in "
     "vhost '/': received the value '10' of type 'signedint' but current is none", None),
    ("PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'ojs.queue.email' in "
     "vhost '/': received none but current is the value '10' of type 'signedint'", None),
    ("PRECONDITION_FAILED - something else", None),
])
def test_only_a_priority_the_app_did_not_ask_for_is_kept(reply: str, kept: int | None) -> None:
    assert kept_max_priority(reply) == kept
