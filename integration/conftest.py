"""Fixtures for the integration suite: a private RabbitMQ vhost and a real worker."""

from __future__ import annotations

import fcntl
import functools
import json
import os
import re
import shlex
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import amqp
import celery
import pytest
from amqp.exceptions import AMQPError, NotFound
from celery import Celery

import ojs_kombu

from . import management
from .apps import WORKER_QUEUES, make_app
from .workers import WorkerProcess, in_process_worker, launch_worker


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "broker_wide(name): the module changes broker-wide state NAME; modules "
        "that name the same state never run at the same time against one broker")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the tests that start an in-process worker of their own before any test
    starts the session's worker.

    Two in-process Celery workers in one process share Celery's worker globals:
    once a second one has stopped, the session worker stops taking jobs.  Tests
    outside this directory keep their place.  Under xdist (setup.cfg: ``-n auto``)
    each xdist worker is such a process: it takes whole modules, in this order
    (conftest.py), so the rule holds in each of them.
    """
    here = Path(__file__).parent

    def rank(item: pytest.Item) -> float:
        if here not in Path(item.path).parents:
            return 0
        module = item.module
        if getattr(module, "in_process_worker", None) is in_process_worker:
            return 1
        # then the modules that run a RabbitMQ node of their own (rabbitmq_node.py's
        # TLSNode, theirs or test_tls's), the longest to set up, and the modules that
        # say they take minutes (XDIST_LONG): under xdist they start first, not last
        node_type = getattr(getattr(module, "TLSNode", None), "__module__", "")
        if node_type.endswith(".rabbitmq_node"):
            return 1.5
        return 1.7 if getattr(module, "XDIST_LONG", False) is True else 2

    items.sort(key=rank)


HOST = os.environ.get("OJS_TEST_RABBITMQ_HOST", "127.0.0.1")
PORT = int(os.environ.get("OJS_TEST_RABBITMQ_PORT", "5672"))
#: The broker's Erlang node for ``rabbitmqctl -n`` (empty: rabbitmqctl's default).
NODE = os.environ.get("OJS_TEST_RABBITMQ_NODE", "")
#: A command prefix under which RabbitMQ's own programs run (``rabbitmqctl``,
#: ``rabbitmq-server``): ``.ci/rabbitmq4 exec`` runs them in the RabbitMQ 4.x root.
RABBITMQ_EXEC = shlex.split(os.environ.get("OJS_RABBITMQ_EXEC", ""))


def rabbitmqctl_command(*args: str, node: str = NODE) -> list[str]:
    """The argv of ``rabbitmqctl -q [-n node] ARGS`` for the broker under test."""
    return [*RABBITMQ_EXEC, "rabbitmqctl", "-q", *(["-n", node] if node else []), *args]


#: What rabbitmqctl prints when it could not reach a node in time (its Erlang
#: distribution handshake), which a node that is up answers when asked again: seen
#: on 2 loaded cores with the node up and its 'rabbit' application running.
UNREACHED = "unable to perform an operation on node"


def run_rabbitmqctl(*args: str, node: str = NODE, attempts: int = 3) -> str:
    """``rabbitmqctl -q [-n node] ARGS``' output; asked again (up to ``attempts``) only
    when the CLI could not reach the node, any other failure raised at once."""
    for attempt in range(1, attempts + 1):
        result = subprocess.run(rabbitmqctl_command(*args, node=node), capture_output=True,
                                text=True, timeout=120, check=False)
        if result.returncode == 0:
            return result.stdout
        if UNREACHED not in result.stderr or attempt == attempts:
            break
        time.sleep(2)
    named = f" -n {node}" if node else ""
    raise RuntimeError(f"rabbitmqctl{named} {' '.join(args)} failed: {result.stderr.strip()}")


def rabbitmqctl(*args: str) -> str:
    """``rabbitmqctl -q ARGS`` on the broker under test; its vhost, user and permission
    commands over the management API where it answers (:mod:`integration.management`:
    each ``rabbitmqctl`` costs the machine ~0.6 s of CPU)."""
    if management.administer(args):
        return ""
    return run_rabbitmqctl(*args)


def broker_version() -> tuple[int, ...]:
    """The RabbitMQ version of the broker under test, from its AMQP server properties."""
    probe = amqp.Connection(f"{HOST}:{PORT}", connect_timeout=10)
    probe.connect()
    try:
        version = probe.server_properties.get("version", b"0")
    finally:
        probe.close()
    text = version.decode() if isinstance(version, bytes) else str(version)
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


@functools.cache
def plain_celery_refused() -> str | None:
    """Why plain Celery (``amqp://``) cannot run on the broker under test, or None.

    Celery before 5.6 declares its workers' pidbox queues and its event receivers'
    ``celeryev.*`` queues transient and not exclusive, with no setting to change it;
    a RabbitMQ 4.x node that denies the deprecated ``transient_nonexcl_queues``
    feature (as CI's 4.x nodes do) refuses them, and plain Celery's worker restarts
    for ever.  Tests that run plain Celery beside ojs_kombu skip only that side here.
    """
    from celery.app.defaults import NAMESPACES

    if "queue_exclusive" in NAMESPACES["control"]:  # Celery 5.6+: exclusive by default
        return None
    name = f"ojs-kombu-probe-{uuid.uuid4().hex}"
    with amqp.Connection(f"{HOST}:{PORT}", connect_timeout=10) as probe:
        try:
            probe.channel().queue_declare(name, durable=False, exclusive=False,
                                          auto_delete=True)
        except AMQPError as exc:
            return (f"plain Celery {celery.__version__} declares transient non-exclusive "
                    f"queues, which this broker refuses (transient_nonexcl_queues denied): "
                    f"{exc}")
        probe.channel().queue_delete(name)
    return None


@pytest.fixture(scope="session")
def vhost() -> Iterator[str]:
    """A vhost of this test session only, so the spec's exact names can be used."""
    try:
        probe = amqp.Connection(f"{HOST}:{PORT}", connect_timeout=5)
        probe.connect()
        probe.close()
    except OSError as exc:
        pytest.fail(f"RabbitMQ is not reachable at {HOST}:{PORT} ({exc}); "
                    "start it with: rabbitmq-server -detached")
    with private_vhost("ojs-kombu-test") as name:
        yield name


@contextmanager
def private_vhost(prefix: str) -> Iterator[str]:
    """A vhost named ``{prefix}-{pid}-{random}`` that guest may use; deleted after."""
    name = f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    rabbitmqctl("add_vhost", name)
    rabbitmqctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
    try:
        yield name
    finally:
        rabbitmqctl("delete_vhost", name)


@pytest.fixture(scope="module", autouse=True)
def broker_wide(request: pytest.FixtureRequest) -> Iterator[None]:
    """Hold the broker's lock for the state a module names with
    ``pytestmark = pytest.mark.broker_wide("NAME")`` while the module runs.

    Everything else a test makes lives in its session's private vhost (one per xdist
    worker), in names it makes unique, or on ports it takes free, so modules run
    side by side; broker-wide state (a ``rabbitmqctl eval`` setting, a policy or
    user of a fixed name) is seen by every module.  The lock is a file lock per
    broker, so it also keeps apart two suites run at once on one machine against
    the same broker (CI runs two on RabbitMQ 3.10).
    """
    marker = request.node.get_closest_marker("broker_wide")
    if marker is None:
        yield
        return
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{HOST}-{PORT}-{marker.args[0]}")
    with open(Path(tempfile.gettempdir()) / f"ojs-kombu-broker-wide-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


@pytest.fixture(scope="session")
def broker_url(vhost: str) -> str:
    return f"ojs://guest:guest@{HOST}:{PORT}/{vhost}"


@pytest.fixture(scope="session")
def events_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("events") / "events.jsonl"


@pytest.fixture(scope="session")
def app(broker_url: str, events_file: Path) -> Celery:
    session_app = make_app("integration", broker_url, "cache+memory://",
                           ojs_queue_arguments={"full": {"x-max-length": 0,
                                                         "x-overflow": "reject-publish"}},
                           ojs_event_sinks=["amqp", f"file:{events_file}"])
    ojs_kombu.register_conformance_probes(session_app)  # what ojs-kombu conformance sends
    return session_app


@pytest.fixture(scope="session")
def worker(app: Celery) -> Iterator[Any]:
    """One in-process worker (thread pool) for the session, consuming: each stop
    costs ~10 s."""
    with in_process_worker(app, WORKER_QUEUES, concurrency=4) as w:
        yield w


class WorkerLauncher:
    """What the ``worker_launcher`` fixture gives: ``worker_launcher(app, queues, ...)``
    is :func:`integration.workers.launch_worker` on the session's broker URL (or
    ``broker_url=``), and the session stops whatever a test left running."""

    def __init__(self, broker_url: str) -> None:
        self.broker_url = broker_url
        self.started: list[WorkerProcess] = []

    def __call__(self, app: str, queues: str | Sequence[str], *,
                 broker_url: str | None = None, **options: Any) -> WorkerProcess:
        worker = launch_worker(broker_url or self.broker_url, app, queues, **options)
        self.started.append(worker)
        return worker


@pytest.fixture(scope="session")
def worker_launcher(broker_url: str) -> Iterator[WorkerLauncher]:
    """Starts ``celery -A APP worker`` subprocesses, each returned once it consumes its
    job queues (integration/workers.py)."""
    launcher = WorkerLauncher(broker_url)
    yield launcher
    for started in launcher.started:
        started.stop()


@pytest.fixture
def amqp_channel(vhost: str) -> Iterator[amqp.Channel]:
    """A raw py-amqp channel on the test vhost: what a non-Celery OJS client sees."""
    connection = amqp.Connection(f"{HOST}:{PORT}", virtual_host=vhost)
    connection.connect()
    try:
        yield connection.channel()
    finally:
        connection.close()


def publish_raw(channel: amqp.Channel, message: amqp.Message, routing_key: str,
                exchange: str = "ojs.exchange.direct") -> None:
    """Publish as a client without ojs_kombu must: confirmed and ``mandatory``.  A
    publish no binding routes is returned (py-amqp raises it here) instead of being
    confirmed and dropped by the broker."""
    channel.basic_publish_confirm(message, exchange=exchange, routing_key=routing_key,
                                  mandatory=True)


def queue_depth(channel: amqp.Channel, queue: str) -> int:
    return channel.queue_declare(queue, passive=True).message_count


def queue_counts(vhost: str, queue: str, *, address: str = f"{HOST}:{PORT}",
                 ssl: dict[str, Any] | None = None) -> tuple[int, int] | None:
    """``(ready messages, consumers)`` of ``queue`` as a passive ``Queue.Declare`` tells
    any AMQP client, or ``None`` when ``vhost`` has no such queue (on the broker under
    test, else at ``address``, over TLS with ``ssl``).  On a connection of its own (a
    404 closes the channel), and cheap enough to poll: a ``rabbitmqctl`` call starts an
    Erlang VM (~0.7 s of CPU), so waits ask it only what AMQP cannot tell (unacked
    counts, prefetch, connections), and at an ``interval``."""
    connection = amqp.Connection(address, virtual_host=vhost, connect_timeout=10,
                                 ssl=ssl or False)
    connection.connect()
    try:
        declared = connection.channel().queue_declare(queue, passive=True)
        return declared.message_count, declared.consumer_count
    except NotFound:
        return None
    finally:
        connection.close()


def unacked(vhost: str, queue: str) -> int:
    """Messages of ``queue`` delivered and not yet acked or nacked (as the broker sees it)."""
    for line in rabbitmqctl("list_queues", "-p", vhost, "name",
                            "messages_unacknowledged").splitlines():
        name, _, count = line.partition("\t")
        if name == queue:
            return int(count)
    raise AssertionError(f"no queue {queue!r} in vhost {vhost!r}")


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "",
               interval: float = 0.05) -> Any:
    """``predicate()``'s first true value, asked every ``interval`` seconds (a predicate
    that runs ``rabbitmqctl`` waits 1 s or more: each call costs the machine ~0.7 s of
    CPU)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")


def get_message(channel: amqp.Channel, queue: str, timeout: float = 20.0) -> amqp.Message:
    """Take one message off ``queue`` (acked), waiting for it to arrive."""
    message = wait_until(lambda: channel.basic_get(queue), timeout, f"a message on {queue}")
    channel.basic_ack(message.delivery_tag)
    return message


def body_of(message: amqp.Message) -> Any:
    return json.loads(message.body)
