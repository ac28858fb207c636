"""Buffered task events are flushed without losing one a pool thread buffers while the
flush publishes (Celery 5.5 and 5.6's own flush publishes the buffer, then empties it;
5.7 keeps them as this does)."""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu import Connection

from ojs_kombu.celery.celery_seam import flush_task_events


def dispatcher_sending_late_event() -> list[list[str]]:
    """The task events each publish carried; while the first publish runs, another
    thread's ``task-succeeded`` is buffered (here: from inside that publish)."""
    app = Celery("flush", set_as_current=False)
    published: list[list[str]] = []
    with Connection("memory://") as connection:
        dispatcher = app.events.Dispatcher(connection, hostname="w@h", buffer_group=["task"],
                                           on_send_buffered=lambda: None)
        real_publish = dispatcher.producer.publish
        late = [True]

        def publish(body: Any, *args: Any, **kwargs: Any) -> Any:
            published.append([event["type"] for event in body])
            if late:
                late.clear()
                dispatcher.send("task-succeeded", uuid="1")  # a pool thread, meanwhile
            return real_publish(body, *args, **kwargs)

        dispatcher.producer.publish = publish
        dispatcher.send("task-received", uuid="1")
        dispatcher.send("task-started", uuid="1")
        flush_task_events(dispatcher)
        flush_task_events(dispatcher)  # the next flush the late event asked for
        dispatcher.close()
    app.close()
    return published


def test_an_event_buffered_during_the_flush_is_sent_by_the_next() -> None:
    published = dispatcher_sending_late_event()
    assert published == [["task-received", "task-started"], ["task-succeeded"]]
