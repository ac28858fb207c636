"""TLS that fails: the host name checked by default, failures no retry mends, a broker down.

Against the TLS node of :func:`integration.rabbitmq_node.tls_node` (listeners on
127.0.0.1, which its certificate holds, and 127.0.0.2, which it does not), the
suite's plain broker (TLS spoken to a plain port) and a fake broker: a TLS
server on loopback with a certificate from the node's own CA for another name,
which answers like RabbitMQ (``Connection.Start``, PLAIN) and keeps every byte
a client sends.  Every client uses ``broker_use_ssl`` as docs/production.rst
writes it (CA, client certificate, ``CERT_REQUIRED``, no ``server_hostname``).
Workers are ``celery -A integration.tlsapp worker`` as users start them (prefork,
gossip, mingle, heartbeats and events on); the CLI is the installed ``ojs-kombu``.
"""

from __future__ import annotations

import socket
import ssl
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from amqp.serialization import dumps
from celery import Celery
from kombu.exceptions import OperationalError

from ojs_kombu import BrokerCertificateError, BrokerTLSError
from ojs_kombu.events.observer import Observer

from .apps import make_app
from .conftest import HOST, PORT, wait_until
from .rabbitmq_node import TLSNode, free_port
from .test_tls import ROOT, cli, consumers, node, tls_env
from .workers import launch_worker

__all__ = ["node"]  # the TLS node fixture of test_tls

SECRET = "fake-broker-must-never-see-this"


class FakeBroker:
    """A TLS server on 127.0.0.1 presenting ``rogue-server`` (signed by the node's CA, for
    ``rogue.example``): after a handshake it answers the AMQP header with
    ``Connection.Start`` (PLAIN) and records what the client sends next."""

    def __init__(self, folder: Path) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(folder / "rogue-server.pem", folder / "rogue-server.key")
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.received = bytearray()
        self.handshakes = 0
        self.attempts = 0
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while True:
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return  # closed
            self.attempts += 1
            with raw:
                try:
                    tls = self.context.wrap_socket(raw, server_side=True)
                except (ssl.SSLError, OSError):
                    continue  # the client refused the certificate
                self.handshakes += 1
                tls.settimeout(10)
                try:
                    self.received += tls.recv(8)  # b"AMQP\0\0\x09\x01"
                    args = dumps("ooFSS", [0, 9, {}, "PLAIN AMQPLAIN", "en_US"])
                    payload = struct.pack(">HH", 10, 10) + args
                    tls.sendall(struct.pack(">BHI", 1, 0, len(payload)) + payload + b"\xce")
                    while chunk := tls.recv(4096):
                        self.received += chunk
                except OSError:
                    pass

    def got_password(self) -> bool:
        return SECRET.encode() in bytes(self.received)

    def url(self, scheme: str = "ojss") -> str:
        return f"{scheme}://guest:{SECRET}@127.0.0.1:{self.port}//"

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def fake(node: TLSNode) -> Iterator[FakeBroker]:
    broker = FakeBroker(node.folder)
    try:
        yield broker
    finally:
        broker.close()


class FailedAttempts(Observer):
    """Counts the connection attempts kombu retried (``connection_failed``)."""

    def __init__(self) -> None:
        self.count = 0

    def connection_failed(self, role: str) -> None:
        self.count += 1


def producer(url: str, ssl_options: Any) -> tuple[Celery, FailedAttempts]:
    from ojs_kombu import add_observer

    app = make_app("tls-producer", url, None, broker_use_ssl=ssl_options)
    return app, add_observer(app, FailedAttempts())  # type: ignore[return-value]


