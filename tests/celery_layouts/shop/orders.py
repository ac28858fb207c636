from decimal import Decimal

from shop.celery import app


@app.task(autoretry_for=(ConnectionError,), max_retries=5, rate_limit="10/s")
def charge(order_id: int, amount: Decimal) -> str:
    return f"{order_id}:{amount}"


@app.task(time_limit=120, soft_time_limit=100)
def report() -> int:
    return 0
