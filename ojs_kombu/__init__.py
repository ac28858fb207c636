"""ojs_kombu: Celery tasks as Open Job Spec (OJS) jobs on RabbitMQ.

::

    app = Celery("proj", broker="ojs://guest:guest@localhost:5672//")
    ojs_kombu.install(app)

Importing the package registers the ``ojs://`` (and ``ojss://``) kombu
transport and the ``ojs`` serializer for ``application/openjobspec+json``.
"""

from __future__ import annotations

from .amqp.transport import register_transport
from .celery.serialization import register_serializer
from .events.observer import Observer
from .spec.envelope import CONTENT_TYPE, JobEnvelope, RetryPolicy
from .spec.errors import (
    AppNotInstalledError,
    BatchPublishError,
    BatchQueueFullError,
    BatchQueueFullNacked,
    BatchQueueFullRefused,
    BrokerCertificateError,
    BrokerTLSError,
    DeadLetterNotFound,
    DedupNotConfigured,
    DedupUnavailable,
    DeferredPublishError,
    DuplicateJobError,
    InvalidJobIdError,
    JobEncodeError,
    JobNackedError,
    JobOptionError,
    JobPublishError,
    JobRejected,
    JobRoutingError,
    JobTooLargeError,
    JobTypeError,
    NonJSONArgumentError,
    OJSConfigurationError,
    OJSError,
    PublishConfirmTimeout,
    QueueFullError,
    QueueFullNacked,
    QueueFullRefused,
    QueueNameError,
    TopologyConflictError,
    TopologyPermissionError,
    UnroutableJobError,
    UnsupportedDependencyError,
    UnsupportedSerializerError,
)
from .spec.job_ids import new_job_id
from .spec.naming import TopologyNames

register_transport()
register_serializer()

from .amqp.broker.connection import BrokerConnection  # noqa: E402
from .amqp.broker.control import ControlClient  # noqa: E402
from .amqp.broker.dead_letters import DeadLetter, DeadLetterQueue  # noqa: E402
from .amqp.publishing.deferred import flush_confirms  # noqa: E402
from .celery.app import install, needs_install  # noqa: E402  (needs the registrations)
from .celery.batch import enqueue_many  # noqa: E402
from .celery.dead_letters import dead_letter_queue  # noqa: E402
from .celery.events import add_observer, remove_observer, subscribe  # noqa: E402
from .celery.preflight import check_app  # noqa: E402
from .celery.probes import register_conformance_probes  # noqa: E402
from .celery.task import OJSTask  # noqa: E402
from .celery.topology import declare_topology  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "CONTENT_TYPE",
    "AppNotInstalledError",
    "BatchPublishError",
    "BatchQueueFullError",
    "BatchQueueFullNacked",
    "BatchQueueFullRefused",
    "BrokerCertificateError",
    "BrokerConnection",
    "BrokerTLSError",
    "ControlClient",
    "DeadLetter",
    "DeadLetterNotFound",
    "DeadLetterQueue",
    "DedupNotConfigured",
    "DedupUnavailable",
    "DeferredPublishError",
    "DuplicateJobError",
    "InvalidJobIdError",
    "JobEncodeError",
    "JobEnvelope",
    "JobNackedError",
    "JobOptionError",
    "JobPublishError",
    "JobRejected",
    "JobRoutingError",
    "JobTooLargeError",
    "JobTypeError",
    "NonJSONArgumentError",
    "OJSConfigurationError",
    "OJSError",
    "OJSTask",
    "Observer",
    "PublishConfirmTimeout",
    "QueueFullError",
    "QueueFullNacked",
    "QueueFullRefused",
    "QueueNameError",
    "RetryPolicy",
    "TopologyConflictError",
    "TopologyNames",
    "TopologyPermissionError",
    "UnroutableJobError",
    "UnsupportedDependencyError",
    "UnsupportedSerializerError",
    "add_observer",
    "check_app",
    "dead_letter_queue",
    "declare_topology",
    "enqueue_many",
    "flush_confirms",
    "install",
    "needs_install",
    "new_job_id",
    "register_conformance_probes",
    "remove_observer",
    "subscribe",
]
