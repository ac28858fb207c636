"""The layout of Celery's "First steps with Django": the app is imported with the package."""

from .celery import app as celery_app

__all__ = ["celery_app"]
