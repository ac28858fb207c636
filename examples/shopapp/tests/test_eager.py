"""Eager mode (no broker, no worker), with ``ojs_eager_encode`` on ``ojs://``."""

from __future__ import annotations

import pytest
from kombu.exceptions import EncodeError
from shopapp.tasks import tag_order

from ojs_kombu import NonJSONArgumentError

from .conftest import BROKER_URL


# eager-start
@pytest.mark.celery(task_always_eager=True, ojs_eager_encode=True)
def test_tags_travel_as_a_list(celery_app) -> None:
    tag = celery_app.tasks[tag_order.name]  # the fixture's app (no worker made it current)
    assert tag.delay("order-7", ["gift", "fragile"]).get() == "order-7 fragile gift"
    # A set is no JSON: the publish would refuse it, so the eager call does too
    # (ojs_eager_encode: NonJSONArgumentError; Celery's own eager check on amqp://:
    # kombu's EncodeError, its base class).
    refused = NonJSONArgumentError if BROKER_URL.startswith("ojs") else EncodeError
    with pytest.raises(refused):
        tag.delay("order-7", {"gift", "fragile"})
# eager-end
