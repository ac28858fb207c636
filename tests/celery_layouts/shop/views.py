"""The web views that send the shop's jobs."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from shop.emails import confirm
from shop.orders import charge


def checkout(order_id: int, email: str) -> None:
    charge.apply_async((order_id, Decimal("9.99")), task_id=f"order-{order_id}-charge",
                       priority=5)
    confirm.apply_async((order_id, email), countdown=30, expires=3600)


def remind(order_id: int, email: str) -> None:
    confirm.apply_async((order_id, email),
                        eta=datetime.now(UTC) + timedelta(days=3))
