"""Order tasks, found by ``autodiscover_tasks``."""

from celery import shared_task


@shared_task(acks_late=False)
def ship(order_id: int) -> int:
    return order_id


@shared_task(autoretry_for=(OSError,), max_retries=3)
def reserve(order_id: int) -> int:
    return order_id
