"""A three-node RabbitMQ cluster on this machine, started and torn down by the fault suite.

Each node has its own name, AMQP port, distribution port and data/log
directories under a temporary folder; they share the machine's Erlang cookie
(``rabbitmq-server`` and ``rabbitmqctl`` run as the ``rabbitmq`` user).  Nodes 2
and 3 join node 1 with ``rabbitmqctl join_cluster``.  The shared broker on 5672
and its data are never touched.  Every wait is bounded.
"""

from __future__ import annotations

import os
import resource
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path
from typing import Any

HOST = "localhost"
#: Small Erlang VMs that do not spin: three nodes share two cores with the tests.
ERL_ARGS = "+S 2:2 +A 8 +sbwt none +sbwtdcpu none +sbwtdio none"
#: Debian's server script behind ``/usr/sbin/rabbitmq-server``, and the user's home
#: (where its Erlang cookie is, shared with ``rabbitmqctl``).
RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
RABBITMQ_HOME = "/var/lib/rabbitmq"
#: A command prefix under which RabbitMQ's programs run (``.ci/rabbitmq4 exec``: the
#: RabbitMQ 4.x root, whose ``/tmp`` is this machine's); empty: this machine's.
RABBITMQ_EXEC = shlex.split(os.environ.get("OJS_RABBITMQ_EXEC", ""))
#: A file of ``rabbitmq.conf`` lines every node of the suite gets as well (the
#: 4.x root's deprecated features, denied).
EXTRA_CONF = os.environ.get("OJS_RABBITMQ_EXTRA_CONF", "")


#: Deprecated features a cluster node permits all the same: RabbitMQ 4.0.5 refuses
#: ``start_app`` of a node joining or rejoining a cluster with
#: ``failed_to_deny_deprecated_features [transient_nonexcl_queues]`` while that one is
#: denied, with no such queue declared (a single node restarts fine).
CLUSTER_PERMITS = ("transient_nonexcl_queues",)


def node_conf(port: int, cluster: bool = False) -> str:
    """A node's ``rabbitmq.conf``: AMQP on 127.0.0.1:``port``, plus ``EXTRA_CONF`` (less
    the denials of :data:`CLUSTER_PERMITS` on a ``cluster`` node)."""
    extra = Path(EXTRA_CONF).read_text().splitlines() if EXTRA_CONF else []
    if cluster:
        extra = [line for line in extra if not any(f".{name} " in line
                                                   for name in CLUSTER_PERMITS)]
    return "".join(f"{line}\n" for line in [f"listeners.tcp.local = 127.0.0.1:{port}",
                                             *extra])


def rabbitmqctl_command(node: str, *args: str) -> list[str]:
    return [*RABBITMQ_EXEC, "rabbitmqctl", "-q", "-n", node, *args]


