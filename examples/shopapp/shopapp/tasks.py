"""The shop's tasks, written with ``shared_task`` so that they run on whichever app
calls them: the shop's own, or the app a test fixture makes."""

from __future__ import annotations

from decimal import Decimal

from celery import shared_task

#: Stock on hand per SKU (a real shop keeps it in its database).
STOCK = {"tea": 10, "mug": 2}


class OutOfStock(Exception):
    """A line asks for more than the shop holds."""


@shared_task(name="shop.price_order")
def price_order(lines: list[dict[str, str]]) -> str:
    """The order's total, as a decimal string: each line is ``{sku, qty, unit_price}``."""
    total = sum((Decimal(line["unit_price"]) * int(line["qty"]) for line in lines),
                Decimal("0"))
    return str(total)


@shared_task(name="shop.reserve_stock")
def reserve_stock(sku: str, qty: int) -> int:
    """What is left of ``sku`` after ``qty`` are reserved; refuses more than is held."""
    held = STOCK.get(sku, 0)
    if qty > held:
        raise OutOfStock(f"{sku}: {qty} asked, {held} held")
    return held - qty


@shared_task(name="shop.receipt")
def receipt(total: str, order_id: str) -> str:
    """The receipt line of a priced order (the second link of a chain)."""
    return f"order {order_id}: {total}"


@shared_task(name="shop.tag_order")
def tag_order(order_id: str, tags: list[str]) -> str:
    """The order's label: its id and its tags, in order."""
    return " ".join([order_id, *sorted(tags)])