def worker(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``celery -A integration.tlsapp worker`` as users start it, to its end."""
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "integration.tlsapp", "worker", "-Q", "tls-fail",
         "-c", "1", "-E", "-n", "tls-fail@%h"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_the_documented_configuration_never_sends_the_password_to_another_certificate(
        node: TLSNode, fake: FakeBroker, tmp_path: Path) -> None:
    """A broker presenting a certificate from the same CA, for another name, is refused
    before any AMQP byte: no credentials reach it from a producer, a worker or the CLI."""
    # the fake broker collects a password from a client that accepts its certificate
    trusting, _ = producer(fake.url(), node.ssl_options(server_hostname="rogue.example"))
    with pytest.raises(Exception):  # noqa: B017 (the fake never finishes the handshake)
        trusting.connection_for_write().ensure_connection(max_retries=0)
    assert fake.got_password(), "the fake broker does not record what a client sends"
    fake.received.clear()
    handshakes = fake.handshakes

    app, failed = producer(fake.url(), node.ssl_options())
    with pytest.raises(BrokerCertificateError) as raised:
        app.send_task("math.add", args=[1, 2], queue="tls-fail")
    assert raised.value.kind == "hostname_mismatch" and failed.count == 0
    assert f"127.0.0.1:{fake.port}" in str(raised.value)

    ended = worker(tls_env(node, tmp_path / "done", url=fake.url()))
    assert ended.returncode == 1 and "hostname_mismatch" in ended.stderr, ended.stderr[-3000:]

    result = cli(node, tmp_path, "dlq", "list", "-q", "tls-fail", "-A", "integration.tlsapp",
                 url=fake.url())
    assert result.returncode == 3 and "hostname_mismatch" in result.stderr, result.stderr
    assert fake.attempts > 2 and fake.handshakes == handshakes
    assert not fake.got_password() and not fake.received


def _url(node: TLSNode) -> str:
    """The node's URL naming 127.0.0.1 (kombu connects to that for ``localhost`` too)."""
    return f"ojss://guest:guest@127.0.0.1:{node.port}/"


#: Each permanent failure: the URL, broker_use_ssl, the kind of BrokerTLSError.
def _rogue(folder: Path) -> dict[str, Any]:
    return {"certfile": str(folder / "rogue-client.pem"),
            "keyfile": str(folder / "rogue-client.key")}


def _expired(folder: Path) -> dict[str, Any]:
    return {"certfile": str(folder / "expired-client.pem"),
            "keyfile": str(folder / "expired-client.key")}


FAILURES: dict[str, tuple[Any, Any, str]] = {
    "no client certificate": (
        _url, lambda n: {k: v for k, v in n.ssl_options().items()
                                      if k not in ("certfile", "keyfile")},
        "client_certificate_required"),
    "a client certificate of another CA": (
        _url, lambda n: n.ssl_options(**_rogue(n.folder)),
        "client_certificate_rejected"),
    "an expired client certificate": (
        _url, lambda n: n.ssl_options(**_expired(n.folder)),
        "client_certificate_expired"),
    "a broker certificate of an unknown CA": (
        _url, lambda n: n.ssl_options(ca_certs=str(n.folder / "other-ca.pem")),
        "server_certificate_untrusted"),
    "an address the certificate does not hold": (
        lambda n: f"ojss://guest:guest@127.0.0.2:{n.port}/", lambda n: n.ssl_options(),
        "hostname_mismatch"),
    "a server_hostname the certificate does not hold": (
        _url, lambda n: n.ssl_options(server_hostname="wrong.example"),
        "hostname_mismatch"),
    "plain AMQP to the TLS port": (
        lambda n: f"ojs://guest:guest@127.0.0.1:{n.port}/", lambda n: False, "tls_port"),
    "TLS to a plain AMQP port": (
        lambda n: f"ojss://guest:guest@{HOST}:{PORT}/", lambda n: n.ssl_options(), "not_tls"),
}


@pytest.mark.parametrize("failure", list(FAILURES))
def test_a_permanent_failure_stops_a_worker_and_raises_at_once(
        node: TLSNode, tmp_path: Path, failure: str) -> None:
    make_url, make_ssl, kind = FAILURES[failure]
    url, ssl_options = make_url(node), make_ssl(node)
    where = url.rpartition("@")[2].rstrip("/")  # host:port
    # a producer: the typed exception, no attempt retried
    app, failed = producer(url, ssl_options)
    with pytest.raises(BrokerTLSError) as raised:
        app.send_task("math.add", args=[1, 2], queue="tls-fail")
    assert raised.value.kind == kind and where in str(raised.value), repr(raised.value)
    assert failed.count == 0
    # the CLI: one line on stderr, exit 3
    result = cli(node, tmp_path, "dlq", "list", "-q", "tls-fail", "-A", "integration.tlsapp",
                 url=url, ssl_options=ssl_options)
    assert result.returncode == 3, result.stderr
    assert kind in result.stderr and where in result.stderr and "Traceback" not in result.stderr
    # a worker: one critical line naming it, Celery's exit code for a failed start
    ended = worker(tls_env(node, tmp_path / "done", url=url, replace=ssl_options))
    assert ended.returncode == 1, ended.stderr[-3000:]
    stops = [line for line in ended.stderr.splitlines() if "failed for good" in line]
    assert len(stops) == 1 and kind in stops[0] and where in stops[0], ended.stderr[-3000:]
    assert "Trying again" not in ended.stderr and "Traceback" not in ended.stderr


def test_a_broker_that_is_down_is_still_retried(node: TLSNode, tmp_path: Path) -> None:
    """Nothing listens on the port: a worker keeps trying, a producer retries its policy."""
    url = f"ojss://guest:guest@127.0.0.1:{free_port()}/"
    app, failed = producer(url, node.ssl_options())
    with pytest.raises(OperationalError) as raised:
        app.send_task("math.add", args=[1, 2], queue="tls-fail",
                      retry_policy={"max_retries": 2})
    assert not isinstance(raised.value, BrokerTLSError) and failed.count >= 2
    log = tmp_path / "worker.log"
    env = tls_env(node, tmp_path / "done", url=url)
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "integration.tlsapp", "worker", "-Q",
             "tls-fail", "-c", "1", "-E", "-n", "tls-down@%h"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: log.read_text().count("Trying again") >= 2, 120,
                   "the worker's second retry")
        assert process.poll() is None, log.read_text()[-3000:]
        assert "failed for good" not in log.read_text()
    finally:
        process.terminate()
        process.wait(60)


