"""Tasks found through ``include=``."""

from layout_include.celery import app


@app.task
def send_email(to: str) -> str:
    return to


@app.task(acks_late=False)
def charge(amount: int) -> int:
    return amount


@app.task(autoretry_for=(OSError,), max_retries=4)
def fetch(url: str) -> str:
    return url