def _raise_open_files() -> None:
    """The soft limit of open files up to the hard one, in the node's process."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class ClusterNode:
    """One RabbitMQ node of the cluster: its own name, ports and data directory."""

    def __init__(self, name: str, index: int, port: int, dist_port: int, base: Path) -> None:
        self.index = index
        self.name = f"{name}{index}@{HOST}"
        self.port = port
        self.dist_port = dist_port
        self.base = base / f"c{index}"
        #: The node's ``beam.smp`` process, read once it is up (what ``kill -9`` hits).
        self.pid: int | None = None

    @property
    def url(self) -> str:
        return f"ojs://guest:guest@127.0.0.1:{self.port}//"

    def ctl(self, *args: str, timeout: float = 60, check: bool = True) -> str:
        result = subprocess.run(rabbitmqctl_command(self.name, *args),
                                capture_output=True, text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise RuntimeError(f"rabbitmqctl -n {self.name} {' '.join(args)} failed: "
                               f"{result.stderr.strip() or result.stdout.strip()}")
        return result.stdout

    def running(self) -> bool:
        """The Erlang node is up (its rabbit app may be stopped): its distribution port
        (``RABBITMQ_DIST_PORT``) takes connections.  Asked in a loop while a node boots,
        so not with ``rabbitmqctl ping``, whose Erlang VM costs ~0.7 s of CPU a run."""
        return port_open(self.dist_port)

    @property
    def pid_file(self) -> Path:
        """Where the node writes its VM's pid when it boots (``RABBITMQ_PID_FILE``)."""
        return self.base / "node.pid"

    def start(self) -> None:
        """``rabbitmq-server -detached`` with this node's environment (data kept across
        restarts, so a restarted node rejoins the cluster by itself)."""
        self.base.mkdir(parents=True, exist_ok=True)
        (self.base / "enabled_plugins").write_text("")
        (self.base / "rabbitmq.conf").write_text(node_conf(self.port, cluster=True))
        for path in [self.base, *self.base.iterdir()]:
            shutil.chown(path, "rabbitmq", "rabbitmq")
        env = {**os.environ, "HOME": RABBITMQ_HOME, "RABBITMQ_NODENAME": self.name,
               "RABBITMQ_NODE_PORT": str(self.port), "RABBITMQ_DIST_PORT": str(self.dist_port),
               "RABBITMQ_MNESIA_BASE": str(self.base / "mnesia"),
               "RABBITMQ_LOG_BASE": str(self.base / "log"),
               "RABBITMQ_CONFIG_FILE": str(self.base / "rabbitmq.conf"),
               "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.base / "enabled_plugins"),
               "RABBITMQ_PID_FILE": str(self.pid_file),
               "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": ERL_ARGS}
        # As the rabbitmq user, as Debian's ``rabbitmq-server`` would, but without its
        # ``su``, which lowers the soft limit of open files to 1024: RabbitMQ 3.10 sizes
        # its file handle cache from it (927 handles), a quorum queue takes about five
        # on its leader's node, and past ~200 quorum queues every queue that needs one
        # more handle waits for it for ever (the node stops answering).
        if RABBITMQ_EXEC:  # the prefix runs as root: the user changes inside it
            subprocess.run([*RABBITMQ_EXEC, "setpriv", "--reuid=rabbitmq", "--regid=rabbitmq",
                            "--clear-groups", RABBITMQ_SERVER, "-detached"], env=env,
                           cwd=self.base, check=True, timeout=60, preexec_fn=_raise_open_files)
            return
        subprocess.run([RABBITMQ_SERVER, "-detached"], env=env, cwd=self.base, check=True,
                       timeout=60, user="rabbitmq", group="rabbitmq", extra_groups=[],
                       preexec_fn=_raise_open_files)

    def await_up(self, timeout: float = 120) -> None:
        """Until the node runs its rabbit app and answers AMQP (the error quotes the end
        of the node's log)."""
        wait_until(self.running, timeout, f"node {self.name} to answer")
        try:
            self.ctl("--timeout", str(int(timeout)), "await_startup", timeout=timeout + 10)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            raise RuntimeError(f"{exc}\n--- the end of {self.name}'s log:\n{self.log_tail()}") \
                from exc
        wait_until(lambda: port_open(self.port), timeout, f"AMQP on port {self.port}")
        self.pid = self.vm_pid()

    def vm_pid(self, timeout: float = 60) -> int:
        """The pid of the node's Erlang VM (``beam.smp``): from its pid file once it has
        booted (``await_up``), else asked of the node."""
        with suppress(OSError, ValueError):
            pid = int(self.pid_file.read_text().strip())
            if _alive(pid):
                return pid
        return int(self.ctl("eval", "list_to_integer(os:getpid()).", timeout=timeout).strip())

    def log_tail(self, lines: int = 40) -> str:
        logs = sorted((self.base / "log").glob("*.log"))
        return "\n".join(line for log in logs
                         for line in log.read_text(errors="replace").splitlines()[-lines:])

    def start_fresh(self) -> None:
        """Started and up; once more with new data if the first boot of its rabbit app does
        not end (seen once on RabbitMQ 4.0.5 in CI: the VM up, the app not, for 120 s),
        saying so with the first boot's log."""
        self.start()
        try:
            self.await_up()
        except RuntimeError as exc:
            print(f"\n{self.name} did not boot; starting it again with new data:\n{exc}",
                  flush=True)
            with suppress(Exception):
                self.pid = self.vm_pid(timeout=20)
            self.stop()
            shutil.rmtree(self.base, ignore_errors=True)
            self.start()
            self.await_up()

    def kill9(self) -> None:
        """``kill -9`` of the node's Erlang VM: no goodbye to its peers or clients."""
        assert self.pid is not None, f"{self.name} is not up"
        os.kill(self.pid, signal.SIGKILL)
        wait_until(lambda: not _alive(self.pid), 30, f"{self.name}'s VM to die")
        self.pid = None

    def stop(self) -> None:
        with suppress(Exception):
            self.ctl("stop", timeout=60, check=False)
        if self.pid is not None and _alive(self.pid):
            with suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            with suppress(AssertionError):
                wait_until(lambda: not _alive(self.pid), 30, f"{self.name}'s VM to die")
        self.pid = None


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie has no VM left (its parent, the detached launcher, is gone)
    with suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    return False


