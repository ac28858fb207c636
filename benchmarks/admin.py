"""Broker administration of the benchmarks, outside every contender's app.

:class:`Broker` is the run's own py-amqp connection for purging, counting and
deleting; :func:`delete_swept` also deletes what ``rabbitmqctl`` lists under a
side's name (queues its workers declared on their own); :func:`private_vhost`
gives a part a vhost of its own.  Kept apart from the Celery apps so
administration never shows up in their connection pools or in the measured code
paths.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, Protocol

import amqp
from kombu.utils.url import parse_url
from sides import Side, connect, host

#: ``rabbitmqctl -q`` with these arguments (``timeout=``), its output.
Ctl = Callable[..., str]


class Broker:
    """A py-amqp connection for purging, counting and deleting benchmark entities."""

    def __init__(self, url: str) -> None:
        self.host = host(url)
        self.vhost = parse_url(url).get("virtual_host") or "/"
        self.connection = connect(url)
        self.channel = self.connection.channel()

    @property
    def server_version(self) -> str:
        raw = self.connection.server_properties.get("version", "")
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    def _retry(self, call: Callable[[amqp.Channel], Any]) -> Any:
        """Run ``call`` on the admin channel; a 404 closes it, so reopen and give ``None``."""
        try:
            return call(self.channel)
        except amqp.exceptions.NotFound:
            self.channel = self.connection.channel()
            return None

    def purge(self, queue: str) -> None:
        self._retry(lambda ch: ch.queue_purge(queue))

    def depth(self, queue: str) -> int | None:
        """Ready messages in ``queue``; ``None`` if it does not exist."""
        declared = self._retry(lambda ch: ch.queue_declare(queue, passive=True))
        return None if declared is None else int(declared.message_count)

    def delete(self, queues: list[str], exchanges: list[str]) -> None:
        """Delete the given entities (those that do not exist are skipped)."""
        for queue in queues:
            self._retry(lambda ch, q=queue: ch.queue_delete(q))
        for exchange in exchanges:
            self._retry(lambda ch, e=exchange: ch.exchange_delete(e))

    def delete_side(self, side: Side) -> None:
        """What ``side`` declared: the names it knows, plus (with ``rabbitmqctl``) every queue
        and exchange under its OJS prefix, e.g. queues a worker declared on its own."""
        prefix = side.sweep_prefix
        delete_swept(self, self.vhost, side.queues, side.exchanges,
                     (lambda name: name.startswith(prefix)) if prefix else None)

    def close(self) -> None:
        with suppress(Exception):
            self.connection.close()


def list_broker(kind: str, columns: list[str], vhost: str) -> list[list[str]] | None:
    """``rabbitmqctl list_<kind>`` rows, or ``None`` when rabbitmqctl is unavailable."""
    try:
        done = subprocess.run(
            ["rabbitmqctl", "-q", f"list_{kind}", "-p", vhost, "--no-table-headers", *columns],
            capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return [line.split("\t") for line in done.stdout.splitlines() if line.strip()]


class Deleter(Protocol):
    """What :func:`delete_swept` deletes with (:class:`Broker` and the parts' admins)."""

    def delete(self, queues: list[str], exchanges: list[str]) -> None: ...


def delete_swept(admin: Deleter, vhost: str, queues: list[str], exchanges: list[str],
                 matches: Callable[[str], bool] | None) -> None:
    """Delete ``queues`` and ``exchanges`` and every queue and exchange ``rabbitmqctl``
    lists whose name ``matches`` (what a side's workers declared on their own); no
    listing without ``matches``."""
    queues, exchanges = list(queues), list(exchanges)
    if matches is not None:
        for kind, names in (("queues", queues), ("exchanges", exchanges)):
            rows = list_broker(kind, ["name"], vhost) or []
            names += [row[0] for row in rows if matches(row[0]) and row[0] not in names]
    admin.delete(queues, exchanges)


def local_ctl(*args: str, timeout: float = 120) -> str:
    """:data:`Ctl` of the local node: ``rabbitmqctl -q`` on the ``PATH``."""
    done = subprocess.run(["rabbitmqctl", "-q", *args], capture_output=True, text=True,
                          timeout=timeout, check=True)
    return done.stdout


@contextmanager
def private_vhost(ctl: Ctl, name: str) -> Iterator[str]:
    """The vhost ``name``, ``guest`` allowed everything in it; deleted on exit."""
    ctl("add_vhost", name)
    try:
        ctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
        yield name
    finally:
        ctl("delete_vhost", name)
