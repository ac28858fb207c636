"""Entry point for ``celery -A integration.tlsapp worker`` and ``ojs-kombu ... -A
integration.tlsapp`` over TLS: the CLI app (:func:`integration.apps.cli_app`, broker
from ``OJS_TEST_BROKER_URL``) with ``broker_use_ssl`` from ``OJS_TEST_BROKER_USE_SSL``
(JSON), and ``tls.record``, which appends its job id to ``OJS_TEST_DONE_FILE`` (one
``O_APPEND`` write per line): the count of every run."""

import json
import os
from typing import Any

import ojs_kombu
from integration.apps import cli_app

app = cli_app()
app.conf.broker_use_ssl = json.loads(os.environ["OJS_TEST_BROKER_USE_SSL"])
app.conf.broker_connection_retry_on_startup = True  # as a worker's default: retries
ojs_kombu.register_conformance_probes(app)  # what ojs-kombu conformance sends


@app.task(name="tls.record", bind=True, shared=False)
def record(self: Any, payload: str) -> int:
    fd = os.open(os.environ["OJS_TEST_DONE_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{self.request.id}\n".encode())
    finally:
        os.close(fd)
    return len(payload)
