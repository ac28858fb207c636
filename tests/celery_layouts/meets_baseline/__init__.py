"""An app that meets no difference from plain Celery beyond those every app with tasks
meets: its failed jobs are dead-lettered, its queue is ``ojs.queue.default``."""

from celery import Celery

import ojs_kombu

app = Celery("meets_baseline", broker="ojs://guest:guest@127.0.0.1:1//",
             include=["meets_baseline.tasks"])
ojs_kombu.install(app)
app.conf.broker_heartbeat = 30


def resize(path: str) -> None:
    """A caller: a plain ``delay`` with JSON arguments."""
    from meets_baseline.tasks import thumbnail

    thumbnail.delay(path, 128)
    thumbnail.apply_async((path, 256), priority=5, queue="celery")
