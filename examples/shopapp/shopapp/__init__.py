"""A small shop: the Celery app whose own test suite ojs_kombu's integration tests run."""
