"""``celery -A layout_include worker`` finds this app; it imports no task module itself."""

from celery import Celery

app = Celery("layout_include", broker="amqp://guest:guest@127.0.0.1:1//",
             include=["layout_include.tasks"])
app.conf.imports = ["layout_include.reports"]
app.conf.ojs_job_types = {"layout_include.reports.BuildReport": "reports.build"}
