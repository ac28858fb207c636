"""Typed exceptions raised by ojs_kombu.

Every error a caller can see names the thing that is wrong (job id, queue,
task, argument) so that a log line is enough to act on it.  None of them
subclasses kombu's or py-amqp's connection/channel errors: kombu's
``ensure()`` retries those, and a malformed job must never be retried.

The tree, rooted at :class:`OJSError` (a second base where callers catch the
builtin: ``LookupError``, ``TimeoutError``, ``ValueError``)::

    OJSConfigurationError    JobTypeError, QueueNameError, TopologyConflictError,
                             TopologyPermissionError, BrokerTLSError
                             (BrokerCertificateError),
                             RetryPolicyError, DedupNotConfigured,
                             UnsupportedDependencyError
    JobPublishError
      JobEncodeError         nothing was sent: NonJSONArgumentError (also kombu's
                             EncodeError), InvalidJobIdError,
                             UnsupportedSerializerError, JobRoutingError,
                             JobOptionError, JobTooLargeError
      UnroutableJobError     the broker returned it
      JobNackedError         the broker nacked it
      PublishConfirmTimeout  no answer: the outcome is unknown
      BatchPublishError      some jobs of a batch were not accepted
      DuplicateJobError      a unique job conflicts (``on_conflict: reject``)
      QueueFullError         a bounded queue cannot take it (the 429):
        QueueFullNacked        the broker nacked it (a JobNackedError too)
        QueueFullRefused       the producer sent nothing (circuit breaker open)
        BatchQueueFullError    a batch (a BatchPublishError too):
          BatchQueueFullNacked   the broker nacked part of it
          BatchQueueFullRefused  refused whole, nothing sent
    JobRejected              a consumed message is no runnable job
    DedupUnavailable         the unique/idempotency store did not answer
    DeadLetterNotFound       (LookupError)
    ControlError             ControlTimeout (TimeoutError), ControlForbidden
    BrokerBackingOff         an on-demand connection waits out its reconnect backoff
    InvalidEventData, InvalidEventMessage   (ValueError)

Every one pickles with its message and attributes (:class:`Picklable`): Celery's
prefork pool sends what a task raised to the worker's main process.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kombu.exceptions import EncodeError


def _rebuilt(cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]
             ) -> BaseException:
    """An exception :meth:`Picklable.__reduce__` wrote, back without calling its
    ``__init__`` (whose parameters are not its ``args``)."""
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class Picklable:
    """Mixin of an exception whose ``__init__`` takes other arguments than it passes
    to ``Exception``: pickling (the default re-calls ``cls(*self.args)``) keeps its
    message and attributes instead.  Celery's prefork pool pickles what a task raised
    (also inside ``Reject`` and ``Retry``) to the worker's main process; an exception
    that fails to unpickle there stops the worker consuming."""

    args: tuple[Any, ...]

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuilt, (type(self), self.args, dict(vars(self)))


class OJSError(Picklable, Exception):
    """Base class of every ojs_kombu error."""


class OJSConfigurationError(OJSError):
    """The Celery app, transport options or a queue definition is unusable."""


class JobTypeError(OJSConfigurationError):
    """A Celery task name cannot be mapped onto an OJS job ``type``."""

    def __init__(self, task_name: str, reason: str) -> None:
        self.task_name = task_name
        super().__init__(
            f"task {task_name!r} has no valid OJS job type: {reason}. "
            "Give it one with @app.task(ojs_type='domain.action') or "
            "app.conf.ojs_job_types = {task_name: 'domain.action'}"
        )


class QueueNameError(OJSConfigurationError):
    """A Celery queue name cannot be mapped onto an OJS queue name."""

    def __init__(self, queue: str, reason: str) -> None:
        self.queue = queue
        super().__init__(
            f"queue {queue!r} cannot be an OJS queue: {reason}. "
            "Rename it or map it with app.conf.ojs_queue_aliases = "
            f"{{{queue!r}: 'ojs-name'}}"
        )


class TopologyConflictError(OJSConfigurationError):
    """The broker already holds an entity with different properties (406)."""

    def __init__(
        self, kind: str, name: str, declared: Mapping[str, Any], broker_reply: str
    ) -> None:
        self.kind = kind
        self.name = name
        self.declared = dict(declared)
        self.broker_reply = broker_reply
        super().__init__(
            f"{kind} {name!r} already exists with different properties; "
            f"ojs_kombu declares it with {self.declared!r}. Broker said: {broker_reply}. "
            "ojs_kombu never redeclares it: delete the entity or align its arguments."
        )


class TopologyPermissionError(OJSConfigurationError):
    """The broker user lacks a permission on an OJS exchange or queue (403)."""

    def __init__(self, kind: str, name: str, permission: str, broker_reply: str) -> None:
        self.kind = kind
        self.name = name
        self.permission = permission
        self.broker_reply = broker_reply
        super().__init__(
            f"the broker user lacks the {permission!r} permission on {kind} {name!r}. "
            f"Broker said: {broker_reply}. Grant it (docs/production.rst gives the "
            "permissions of a producer, a worker and an operator), or let a user that has "
            "it declare the topology (ojs-kombu topology declare)."
        )


class BrokerTLSError(OJSConfigurationError):
    """The TLS handshake with the broker failed in a way no retry mends: a certificate
    either side refuses, a port that does not speak TLS (or a TLS port spoken to in
    plain AMQP), the client's own certificate files.  kombu and Celery do not retry
    it: a worker stops at start, a producer and ``ojs-kombu`` raise at once.
    ``kind`` says which (``client_certificate_required``, ``client_certificate_rejected``,
    ``client_certificate_expired``, ``client_certificate_unusable``, ``hostname_mismatch``,
    ``server_certificate_untrusted``, ``server_certificate_expired``,
    ``server_certificate_not_yet_valid``, ``handshake_refused``, ``not_tls``,
    ``tls_port``)."""

    def __init__(self, host: str, port: int | None, reason: str,
                 kind: str = "handshake_refused") -> None:
        self.host = host
        self.port = port
        self.reason = reason
        self.kind = kind
        where = f"{host}:{port}" if port is not None else host
        super().__init__(f"TLS with the broker at {where} failed for good ({kind}): "
                         f"{reason}. {self.advice}")

    advice = ("Retrying cannot help: check broker_use_ssl (certfile and keyfile: a client "
              "certificate the broker's CA signed, not expired) and the URL's scheme and port.")


class BrokerCertificateError(BrokerTLSError):
    """The broker's TLS certificate failed verification: retrying cannot help."""

    advice = ("Check broker_use_ssl: ca_certs (the CA that signed the broker's certificate) "
              "and the URL's host (or server_hostname: a name the certificate holds).")

    def __init__(self, host: str, reason: str, port: int | None = None,
                 kind: str = "server_certificate_untrusted") -> None:
        super().__init__(host, port, reason, kind)


