"""Example Celery project whose tasks are Open Job Spec jobs on RabbitMQ (via ojs_kombu)."""

from .celery import app

__all__ = ["app"]
