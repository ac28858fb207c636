"""Orders through a real broker and a worker per test (``celery_app``, ``celery_worker``)."""

from __future__ import annotations

import pytest
from celery import chain
from shopapp.tasks import OutOfStock, price_order, receipt, reserve_stock

LINES = [{"sku": "tea", "qty": "3", "unit_price": "4.10"},
         {"sku": "mug", "qty": "1", "unit_price": "12.00"}]


def test_price_order(celery_app, celery_worker) -> None:
    assert price_order.delay(LINES).get(timeout=30) == "24.30"


def test_reserve_stock_refuses_more_than_held(celery_app, celery_worker) -> None:
    assert reserve_stock.delay("mug", 2).get(timeout=30) == 0
    with pytest.raises(OutOfStock):
        reserve_stock.delay("mug", 3).get(timeout=30)


def test_priced_order_receipt_chain(celery_app, celery_worker) -> None:
    flow = chain(price_order.s(LINES), receipt.s("order-7"))
    assert flow.delay().get(timeout=30) == "order order-7: 24.30"
