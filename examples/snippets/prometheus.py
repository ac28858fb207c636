"""docs/events.rst: a Prometheus endpoint per worker (in the module that creates the app)."""

# [prometheus]
from celery.signals import worker_init
from opentelemetry import metrics
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import start_http_server


@worker_init.connect
def serve_metrics(**_):
    start_http_server(9464)  # one port per worker of a host
    metrics.set_meter_provider(MeterProvider(metric_readers=[PrometheusMetricReader()]))
# [/prometheus]
