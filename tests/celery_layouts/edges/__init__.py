"""An app that meets, at its call sites and in its settings, each refusal a call can
hit and the differences around operating workers (``tests/test_cli_migrate_layouts.py``
lists them, with the lines)."""

from celery import Celery

import ojs_kombu

app = Celery("edges", broker="ojs://guest:guest@127.0.0.1:1//",
             include=["edges.tasks", "edges.ops"])
ojs_kombu.install(app)
app.conf.broker_heartbeat = 30
app.conf.task_default_queue_type = "quorum"
