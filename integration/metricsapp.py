"""``celery -A integration.metricsapp worker`` in integration/test_metrics_recipe.py.

The suite's worker app (:func:`integration.apps.cli_app`) plus the docs'
Prometheus recipe ("Events, metrics and tracing") as written there, but for the
port, which comes from ``OJS_TEST_METRICS_PORT``.
"""

from __future__ import annotations

import os
from typing import Any

from celery.signals import worker_init
from opentelemetry import metrics
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import start_http_server

from integration.apps import cli_app
from ojs_kombu.spec.errors import UnroutableJobError

app = cli_app()


@worker_init.connect
def serve_metrics(**_: Any) -> None:
    start_http_server(int(os.environ["OJS_TEST_METRICS_PORT"]))  # one port per worker of a host
    metrics.set_meter_provider(MeterProvider(metric_readers=[PrometheusMetricReader()]))


@app.task(name="metrics.enqueue", shared=False)
def enqueue(queue: str) -> str:
    """Publish a job from the worker: ``published`` or, with no queue, ``returned``."""
    try:
        app.tasks["math.add"].apply_async((1, 1), queue=queue)
    except UnroutableJobError:
        return "returned"
    return "published"
