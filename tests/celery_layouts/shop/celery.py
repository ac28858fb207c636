from celery import Celery

import ojs_kombu

app = Celery("shop", broker="ojs://guest:guest@127.0.0.1:1//",
             backend="redis://127.0.0.1:1/0",
             include=["shop.orders", "shop.emails", "shop.views"])
ojs_kombu.install(app)
app.conf.task_routes = {"shop.emails.*": {"queue": "emails"}}
app.conf.task_time_limit = 300
app.conf.task_soft_time_limit = 240
app.conf.beat_schedule = {
    "nightly-report": {"task": "shop.orders.report", "schedule": 86400.0},
}
