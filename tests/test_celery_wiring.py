"""What install(app) changes, observed through Celery's own objects (no broker)."""

from __future__ import annotations

import json
import multiprocessing
from typing import Any

import pytest
from celery import Celery
from celery.utils import uuid as celery_uuid
from celery.utils.quorum_queues import detect_quorum_queues
from kombu import Connection, Exchange, Queue

import ojs_kombu
from ojs_kombu.amqp.binding import Binding
from ojs_kombu.amqp.broker.entities import JobQueue
from ojs_kombu.amqp.job_channel import JobConnection
from ojs_kombu.amqp.transport import Connection as OJSConnection
from ojs_kombu.amqp.transport import SSLTransport, Transport
from ojs_kombu.celery.app_amqp import OJSAMQP
from ojs_kombu.celery.control import cancel_requested
from ojs_kombu.celery.preflight import OJSPreflight
from ojs_kombu.spec.errors import JobTypeError, OJSConfigurationError, QueueNameError
from ojs_kombu.spec.naming import is_job_id
from ojs_kombu.spec.settings import BINDING_OPTION


def make_app(**conf: Any) -> Celery:
    app = Celery("wiring", broker="ojs://guest:guest@127.0.0.1:5672//", set_as_current=False)
    ojs_kombu.install(app)
    app.conf.update(conf)
    return app


def test_install_replaces_the_amqp_layer_and_is_idempotent() -> None:
    app = make_app()
    assert ojs_kombu.install(app) is app
    assert isinstance(app.amqp, OJSAMQP)


def test_install_after_amqp_was_used_is_a_clear_error() -> None:
    app = Celery("late", broker="ojs://", set_as_current=False)
    _ = app.amqp
    with pytest.raises(OJSConfigurationError, match="right after Celery"):
        ojs_kombu.install(app)


def test_ojs_url_selects_the_ojs_transport() -> None:
    assert Connection("ojs://guest:guest@localhost:5672//").transport_cls == "ojs"
    assert isinstance(Connection("ojs://localhost//").transport, Transport)
    tls = Connection("ojss://localhost//")
    assert isinstance(tls.transport, SSLTransport) and tls.ssl is True
    by_path = Connection("localhost//", transport="ojs_kombu.transport:Transport")
    assert isinstance(by_path.transport, Transport)
    assert Connection("ojs://localhost//", ssl=True).transport.default_ssl_port == 5671


def test_telling_an_ojs_connection_from_another_opens_no_socket() -> None:
    """``isinstance(x, JobConnection)`` is how the DLQ, control and topology tools
    refuse a non-``ojs://`` broker: it must not connect a connection that is not
    connected (port 1 refuses, so a connect would raise)."""
    connection = OJSConnection(host="127.0.0.1:1")
    assert isinstance(connection, JobConnection)
    assert not connection.connected
    connection.collect()  # as after a lost connection
    assert isinstance(connection, JobConnection)
    assert not isinstance(Connection("memory://").connection, JobConnection)


def test_default_queue_is_the_ojs_default_queue() -> None:
    queues = make_app().amqp.queues
    default = queues["celery"]
    assert isinstance(default, JobQueue)
    assert default.name == "ojs.queue.default" and default.ojs_queue == "default"
    assert default.exchange.name == "ojs.exchange.direct" and default.exchange.type == "direct"
    assert default.routing_key == "default"
    assert default.durable and not default.auto_delete and not default.exclusive
    assert default.queue_arguments == {"x-dead-letter-exchange": "ojs.exchange.dlx",
                                       "x-dead-letter-routing-key": "default"}
    assert queues["default"] is default and queues["ojs.queue.default"] is default


def consumed(queues: Any) -> list[str]:
    """The AMQP queues a worker consumes after ``-Q``/``-X``.  The table's keys are
    Celery's own business: 5.7 keys ``consume_from`` by AMQP name, 5.5 and 5.6 by the
    name given to ``select``; the worker consumes the values either way."""
    return [queue.name for queue in queues.consume_from.values()]


def test_missing_queues_become_job_queues_under_every_name() -> None:
    queues = make_app(ojs_prefix="tenant1").amqp.queues
    email = queues["email"]
    assert email.name == "tenant1.ojs.queue.email"
    assert email.exchange.name == "tenant1.ojs.exchange.direct"
    assert queues["tenant1.ojs.queue.email"] is email
    queues.select(["email"])  # what `celery worker -Q email` does
    assert consumed(queues) == ["tenant1.ojs.queue.email"]


