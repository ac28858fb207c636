"""A TCP proxy on 127.0.0.1 in front of a broker, to watch a client through an outage.

``ojs-kombu conformance`` times reconnects through it (AMQP-025): the proxy
forwards while the broker is "up"; :meth:`LocalProxy.cut` closes every
forwarded connection and makes the proxy accept and at once close each new
one, counting them, which is what a client sees of a broker that is down
while its port still answers.  :meth:`LocalProxy.restore` forwards again.
"""

from __future__ import annotations

import socket
import threading
import time
from contextlib import suppress


class LocalProxy:
    """Forwards ``127.0.0.1:{port}`` to ``target``; counts every connection attempt."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        #: ``time.monotonic()`` of every connection a client opened through the proxy.
        self.attempts: list[float] = []
        self._up = True
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name="ojs-local-proxy", daemon=True).start()

    def attempts_since(self, started: float) -> list[float]:
        """Seconds after ``started`` (a ``time.monotonic()``) of each attempt since."""
        with self._lock:
            return [t - started for t in self.attempts if t >= started]

    def cut(self) -> float:
        """Start an outage: close every forwarded connection; returns its monotonic start."""
        with self._lock:
            self._up = False
            doomed, self._open = self._open, []
        for sock in doomed:
            _close(sock)
        return time.monotonic()

    def restore(self) -> None:
        with self._lock:
            self._up = True

    def close(self) -> None:
        self._closed = True
        self.cut()
        _close(self._server)

    def __enter__(self) -> LocalProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                self.attempts.append(time.monotonic())
                up = self._up
            if not up:
                _close(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._open += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    _close(source)
    _close(sink)


def _close(sock: socket.socket) -> None:
    with suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with suppress(OSError):
        sock.close()
