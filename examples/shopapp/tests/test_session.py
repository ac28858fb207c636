"""Orders through the session's worker (``celery_session_app``, ``celery_session_worker``)."""

from __future__ import annotations

from typing import Any

import pytest
from shopapp.tasks import price_order, reserve_stock

from .conftest import BROKER_URL


@pytest.fixture(scope="session")
def celery_config() -> dict[str, Any]:
    # A queue of its own: the per-test workers of test_orders.py never take these jobs.
    return {"broker_url": BROKER_URL, "result_backend": "cache+memory://",
            "task_default_queue": "shop-session"}


def test_session_price(celery_session_app, celery_session_worker) -> None:
    assert price_order.delay([{"sku": "tea", "qty": "2", "unit_price": "0.5"}]
                             ).get(timeout=30) == "1.0"


def test_session_reserve(celery_session_app, celery_session_worker) -> None:
    assert reserve_stock.delay("tea", 4).get(timeout=30) == 6