def test_configured_celery_queues_are_converted() -> None:
    app = make_app(task_queues=[Queue("reports", Exchange("reports"), routing_key="reports",
                                      max_length=100, queue_arguments={"x-queue-type": "quorum"})])
    reports = app.amqp.queues["reports"]
    assert isinstance(reports, JobQueue) and reports.name == "ojs.queue.reports"
    assert reports.queue_arguments["x-max-length"] == 100
    # Celery must not see quorum queues, or its native delayed delivery takes over countdowns.
    assert "x-queue-type" not in reports.queue_arguments
    assert detect_quorum_queues(app, "amqp") == (False, "")
    assert app.amqp.binding.declare_arguments("reports")["x-queue-type"] == "quorum"


@pytest.mark.parametrize("queue, error", [
    (Queue("Bad_Name"), QueueNameError),
    (Queue("tmp", auto_delete=True), OJSConfigurationError),
    (Queue("dl", queue_arguments={"x-dead-letter-exchange": "mine"}), OJSConfigurationError),
])
def test_unusable_queue_definitions_fail_clearly(queue: Queue, error: type[Exception]) -> None:
    app = make_app(task_queues=[queue])
    with pytest.raises(error, match=queue.name):
        _ = app.amqp.queues


def test_queue_alias_setting() -> None:
    queues = make_app(ojs_queue_aliases={"high_priority": "high-priority"}).amqp.queues
    assert queues["high_priority"].name == "ojs.queue.high-priority"


def test_task_ids_are_uuid7_after_install() -> None:
    make_app()
    assert all(is_job_id(celery_uuid()) for _ in range(5))


def test_delivery_semantics_are_configured() -> None:
    app = make_app(accept_content=["json"])
    assert app.conf.task_acks_late is True
    assert app.conf.task_acks_on_failure_or_timeout is False
    assert "ojs" in app.conf.accept_content
    # per-consumer QoS: Celery's prefetch reduction after a reconnect could not act
    assert app.conf.worker_enable_prefetch_count_reduction is False


def test_connections_carry_the_binding() -> None:
    app = make_app(ojs_prefix="t9")
    connection = app.connection_for_write()
    for options in (connection.transport_options, connection.clone().transport_options):
        binding = Binding.from_options(options)
        assert binding is app.amqp.binding and binding.names.prefix == "t9."
    assert connection.ojs_binding is app.amqp.binding  # counts its reconnections
    other = make_app(ojs_prefix="t8")
    assert Binding.from_options(other.connection_for_write().transport_options) \
        is other.amqp.binding


def test_what_celery_reports_of_an_installed_app_is_json() -> None:
    """``celery inspect stats`` sends the connection's info (transport options
    included), ``inspect conf`` the configuration: both as JSON."""
    app = make_app(broker_transport_options={"confirm_publish": True})
    app.loader.import_default_modules()
    connection = app.connection_for_write()
    info = json.loads(json.dumps(connection.info()))
    assert isinstance(info["transport_options"][BINDING_OPTION], str)
    assert info["transport_options"]["confirm_publish"] is True
    json.dumps(app.conf.table(with_defaults=False))  # what install() and the user set
    assert "Binding" not in app.bugreport()  # ``celery report``


def test_prefork_children_find_the_binding() -> None:
    """Pool processes are forked after the app made its connections' options."""
    app = make_app(ojs_prefix="fork")
    options = app.connection_for_write().transport_options
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        assert pool.apply(_prefix_of_binding, (options,)) == "fork."


def _prefix_of_binding(options: dict[str, Any]) -> str:
    return Binding.from_options(options).names.prefix


def test_unmappable_task_names_fail_at_finalize() -> None:
    app = make_app()

    @app.task(name="proj.tasks.SendEmail", shared=False)
    def send() -> None: ...

    with pytest.raises(JobTypeError, match="proj.tasks.SendEmail"):
        ojs_kombu.check_app(app)
    assert OJSPreflight in app.steps["worker"]  # the same check refuses to start a worker


def test_task_option_and_config_mapping_are_honoured() -> None:
    app = make_app(ojs_job_types={"proj.tasks.Legacy": "legacy.run"})

    @app.task(name="proj.tasks.SendEmail", ojs_type="email.send", shared=False)
    def send() -> None: ...

    @app.task(name="proj.tasks.Legacy", shared=False)
    def legacy() -> None: ...

    assert ojs_kombu.check_app(app)["proj.tasks.SendEmail"] == "email.send"
    registry = app.amqp.binding.job_types
    assert registry.type_for("proj.tasks.SendEmail") == "email.send"
    assert registry.task_for("email.send") == "proj.tasks.SendEmail"
    assert registry.task_for("legacy.run") == "proj.tasks.Legacy"


