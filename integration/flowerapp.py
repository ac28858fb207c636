"""The app ``celery -A integration.flowerapp worker`` and ``... flower`` run in
integration/test_flower.py: an OJS app (broker from ``OJS_TEST_BROKER_URL``)."""

from __future__ import annotations

import os

from celery import Celery

import ojs_kombu

app = Celery("flowerapp", broker=os.environ["OJS_TEST_BROKER_URL"], backend="rpc://",
             set_as_current=False)
ojs_kombu.install(app)
app.conf.update(broker_connection_retry_on_startup=False, worker_hijack_root_logger=False,
                worker_send_task_events=True, task_send_sent_event=True)


@app.task(name="flower.add")
def add(x: int, y: int) -> int:
    return x + y


@app.task(name="flower.fail")
def fail(reason: str) -> None:
    raise ValueError(reason)
