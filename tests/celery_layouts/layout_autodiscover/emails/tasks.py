"""Email tasks, found by ``autodiscover_tasks``."""

from celery import shared_task


@shared_task
def welcome(to: str) -> str:
    return to
