"""Entry point for ``celery -A integration.cliapp worker`` in the integration suite.

``OJS_TEST_RESULT_BACKEND`` replaces the app's result backend (``none``: no backend),
for workers whose INFO answers depend on it; ``OJS_TEST_CANCEL_GRACE`` sets
``ojs_cancel_grace``; ``OJS_TEST_BROKER_HEARTBEAT`` sets ``broker_heartbeat``;
``OJS_TEST_CONFORMANCE_PROBES`` registers the tasks
``ojs-kombu conformance`` sends; ``OJS_TEST_EVENT_SINKS`` sets ``ojs_event_sinks``
(comma-separated); ``OJS_TEST_CONTROL_USERS`` (JSON) sets ``ojs_control_users``;
``OJS_TEST_DEAD_LETTER_MODE`` sets ``ojs_dead_letter_mode`` (unset: the default, ``nack``);
``OJS_TEST_QUEUE_MAX_PRIORITY`` sets Celery's ``task_queue_max_priority`` (priority queues,
AMQP-030, as the example app asks for them).
"""

import json
import os

import ojs_kombu
from integration.apps import cli_app

app = cli_app()
if "OJS_TEST_RESULT_BACKEND" in os.environ:
    backend = os.environ["OJS_TEST_RESULT_BACKEND"]
    app.conf.result_backend = None if backend == "none" else backend
if "OJS_TEST_CANCEL_GRACE" in os.environ:
    app.conf.ojs_cancel_grace = float(os.environ["OJS_TEST_CANCEL_GRACE"])
if os.environ.get("OJS_TEST_CONFORMANCE_PROBES"):
    ojs_kombu.register_conformance_probes(app)
if "OJS_TEST_DEAD_LETTER_MODE" in os.environ:
    app.conf.ojs_dead_letter_mode = os.environ["OJS_TEST_DEAD_LETTER_MODE"]
if "OJS_TEST_BROKER_HEARTBEAT" in os.environ:
    app.conf.broker_heartbeat = float(os.environ["OJS_TEST_BROKER_HEARTBEAT"])
if os.environ.get("OJS_TEST_EVENT_SINKS"):
    app.conf.ojs_event_sinks = os.environ["OJS_TEST_EVENT_SINKS"].split(",")
if "OJS_TEST_QUEUE_MAX_PRIORITY" in os.environ:
    app.conf.task_queue_max_priority = int(os.environ["OJS_TEST_QUEUE_MAX_PRIORITY"])
if "OJS_TEST_CONTROL_USERS" in os.environ:
    app.conf.ojs_control_users = json.loads(os.environ["OJS_TEST_CONTROL_USERS"])
