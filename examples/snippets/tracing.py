"""docs/events.rst: OpenTelemetry tracing in every kind of worker (in the module that
creates the app)."""

# [tracing]
from celery.signals import worker_init, worker_process_init
from opentelemetry.instrumentation.celery import CeleryInstrumentor


# prefork (the default pool): tasks run in child processes, which are forked after
# the app module was imported; instrument each child as it starts
@worker_process_init.connect(weak=False)
def instrument_pool_process(**_):
    CeleryInstrumentor().instrument()


# threads, solo, gevent and eventlet run tasks in the worker's own process
@worker_init.connect(weak=False)
def instrument_worker(sender=None, **_):
    pool = str(getattr(sender, "pool_cls", "") or "")
    if "prefork" not in pool and "processes" not in pool:
        CeleryInstrumentor().instrument()
# [/tracing]
