from celery.exceptions import Reject

from edges import app


@app.task(ojs_type="edges.import_feed")
def ImportFeed(url: str) -> str:  # a name outside the OJS type grammar
    if not url:
        raise Reject("empty", requeue=True)
    return url


@app.task(bind=True)
def where(self) -> str:  # type: ignore[no-untyped-def]
    return str(self.request.delivery_info)
