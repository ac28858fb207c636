"""The ``solo`` pool's job acks, written before each delivery instead of after the next job."""

from __future__ import annotations

from typing import Any

from celery import bootsteps

from ..amqp.job_channel import JobConnection


class InlineJobAcks(bootsteps.StartStopStep):
    """Consumer bootstep: with the ``solo`` pool a job runs inside its delivery, in the
    event loop, so the transport writes the acks it collected before each delivery
    (a finished job's ack never waits for the next job; see :mod:`ojs_kombu.amqp.wire.acks`)."""

    name = "ojs_kombu.inline_job_acks"
    requires = ("celery.worker.consumer.connection:Connection",)

    def start(self, parent: Any) -> None:
        from celery.concurrency.solo import TaskPool as SoloPool

        connection = parent.connection.connection
        if isinstance(connection, JobConnection):
            connection.ojs_jobs_run_in_loop = isinstance(parent.pool, SoloPool)
