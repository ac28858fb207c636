"""docs/control-plane.rst, docs/retries.rst, docs/production.rst: operating jobs."""

from __future__ import annotations

from typing import Any

from celery import Celery

import ojs_kombu


def control(broker_url: str, job_id: str, id1: str, id2: str) -> list[Any]:
    # [control]
    from ojs_kombu import ControlClient

    with ControlClient(broker_url) as ojs:   # or ControlClient(app)
        ojs.cancel(job_id, "email", reason="superseded", cancelled_by="user:ops")
        ojs.cancel(job_id, "email", terminate=True)    # also kill a running job's process
        ojs.info(job_id, "email", timeout=5)
        # {"job_id": ..., "state": "active", "worker_id": "celery@host", "attempt": 1}
        ojs.info_many([(id1, "email"), (id2, "reports")])
    # [/control]
    return [ojs]


def dead_letters(app: Celery, job_id: str) -> None:
    # [dead-letters]
    with ojs_kombu.dead_letter_queue(app, "email") as dlq:
        len(dlq)                      # how many
        for dead in dlq.list():       # nothing is consumed
            print(dead.key, dead.task_id, dead.error_code, dead.error_type,
                  dead.error_message, dead.problems)
        dlq.get(job_id)               # by job id, Celery task id or key; DeadLetterNotFound
        dlq.replay(job_id)            # back on its queue
        dlq.replay_all()              # every one, in order
        dlq.purge()
    # [/dead-letters]


def delete_exchanges(broker_url: str, prefix: str = "") -> list[str]:
    # [delete-exchanges]
    # After a rollback: the ojs.exchange.* exchanges of a vhost, deleted once no OJS
    # worker or producer runs (they hold no message; RabbitMQ keeps them until deleted).
    import kombu

    from ojs_kombu.spec.naming import TopologyNames

    names = TopologyNames(prefix=prefix)     # your app's ojs_prefix, if any
    exchanges = names.exchanges()
    with kombu.Connection(broker_url) as connection:  # ojs://, ojss:// or amqp://
        channel = connection.channel()
        for exchange in exchanges:
            channel.exchange_delete(exchange)  # a missing exchange is no error
    # [/delete-exchanges]
    return exchanges