class Cluster:
    """Three nodes joined into one cluster; ``broker_url`` lists all three (kombu failover).

    ``with Cluster(...) as cluster:`` starts it and always stops it and deletes its data
    (the fault suite's ``cluster`` fixture, the benchmark's ``cluster_drain`` part).
    """

    def __init__(self, ports: tuple[int, int, int] = (5681, 5682, 5683),
                 dist_ports: tuple[int, int, int] = (25681, 25682, 25683),
                 name: str = "ojs-c") -> None:
        self.base = Path(tempfile.mkdtemp(prefix="ojs-cluster-"))
        shutil.chown(self.base, "rabbitmq", "rabbitmq")
        self.nodes = [ClusterNode(name, i + 1, port, dist, self.base)
                      for i, (port, dist) in enumerate(zip(ports, dist_ports, strict=True))]

    @property
    def broker_url(self) -> str:
        return ";".join(node.url for node in self.nodes)

    def __enter__(self) -> Cluster:
        """Started, and stopped again if starting fails half-way (no node outlives it)."""
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def node(self, name: str) -> ClusterNode:
        return next(node for node in self.nodes if node.name == name)

    def start(self) -> None:
        busy = [n.name for n in self.nodes if port_open(n.port) or n.running()]
        if busy:
            raise RuntimeError(f"{', '.join(busy)} (or its port) already in use: the cluster "
                               "runs only on nodes the fault suite starts itself")
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(ClusterNode.start_fresh, self.nodes))
        first = self.nodes[0]
        for node in self.nodes[1:]:
            node.ctl("stop_app")
            node.ctl("join_cluster", first.name)
            node.ctl("start_app")
            node.await_up()
        wait_until(lambda: all(n.name in first.ctl("cluster_status", "--formatter", "json")
                          for n in self.nodes), 60, "every node in the cluster")

    def leader(self, queue: str) -> ClusterNode:
        """The node holding the leader of quorum queue ``queue`` (its AMQP name)."""
        for node in self.nodes:
            if node.pid is None:
                continue
            for line in node.ctl("list_queues", "--no-table-headers", "name", "leader",
                                 check=False).splitlines():
                name, _, leader = line.partition("\t")
                if name == queue and leader.strip():
                    return self.node(leader.strip())
            break
        raise LookupError(f"no leader found for {queue}")

    def heal(self) -> None:
        """Every node up with its app running (after a test stopped or killed some)."""
        for node in self.nodes:
            if node.pid is None or not _alive(node.pid):
                node.pid = None
                node.start()
        for node in self.nodes:
            if node.pid is not None and port_open(node.port):
                continue  # its app runs: it listens only once booted
            node.ctl("start_app", check=False)
            node.await_up()

    def stop(self) -> None:
        """Stop every node and delete the data: the end of the suite, also on failure."""
        for node in reversed(self.nodes):
            node.stop()
        shutil.rmtree(self.base, ignore_errors=True)
