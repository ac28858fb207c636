"""A RabbitMQ node of a test's own, and the certificates of a TLS test broker.

:func:`tls_node` starts a node (free ports, data in a temporary folder) whose only
AMQP listener is TLS with ``verify_peer`` and ``fail_if_no_peer_cert``, under
``OJS_RABBITMQ_EXEC`` when set (``.ci/rabbitmq4 exec``: RabbitMQ 4.x, whose ``/tmp``
is this machine's) or this machine's ``rabbitmq-server``; it is stopped and its
folder deleted afterwards.  The shared broker is never touched.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .conftest import RABBITMQ_EXEC, rabbitmqctl_command, run_rabbitmqctl, wait_until


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True,
                            timeout=60, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {result.stderr.strip()}")


def make_ca(folder: Path, name: str) -> None:
    """``{name}.pem``/``{name}.key``: a self-signed CA."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", f"/CN=ojs-kombu test {name}", "-keyout", f"{name}.key",
            "-out", f"{name}.pem", cwd=folder)


def make_cert(folder: Path, name: str, ca: str, subject: str, san: str | None = None) -> None:
    """``{name}.pem``/``{name}.key`` signed by the CA ``ca`` (``san``: subjectAltName)."""
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={subject}",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=folder)
    extensions = folder / f"{name}.ext"
    extensions.write_text(f"subjectAltName={san}\n" if san else "basicConstraints=CA:FALSE\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-days", "2", "-extfile", extensions.name,
            "-out", f"{name}.pem", cwd=folder)


def make_expired_cert(folder: Path, name: str, ca: str, subject: str) -> None:
    """``{name}.pem``/``{name}.key`` signed by the CA ``ca``, valid for one day of 2020."""
    (folder / f"{name}.index").write_text("")
    (folder / f"{name}.serial").write_text("1000\n")
    (folder / f"{name}.cnf").write_text(
        f"[ca]\ndefault_ca = d\n[d]\ndatabase = {folder / f'{name}.index'}\n"
        f"new_certs_dir = {folder}\nserial = {folder / f'{name}.serial'}\n"
        "default_md = sha256\npolicy = p\nunique_subject = no\n[p]\ncommonName = supplied\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={subject}",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=folder)
    openssl("ca", "-config", f"{name}.cnf", "-batch", "-notext", "-cert", f"{ca}.pem",
            "-keyfile", f"{ca}.key", "-startdate", "20200101000000Z",
            "-enddate", "20200102000000Z", "-in", f"{name}.csr", "-out", f"{name}.pem",
            cwd=folder)


@dataclass
class TLSNode:
    name: str
    port: int
    #: ca.pem, client.pem/.key, other-ca.pem (a CA that signed nothing here but
    #: rogue-client), expired-client (ca's, expired), rogue-server (ca's, for another name)
    folder: Path

    def ctl(self, *args: str) -> str:
        return run_rabbitmqctl(*args, node=self.name)

    def ssl_options(self, **changes: object) -> dict[str, object]:
        """Celery's ``broker_use_ssl`` for this node as docs/production.rst writes it (its
        CA, the client certificate, ``CERT_REQUIRED``; no ``server_hostname``)."""
        import ssl

        return {"ca_certs": str(self.folder / "ca.pem"),
                "certfile": str(self.folder / "client.pem"),
                "keyfile": str(self.folder / "client.key"),
                "cert_reqs": ssl.CERT_REQUIRED, **changes}

    def url(self, vhost: str = "") -> str:
        return f"ojss://guest:guest@localhost:{self.port}/{vhost}"


def cannot_start_reason() -> str | None:
    """Why this machine cannot start a node of the test's own (``None``: it can)."""
    if shutil.which("openssl") is None:
        return "openssl is not installed"
    if RABBITMQ_EXEC:
        return None
    if shutil.which("rabbitmq-server") is None:
        return "rabbitmq-server is not on the PATH"
    if os.geteuid() != 0:
        return "starting a RabbitMQ node of the test's own needs root (as CI runs)"
    return None


@contextmanager
def tls_node() -> Iterator[TLSNode]:
    """A node whose only AMQP listeners are TLS (verify_peer, client certificate required),
    on 127.0.0.1 (in the server certificate) and 127.0.0.2 (not in it)."""
    folder = Path(tempfile.mkdtemp(prefix="ojs-tls-"))
    name = f"ojs-tls-{os.getpid()}-{uuid.uuid4().hex[:4]}@localhost"
    port, dist_port = free_port(), free_port()
    node = TLSNode(name, port, folder)
    try:
        make_ca(folder, "ca")
        make_ca(folder, "other-ca")
        make_cert(folder, "server", "ca", "localhost", "DNS:localhost,IP:127.0.0.1")
        make_cert(folder, "client", "ca", "ojs-kombu test client")
        make_cert(folder, "rogue-client", "other-ca", "ojs-kombu test client")
        make_expired_cert(folder, "expired-client", "ca", "ojs-kombu test client")
        make_cert(folder, "rogue-server", "ca", "rogue.example", "DNS:rogue.example")
        extra = os.environ.get("OJS_RABBITMQ_EXTRA_CONF")
        (folder / "rabbitmq.conf").write_text(
            "listeners.tcp = none\n"
            f"listeners.ssl.local = 127.0.0.1:{port}\n"
            # an address of this machine the server certificate does not hold
            f"listeners.ssl.other = 127.0.0.2:{port}\n"
            f"ssl_options.cacertfile = {folder / 'ca.pem'}\n"
            f"ssl_options.certfile = {folder / 'server.pem'}\n"
            f"ssl_options.keyfile = {folder / 'server.key'}\n"
            "ssl_options.verify = verify_peer\n"
            "ssl_options.fail_if_no_peer_cert = true\n"
            + (Path(extra).read_text() if extra else ""))
        (folder / "enabled_plugins").write_text("")
        for path in [folder, *folder.iterdir()]:
            shutil.chown(path, "rabbitmq", "rabbitmq")
        env = {**os.environ, "RABBITMQ_NODENAME": name, "RABBITMQ_NODE_PORT": str(port),
               "RABBITMQ_DIST_PORT": str(dist_port),
               "RABBITMQ_MNESIA_BASE": str(folder / "mnesia"),
               "RABBITMQ_LOG_BASE": str(folder / "log"),
               "RABBITMQ_CONFIG_FILE": str(folder / "rabbitmq.conf"),
               "RABBITMQ_ENABLED_PLUGINS_FILE": str(folder / "enabled_plugins")}
        subprocess.run([*RABBITMQ_EXEC, "rabbitmq-server", "-detached"], env=env, cwd=folder,
                       check=True, timeout=60, capture_output=True)
        # The listener opens late in the node's boot; a socket probe costs nothing, where
        # each rabbitmqctl ping costs ~0.7 s of CPU that a booting node on a loaded machine
        # needs itself (pinged every 0.05 s, a node on 0.8 of a core did not come up in 90 s).
        wait_until(lambda: _listening(port), 240, f"node {name} to listen on {port}",
                   interval=0.5)
        node.ctl("--timeout", "120", "await_startup")
        yield node
    finally:
        subprocess.run(rabbitmqctl_command("stop", node=name), capture_output=True,
                       timeout=120, check=False)
        shutil.rmtree(folder, ignore_errors=True)


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0