class AppNotInstalledError(OJSConfigurationError):
    """A Celery app names an ``ojs://`` broker but ``ojs_kombu.install(app)`` never ran on
    it: its task messages would be plain Celery messages on a queue no OJS worker
    reads, and its worker would read a queue no OJS producer fills."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"{what} on an ojs:// broker, but ojs_kombu.install(app) was not called on "
            "the Celery app: call ojs_kombu.install(app) right after app = Celery(...) "
            "(a worker: in the module -A names; tests with celery.contrib.pytest's "
            "fixtures: load the pytest plugin with -p ojs_kombu.testing)")


class RetryPolicyError(OJSConfigurationError):
    """A retry policy does not validate against ``retry-policy.schema.json``."""


class DedupNotConfigured(OJSConfigurationError):
    """A job asks for ``unique`` or an idempotency key and the app has no ``ojs_dedup_url``:
    refused rather than published without the guarantee it asked for."""


class UnsupportedDependencyError(OJSConfigurationError):
    """An installed py-amqp, kombu, Celery or OpenTelemetry lacks a private member
    ojs_kombu relies on (:mod:`ojs_kombu.spec.seams`); raised at start, naming each."""


class DedupUnavailable(OJSError):
    """The store of unique records and idempotency keys did not answer."""


class JobPublishError(OJSError):
    """A job could not be published; nothing, or an uncertain outcome, reached the broker."""

    def __init__(self, message: str, *, job_id: str | None = None, queue: str | None = None):
        self.job_id = job_id
        self.queue = queue
        super().__init__(message)


class JobEncodeError(JobPublishError):
    """The job cannot be written as an OJS envelope; nothing was sent."""


class NonJSONArgumentError(JobEncodeError, EncodeError):
    """A value of the call (an argument, a keyword argument, a header) has no JSON form:
    nothing was sent.  A kombu ``EncodeError`` too, as plain Celery raises for it;
    ``path`` names the value as the caller wrote it (``args[1]``,
    ``kwargs['order']['id']``)."""

    def __init__(self, message: str, *, job_id: str | None = None, queue: str | None = None,
                 path: str | None = None) -> None:
        self.path = path
        super().__init__(message, job_id=job_id, queue=queue)


class InvalidJobIdError(JobEncodeError):
    """A caller-supplied task id is not a lowercase UUIDv7; nothing was sent."""


class UnsupportedSerializerError(JobEncodeError):
    """The task was serialized with something other than JSON; nothing was sent."""


class JobRoutingError(JobEncodeError):
    """The task was routed somewhere the OJS binding cannot deliver; nothing was sent."""


class JobOptionError(JobEncodeError):
    """A call option cannot become an OJS envelope attribute (a time limit, a priority);
    nothing was sent.  :attr:`option` names the option, :attr:`task_name` the task."""

    def __init__(self, message: str, *, option: str, task_name: str | None = None,
                 job_id: str | None = None, queue: str | None = None) -> None:
        self.option = option
        self.task_name = task_name
        super().__init__(message, job_id=job_id, queue=queue)


class JobTooLargeError(JobEncodeError):
    """The encoded job is larger than ``ojs_max_job_bytes`` (RabbitMQ refuses bodies over
    its ``max_message_size``); nothing was sent.  :attr:`size` and :attr:`limit` are in
    bytes."""

    def __init__(self, message: str, *, size: int, limit: int, job_id: str | None = None,
                 queue: str | None = None) -> None:
        self.size = size
        self.limit = limit
        super().__init__(message, job_id=job_id, queue=queue)


class UnroutableJobError(JobPublishError):
    """The broker returned the job (``Basic.Return``): no queue is bound for it."""


class JobNackedError(JobPublishError):
    """The broker refused the job with ``Basic.Nack``; it was not enqueued."""


class PublishConfirmTimeout(JobPublishError):
    """No confirm arrived in time: the job may or may not be enqueued."""


class DuplicateJobError(JobPublishError):
    """A unique job (``on_conflict: reject``) conflicts with a job already enqueued or
    running within the policy's period and states; nothing was sent.
    ``existing_job_id`` names that job."""

    def __init__(self, message: str, *, existing_job_id: str, fingerprint: str,
                 job_id: str | None = None, queue: str | None = None) -> None:
        self.existing_job_id = existing_job_id
        self.fingerprint = fingerprint
        super().__init__(message, job_id=job_id, queue=queue)


class BatchPublishError(JobPublishError):
    """Some jobs of a batch were not accepted; the message lists every one of them.

    ``rejected`` maps each job id the broker refused (``Basic.Nack``) or returned
    (unroutable) to the reason; ``unconfirmed`` lists the ids with no confirm in
    time (they may or may not be enqueued); ``accepted`` lists the ids the broker
    confirmed, in the order given.  Nothing was retried.
    """

    def __init__(self, message: str, *, rejected: dict[str, str],
                 unconfirmed: tuple[str, ...], accepted: tuple[str, ...]) -> None:
        self.rejected = rejected
        self.unconfirmed = unconfirmed
        self.accepted = accepted
        super().__init__(message)


class DeferredPublishError(BatchPublishError):
    """Jobs published without waiting for their confirms (``ojs_publish_confirms =
    "deferred"``) that were not accepted: raised by the next publish on the same
    channel or by ``ojs_kombu.flush_confirms()`` when no ``ojs_on_publish_error`` takes
    them.  ``rejected`` maps each job the broker returned, or still refused after its
    re-sends, to the reason; ``unconfirmed`` lists those whose confirm never came (they
    may or may not be enqueued).  ``errors`` holds each job's own error."""

    def __init__(self, message: str, *, errors: tuple[JobPublishError, ...],
                 rejected: dict[str, str], unconfirmed: tuple[str, ...]) -> None:
        self.errors = errors
        super().__init__(message, rejected=rejected, unconfirmed=unconfirmed, accepted=())


