"""The app; its tasks are ``@shared_task``s in ``<package>.tasks`` modules it discovers."""

from celery import Celery

app = Celery("layout_autodiscover", broker="amqp://guest:guest@127.0.0.1:1//")
app.conf.ojs_retry_semantics = "ojs"
app.autodiscover_tasks(["layout_autodiscover.orders", "layout_autodiscover.emails"])
