from shop.celery import app


@app.task(bind=True, max_retries=5)
def confirm(self, order_id: int, to: str) -> str:  # type: ignore[no-untyped-def]
    if not to:
        raise self.retry(countdown=60)
    return to