class QueueFullError(JobPublishError):
    """Backpressure (BP-002, HTTP 429 on AMQP): a bounded queue cannot take the job; it
    was not enqueued and may be published again after :attr:`retry_after` seconds.

    Raised as a leaf that says whether anything reached the broker:
    :class:`QueueFullNacked` (the broker nacked it) or :class:`QueueFullRefused`
    (the producer sent nothing); a batch raises a :class:`BatchQueueFullError`.
    ``depth`` is the queue's message count read at the refusal (``None`` when it
    could not be read), ``bound`` the ``max_depth`` (or, for a size bound only,
    ``max_size_bytes``) it hit.  ``circuit_open`` is true when the producer's
    circuit breaker refused the job.  ``rejected`` is ``(job_id,)``.
    """

    code = "QUEUE_FULL"

    def __init__(self, message: str, *, queue: str, job_id: str | None = None,
                 depth: int | None = None, bound: int | None = None,
                 strategy: str = "reject", retry_after: float = 1.0,
                 circuit_open: bool = False, accepted: tuple[str, ...] = ()) -> None:
        self.depth = depth
        self.bound = bound
        self.strategy = strategy
        self.retry_after = retry_after
        self.circuit_open = circuit_open
        self.rejected = (job_id,) if job_id else ()
        self.accepted = tuple(accepted)
        # Not super(): in a BatchQueueFullError the next class is not JobPublishError.
        JobPublishError.__init__(self, message, job_id=job_id, queue=queue)

    def to_dict(self) -> dict[str, Any]:
        """The section 7.1 error body, for callers that relay it (e.g. an HTTP 429)."""
        return {"code": self.code, "message": str(self), "queue": self.queue,
                "depth": self.depth, "bound": self.bound, "strategy": self.strategy,
                "retry_after": self.retry_after}


