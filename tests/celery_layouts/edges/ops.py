"""Callers that hit each refusal, and operations code."""

from edges import app
from edges.tasks import ImportFeed


def send(url: str, delay: float) -> None:
    ImportFeed.apply_async((url,), queue="Bulk Feeds")
    ImportFeed.apply_async((url,), exchange="feeds", routing_key="feeds.bulk")
    ImportFeed.apply_async((url,), serializer="pickle")
    ImportFeed.apply_async((url,), priority=200)
    ImportFeed.apply_async((url,), countdown=60 * 24 * 3600)
    ImportFeed.apply_async((url,), time_limit=-1)
    ImportFeed.apply_async((url,), user_id="feeder", app_id="feeds")
    ImportFeed.apply_async((url,), countdown=delay)


def operate() -> None:
    app.control.purge()
    print(app.control.inspect().active())


def batch(urls: list[str]) -> None:
    from ojs_kombu import enqueue_many

    enqueue_many(app, [ImportFeed.s(url) for url in urls])
