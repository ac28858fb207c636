"""A TCP proxy to the broker that can cut its connections off the way a network does.

:meth:`Blackhole.cut` makes every connection open at that moment go silent both ways:
bytes are read and dropped, nothing is closed, so neither end sees a FIN or a reset
(a cable pulled, a firewall dropping packets, a NAT entry forgotten).  Connections
made afterwards flow again.  Each end finds out only by its own heartbeats.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any


class Blackhole:
    """``with Blackhole(host, port) as proxy:`` listens on ``127.0.0.1:proxy.port``."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self._live: list[dict[str, bool]] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: Any = None
        self._stopping = False

    def __enter__(self) -> Blackhole:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._accept, "127.0.0.1", 0), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        async def close() -> None:
            self._stopping = True
            self._server.close()
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def cut(self) -> int:
        """Silence every connection open now; how many there were."""
        done = threading.Event()
        count: list[int] = []

        def silence() -> None:  # in the proxy's loop: no connection is half-added
            live, self._live = self._live, []
            for state in live:
                state["cut"] = True
            count.append(len(live))
            done.set()
        self._loop.call_soon_threadsafe(silence)
        assert done.wait(10), "the proxy's loop did not answer"
        return count[0]

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
                      ) -> None:
        broker_r, broker_w = await asyncio.open_connection(*self.target)
        state = {"cut": False}
        self._live.append(state)
        try:
            await asyncio.gather(self._pipe(client_r, broker_w, state),
                                 self._pipe(broker_r, client_w, state))
        except (OSError, asyncio.CancelledError):
            pass
        finally:  # a cut connection stays open (and silent) until the proxy stops
            if not state["cut"] or self._stopping:
                for writer in (client_w, broker_w):
                    writer.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    state: dict[str, bool]) -> None:
        while data := await reader.read(65536):
            if not state["cut"]:
                writer.write(data)
                await writer.drain()
        if not state["cut"]:  # a close, passed on; a cut connection stays silent
            writer.close()
