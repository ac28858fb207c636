"""Tasks found through ``app.conf.imports``."""

from layout_include.celery import app


@app.task(name="layout_include.reports.BuildReport", ojs_retry={"max_attempts": 5})
def build_report(month: int) -> int:
    return month