def test_unknown_ojs_setting_is_reported() -> None:
    app = make_app(ojs_prefx="oops")
    with pytest.raises(OJSConfigurationError, match="ojs_prefx"):
        _ = app.amqp.binding


def test_connection_heartbeat_is_60_seconds_and_a_beat_scheduler_reports_cron_events() -> None:
    app = make_app()
    assert app.conf.broker_heartbeat == 60
    assert app.conf.beat_scheduler == "ojs_kombu.celery.beat:OJSScheduler"
    explicit = make_app(broker_heartbeat=10)
    assert explicit.conf.broker_heartbeat == 10


@pytest.mark.parametrize("option", [{"acks_late": False}, {"acks_on_failure_or_timeout": True},
                                    {"acks_on_failure": True}])
def test_per_task_ack_options_that_would_lose_jobs_are_refused(option: dict[str, bool]) -> None:
    app = make_app()

    @app.task(name="proj.careless", shared=False, **option)
    def careless() -> None: ...

    with pytest.raises(OJSConfigurationError, match="proj.careless"):
        ojs_kombu.check_app(app)


def _task_message(app: Celery, **options: Any) -> Any:
    """The message ``send_task`` builds (it passes these arguments positionally)."""
    return app.amqp.create_task_message(
        ojs_kombu.new_job_id(), "math.add", (1, "secret"), {"k": 2}, None, None, None, None,
        None, 0, None, None, None, "reply", None, None,
        options.pop("create_sent_event", False), None, None, None, None, **options)


def test_reprs_are_left_to_the_consumer_unless_given_or_shown_in_sent_events() -> None:
    app = make_app()
    headers = _task_message(app).headers
    assert "argsrepr" not in headers and "kwargsrepr" not in headers
    given = _task_message(app, argsrepr="(1, '***')").headers
    assert given["argsrepr"] == "(1, '***')" and "kwargsrepr" not in given
    shown = _task_message(app, create_sent_event=True)
    assert shown.headers["argsrepr"] == "(1, 'secret')"
    assert shown.sent_event["kwargs"] == "{'k': 2}"


class _RecordingChannel:
    """Stands in for the ``ojs`` transport's channel: records the jobs published."""

    def __init__(self) -> None:
        self.jobs: list[Any] = []

    def publish_job(self, job: Any, **_: Any) -> None:
        self.jobs.append(job)


class _RecordingProducer:
    """Stands in for kombu's Producer on an ``ojs`` connection: records what it declares."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.channel = _RecordingChannel()
        self.declared: list[Any] = []
        self.serializer = self.exchange = None

    def maybe_declare(self, entity: Any) -> None:
        self.declared.append(entity)


def test_task_queues_are_left_to_the_transport_to_declare() -> None:
    """kombu would re-check the queue's declaration on every publish; the ojs
    transport declares a job queue's topology itself on first use."""
    app = make_app()
    producer = _RecordingProducer(app.connection_for_write())
    send = app.amqp.send_task_message
    send(producer, "tasks.add", _task_message(app), queue="email", retry=False)
    explicit = Queue("audit")
    send(producer, "tasks.add", _task_message(app), queue="email", declare=[explicit],
         retry=False)
    assert producer.declared == [explicit]
    assert [job.queue for job in producer.channel.jobs] == ["email", "email"]


def test_a_cancel_request_of_the_previous_job_does_not_reach_the_next_one() -> None:
    app = make_app()

    @app.task(bind=True, name="wiring.poll")
    def poll(self: Any) -> bool:
        return self.ojs.cancelled

    try:
        cancel_requested.set()  # the pool process's previous job was cancelled
        assert poll.apply().get() is False
        cancel_requested.set()
        # A direct call inside a running job keeps that job's cancel request.
        assert poll() is True
    finally:
        cancel_requested.clear()


def test_the_queue_table_is_keyed_by_the_apps_queue_names_as_in_celery() -> None:
    """Celery's commands pass the table's keys on (``celery purge -Q email``) and its own
    test fixtures expect ``{'celery'}``; ``worker -X`` still deselects by name."""
    app = make_app(task_queues=[Queue("email"), Queue("celery")])
    queues = app.amqp.queues
    assert set(queues) == {"celery", "email"}
    assert queues["email"].name == "ojs.queue.email"
    assert queues["ojs.queue.email"] is queues["email"]
    queues.deselect(["email"])
    assert consumed(queues) == ["ojs.queue.default"]
