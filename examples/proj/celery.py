"""The example's Celery app, wired to OJS with ``ojs_kombu.install(app)``.

Environment:

* ``OJS_BROKER_URL``: broker URL (default ``ojs://guest:guest@localhost:5672//``);
* ``OJS_EXAMPLE_PREFIX``: prefix of every AMQP name the example uses (default
  ``example``: queues are ``example.ojs.queue.email`` ...), so the example never
  touches the queues of other applications on the same broker.

Run a worker from the ``examples/`` directory::

    celery -A proj worker -Q email,default
"""

from __future__ import annotations

import os

from celery import Celery

import ojs_kombu

DEFAULT_BROKER_URL = "ojs://guest:guest@localhost:5672//"

app = Celery(
    "proj",
    broker=os.environ.get("OJS_BROKER_URL", DEFAULT_BROKER_URL),
    backend="rpc://",
    include=["proj.tasks"],
)
ojs_kombu.install(app)
# the probe jobs ``ojs-kombu conformance`` watches a worker with (conformance.fail/.sleep)
ojs_kombu.register_conformance_probes(app)

app.conf.update(
    ojs_prefix=os.environ.get("OJS_EXAMPLE_PREFIX", "example"),
    # Celery routes by task name; the queue names are OJS queue names.  Tasks
    # without a route go to Celery's default queue ``celery``, which is OJS's
    # ``default`` queue.
    task_routes={"proj.tasks.send_email": {"queue": "email"}},
    # Priority queues (x-max-priority, AMQP-030) as Celery asks for them: without
    # this, queues are classic queues and a job's priority= is not acted on.
    task_queue_max_priority=10,
    broker_connection_retry_on_startup=True,
)