class QueueFullNacked(QueueFullError, JobNackedError):
    """The broker nacked the job (``reject-publish``): its queue is at its bound."""


class QueueFullRefused(QueueFullError):
    """The producer refused the job without sending it: the queue's circuit breaker
    is open after repeated rejections (section 8.2).  Nothing reached the broker."""


class BatchQueueFullError(QueueFullError, BatchPublishError):
    """A batch (``enqueue_many``) that a bounded queue cannot take, raised as
    :class:`BatchQueueFullRefused` (nothing was sent) or
    :class:`BatchQueueFullNacked` (the broker nacked part of it).

    It is both errors at once, so ``except QueueFullError`` (429 handling:
    ``queue``, ``depth``, ``bound``, ``strategy``, ``retry_after``,
    ``circuit_open``, ``to_dict()``) and ``except BatchPublishError`` (which
    jobs to resend) both catch it.  The :class:`BatchPublishError` attributes
    describe the whole batch: :attr:`rejected` maps every job id that was not
    enqueued, of any queue, to why (iterating it gives the ids, in batch
    order), as for any batch.  The :class:`QueueFullError` attributes describe
    the first full queue; the message names every one.
    """

    #: Every job id of the batch that was not enqueued, to why (a batch's ``rejected``).
    rejected: dict[str, str]  # type: ignore[assignment]

    def __init__(self, message: str, *, queue: str, depth: int | None, bound: int | None,
                 strategy: str, retry_after: float, circuit_open: bool = False,
                 rejected: Mapping[str, str], unconfirmed: tuple[str, ...] = (),
                 accepted: tuple[str, ...] = ()) -> None:
        QueueFullError.__init__(self, message, queue=queue, depth=depth, bound=bound,
                                strategy=strategy, retry_after=retry_after,
                                circuit_open=circuit_open, accepted=accepted)
        self.rejected = dict(rejected)
        self.unconfirmed = tuple(unconfirmed)


class BatchQueueFullNacked(BatchQueueFullError, QueueFullNacked):
    """The broker nacked jobs of a sent batch because their queue is at its bound;
    :attr:`accepted` names the jobs that are enqueued (the check before sending is
    not atomic: another producer filled the queue meanwhile)."""


class BatchQueueFullRefused(BatchQueueFullError, QueueFullRefused):
    """The batch was refused whole before anything was sent (section 9.3): a bounded
    queue's jobs do not fit under its ``max_depth`` (after waiting up to
    ``block_timeout`` on a ``block`` queue), or its circuit breaker is open."""


class JobRejected(OJSError):
    """A consumed message is not a runnable OJS job; it is dead-lettered with ``code``."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(f"{code}: {message}")


class DeadLetterNotFound(OJSError, LookupError):
    """No dead letter with that job id."""


class ControlError(OJSError):
    """A control request (CANCEL, INFO) could not be made."""


class ControlTimeout(ControlError, TimeoutError):
    """No answer to an INFO request in time."""


class ControlForbidden(ControlError):
    """A worker refused an INFO request: the requester's broker user is not
    authorised for the queue (``ojs_control_users``)."""


class BrokerBackingOff(OJSError):
    """A connection opened on demand (queue-depth gauges, the AMQP event sink, control,
    dead letters) is not tried again before its backoff (section 11.3) is over: its
    last attempt failed; ``retry_in`` seconds are left."""

    def __init__(self, broker: str, purpose: str, retry_in: float) -> None:
        super().__init__(f"not connecting to {broker} for {purpose} yet: the last attempt "
                         f"failed; next attempt in {retry_in:.1f}s")
        self.broker = broker
        self.purpose = purpose
        self.retry_in = retry_in


class InvalidEventData(OJSError, ValueError):
    """``data`` does not conform to the section 4 schema of its event type."""

    def __init__(self, event_type: str, errors: list[dict[str, Any]], detail: str = "") -> None:
        self.event_type = event_type
        #: pydantic-style error dicts (``loc`` relative to ``data``, ``type``, ``msg``).
        self.errors = errors
        self.detail = detail or "; ".join(
            f"{'.'.join(['data', *map(str, e['loc'])])}: {e['msg']}" for e in errors
        )
        super().__init__(f"invalid data for {event_type!r} event: {self.detail}")


class InvalidEventMessage(OJSError, ValueError):
    """A message on the events exchange whose body is not an event or a batch of events."""