def test_a_failover_url_whose_tls_fails_for_good_hands_over_to_the_next(
        node: TLSNode, tmp_path: Path) -> None:
    """``ojss://127.0.0.2...;ojss://127.0.0.1...``: the first address is not in the
    certificate, the second is; a worker consumes through the second and a producer
    publishes through it.  When every URL fails so, the worker stops as above."""
    bad = f"ojss://guest:guest@127.0.0.2:{node.port}/"
    urls = f"{bad};{_url(node)}"
    done_file = tmp_path / "done"
    process = launch_worker(urls, "integration.tlsapp", "tls-failover", pool="prefork",
                            concurrency=1, hostname="tls-failover@%h", without=(),
                            options=("-E",), log=tmp_path / "worker.log",
                            env=tls_env(node, done_file, url=urls), ready=False)
    try:
        wait_until(lambda: consumers(node, "tls-failover"), 120, "the worker's consumer")
        app, _ = producer(urls, node.ssl_options())
        sent = app.send_task("tls.record", args=["x"], queue="tls-failover").id
        wait_until(lambda: done_file.exists() and done_file.read_text().split() == [sent], 60,
                   "the job to run")
        assert "hostname_mismatch" in (tmp_path / "worker.log").read_text()
    finally:
        process.stop()
    both_bad = f"{bad};{_url(node)}"
    ended = worker(tls_env(node, done_file, url=both_bad,
                           replace=node.ssl_options(server_hostname="wrong.example")))
    assert ended.returncode == 1 and "hostname_mismatch" in ended.stderr, ended.stderr[-3000:]
