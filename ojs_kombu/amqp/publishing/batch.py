"""Batch PUSH (section 5): many jobs as pipelined, mandatory publishes on one channel.

The batch is admitted as a whole by the backpressure monitor, then written a
few publishes at a time (:data:`BATCH_WRITE`) with at most ``2 * window`` in
flight; every job the broker refused, returned or left unconfirmed is named
in one :class:`~ojs_kombu.spec.errors.BatchPublishError`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from amqp.exceptions import RecoverableConnectionError

from ...spec.encode import OutgoingJob
from ...spec.errors import BatchPublishError
from ..binding import Binding
from .ledger import Publish
from .publisher import JobPublisher

#: Publishes of a batch sent before reading confirms (at most twice this in flight).
BATCH_WINDOW = 500
#: Publishes of a batch written to the socket in one write (held by the channel's
#: :class:`~ojs_kombu.amqp.publishing.ledger.ConfirmLedger` until then): small enough that the
#: broker starts on a batch while the rest is still being framed (a window in one
#: write left it idle meanwhile, measured about 7 % slower), big enough to spare
#: a syscall per job.
BATCH_WRITE = 64


def publish_batch(publisher: JobPublisher, ojs: Binding, connection: Any,
                  jobs: Sequence[OutgoingJob], *, confirm_timeout: float | None = None,
                  window: int = BATCH_WINDOW,
                  meanwhile: Callable[[], None] | None = None) -> None:
    """Publish ``jobs`` through ``publisher`` (a channel of ``connection``).

    ``meanwhile`` runs once every job is written, before the wait for the last
    confirms: the caller's own work after the batch (its results) overlaps the
    broker's, which is still taking the tail of the batch then.

    Before sending, a bounded ``reject``/``block`` queue that cannot take the
    batch's jobs at its current depth (or whose circuit breaker is open)
    refuses the whole batch: :class:`BatchQueueFullError`, nothing sent
    (backpressure section 9.3).  Returns once the broker confirmed every job,
    else raises :class:`BatchPublishError` (:class:`BatchQueueFullError` when a
    full queue nacked some) naming each job that was refused, returned or left
    unconfirmed (no partial success goes unreported, nothing is retried).
    """
    publisher.confirm_mode()
    names = ojs.names
    ledger = publisher.ledger
    tracked: list[Publish] = []
    limit = confirm_timeout or ojs.settings.confirm_timeout
    if not connection:
        raise RecoverableConnectionError("publish_jobs: connection closed")
    for queue in dict.fromkeys(job.queue for job in jobs):
        connection.ensure_topology(queue)  # before its depth is read
    admission = ojs.backpressure.admit_batch(jobs, connection.queue_depth)
    try:
        try:
            for index, job in enumerate(jobs):
                queue = job.queue
                exchange, routing_key, mandatory = names.direct_exchange, queue, True
                if job.delay_ms > 0:
                    exchange, routing_key, mandatory = publisher.route_scheduled(
                        job.properties, job.job_id, queue, job.delay_ms)
                publisher.announce(job)
                window_full = index % window == window - 1
                tracked.append(publisher.write(
                    job.body, job.properties, exchange, routing_key, mandatory, None,
                    job_id=job.job_id, queue=queue,
                    hold=not (window_full or index % BATCH_WRITE == BATCH_WRITE - 1)))
                if window_full and not publisher.wait_outstanding(window, limit):
                    break  # the broker stopped confirming: send no more
            else:
                if meanwhile is not None:
                    ledger.flush()  # written before the caller's work, not after it
                    meanwhile()
            publisher.wait_outstanding(0, limit)
        finally:
            ledger.flush()  # numbered: written, so the broker's numbers stay the ledger's
            for entry in tracked:
                ledger.forget(entry)
        outcome = tracked
        nacked = {p.job_id for p in outcome if p.nacked}
        admission.settle(nacked, connection.queue_depth)
    finally:
        admission.release()  # no answer from the broker: no verdict for the breakers
    confirmed = Counter(p.queue for p in outcome
                        if p.settled and not p.nacked and p.returned is None)
    for queue, count in confirmed.items():
        ojs.hook.message_published(queue, count)
    failed = [p for p in outcome if not p.settled or p.nacked or p.returned is not None]
    unsent = [job.job_id for job in jobs[len(outcome):]]
    if failed or unsent:
        raise ojs.backpressure.batch_error(jobs, _batch_error(outcome, failed, unsent, limit),
                                           nacked, connection.queue_depth)


def _batch_error(tracked: list[Publish], failed: list[Publish],
                 unsent: list[str], limit: float) -> BatchPublishError:
    rejected = {
        p.job_id: (f"returned by the broker ({p.returned}): no queue bound for {p.queue!r}"
                   if p.returned is not None else f"refused by the broker (Basic.Nack), "
                   f"queue {p.queue!r}")
        for p in failed if p.settled
    }
    unconfirmed = tuple(p.job_id for p in failed if not p.settled)
    accepted = tuple(p.job_id for p in tracked if p.settled and not p.nacked
                     and p.returned is None)
    parts = [f"{job_id}: {reason}" for job_id, reason in rejected.items()]
    parts += [f"{job_id}: no confirm within {limit}s (may or may not be enqueued)"
              for job_id in unconfirmed]
    parts += [f"{job_id}: not sent (the broker stopped confirming)" for job_id in unsent]
    rejected.update((job_id, "not sent (the broker stopped confirming)") for job_id in unsent)
    total = len(tracked) + len(unsent)
    return BatchPublishError(
        f"{len(failed) + len(unsent)} of {total} jobs were not accepted: " + "; ".join(parts),
        rejected=rejected, unconfirmed=unconfirmed, accepted=accepted,
    )
