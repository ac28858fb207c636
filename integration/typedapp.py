"""``celery -A integration.typedapp worker`` for integration/test_typed_calls.py.

An ordinary Celery app's calls, unchanged: tasks taking and returning the values
Celery's JSON carries (dates, UUIDs, Decimals, bytes, a type the app registers with
kombu), chained, grouped and chorded, and sent with explicit task ids.  Results go to
Redis (``OJS_TEST_BACKEND_URL``), as they would in production.
"""

from __future__ import annotations

import os
from datetime import date, timedelta
from decimal import Decimal
from typing import Any

from celery import Celery
from kombu.utils.json import register_type

import ojs_kombu
from integration.apps import hold


class Money:
    """An app's own value type, registered with kombu as apps do."""

    def __init__(self, amount: Decimal, currency: str) -> None:
        self.amount, self.currency = amount, currency

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Money) and (self.amount, self.currency) == (
            other.amount, other.currency)

    def __repr__(self) -> str:
        return f"Money({self.amount!r}, {self.currency!r})"


register_type(Money, "typedapp_money", lambda m: [str(m.amount), m.currency],
              lambda v: Money(Decimal(v[0]), v[1]))

app = Celery("typed", broker=os.environ["OJS_TEST_BROKER_URL"],
             backend=os.environ["OJS_TEST_BACKEND_URL"], set_as_current=False)
ojs_kombu.install(app)
app.conf.update(broker_connection_retry_on_startup=False, worker_hijack_root_logger=False,
                task_default_queue="typed", task_track_started=True, result_expires=600)


def kinds(value: Any) -> Any:
    """The Python type of every value, nested as given."""
    if isinstance(value, dict):
        return {k: kinds(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [kinds(v) for v in value]
    return type(value).__name__


@app.task(name="typed.echo")
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """What the task was given, and the types it was given them as."""
    return {"args": list(args), "kwargs": kwargs, "kinds": kinds([list(args), kwargs])}


@app.task(name="typed.next_day")
def next_day(day: date) -> date:
    if type(day) is not date:
        raise TypeError(f"expected a date, got {type(day).__name__}: {day!r}")
    return day + timedelta(days=1)


@app.task(name="typed.price")
def price(cents: int) -> Decimal:
    return Decimal(cents) / 100


@app.task(name="typed.total")
def total(amounts: list[Decimal], currency: str = "EUR") -> Money:
    wrong = [a for a in amounts if type(a) is not Decimal]
    if wrong:
        raise TypeError(f"expected Decimals, got {wrong!r}")
    return Money(sum(amounts, Decimal(0)), currency)


@app.task(name="typed.count")
def count(results: list[Any], key: str) -> int:
    """A chord body that counts its runs in Redis (a re-applied chord runs it again)."""
    import redis

    return int(redis.Redis.from_url(os.environ["OJS_TEST_BACKEND_URL"]).incr(key))


@app.task(name="typed.slow")
def slow(seconds: float, gate: str = "") -> str:
    hold(seconds, gate)
    return "slept"
