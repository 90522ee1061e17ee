"""A TCP fault proxy between mrtr and its store (Redis or PostgreSQL), for fleet tests.

Each server instance reaches the store through its own `StoreProxy`, so a test can take the
store away from ONE instance (a partition), slow it down for all, or hold its bytes, without
touching the store itself. Faults, each a plain method call from any thread:

- `cut()`: close every open connection and refuse new ones (accepted, then closed at once, as
  a firewall's reset looks to the client); `restore()` ends it;
- `pause()`: keep connections open but hold every byte in both directions (a network that
  stalls); `resume()` delivers what was held, in order;
- `delay(seconds)`: each chunk the store sends back reaches the client `seconds` later than it
  arrived (a fixed latency per reply, not a bandwidth limit: chunks in flight overlap);
  `delay(0)` ends it.

Why not an existing tool: Toxiproxy does all of this but is a Go server (no Debian package, no
wheel; `toxiproxy-python` on PyPI is only its HTTP client), and the Python TCP proxies on PyPI
(`asyncproxy`, `asynctcpproxy`, `pproxy`) forward bytes with no way to inject faults. This one
is asyncio streams on its own event loop in a daemon thread, so it serves sync and async tests
alike and keeps forwarding while the test's loop is busy. 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = ["ProxyStats", "StoreProxy"]

_T = TypeVar("_T")
_CHUNK = 65536


@dataclass
class ProxyStats:
    """What went through the proxy: connections accepted, refused while cut, dropped by `cut()`."""

    accepted: int = 0
    refused: int = 0
    dropped: int = 0
    bytes_up: int = 0
    bytes_down: int = 0


@dataclass(eq=False)
class _Link:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        for writer in (self.client, self.upstream):
            with contextlib.suppress(Exception):
                writer.transport.abort()  # a reset, not a polite FIN: what a dropped route looks like


class StoreProxy:
    """Forwards 127.0.0.1:`port` to 127.0.0.1:`upstream_port`, with faults on command.

    Use as a context manager (`with StoreProxy(6379) as proxy:`), or `start()` / `close()`.
    """

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self.stats = ProxyStats()
        self._cut = False
        self._delay = 0.0
        self._flowing: asyncio.Event | None = None
        self._links: set[_Link] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="store-proxy", daemon=True)
        self._server: asyncio.Server | None = None

    # -- life --------------------------------------------------------------------------------

    def start(self) -> StoreProxy:
        self._thread.start()
        self._call(self._listen())
        return self

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    def __enter__(self) -> StoreProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def url(self, template: str) -> str:
        """`template` with `{port}` filled in: `proxy.url("redis://127.0.0.1:{port}/0")`."""
        return template.format(port=self.port)

    # -- faults ------------------------------------------------------------------------------

    def cut(self) -> None:
        """Drop every connection now and refuse new ones until `restore()`."""
        self._call(self._set_cut(True))

    def restore(self) -> None:
        self._call(self._set_cut(False))

    def pause(self) -> None:
        """Hold every byte, both ways, until `resume()` (connections stay open)."""
        self._call(self._set_flowing(False))

    def resume(self) -> None:
        self._call(self._set_flowing(True))

    def delay(self, seconds: float) -> None:
        """Deliver each chunk from the store `seconds` after it arrived (0: no delay)."""
        self._delay = max(0.0, seconds)

    @property
    def connections(self) -> int:
        return len(self._links)

    # -- inside the proxy's loop -------------------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    async def _listen(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            link.close()
        self._links.clear()

    async def _set_cut(self, cut: bool) -> None:
        self._cut = cut
        if cut:
            for link in list(self._links):
                link.close()
                self.stats.dropped += 1
            self._links.clear()

    async def _set_flowing(self, flowing: bool) -> None:
        assert self._flowing is not None
        if flowing:
            self._flowing.set()
        else:
            self._flowing.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            self.stats.refused += 1
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            self.stats.refused += 1  # the store itself is down: the client sees the same refusal
            writer.transport.abort()
            return
        if self._cut:  # cut while connecting upstream: this link must not outlive the cut
            self.stats.refused += 1
            up_writer.transport.abort()
            writer.transport.abort()
            return
        self.stats.accepted += 1
        link = _Link(writer, up_writer)
        self._links.add(link)
        link.tasks = [
            asyncio.create_task(self._pump(reader, up_writer, link, down=False)),
            asyncio.create_task(self._pump(up_reader, writer, link, down=True)),
        ]

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, link: _Link, down: bool) -> None:
        assert self._flowing is not None
        due: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        sender = asyncio.create_task(self._send_when_due(due, sink, link))
        try:
            while chunk := await source.read(_CHUNK):
                await self._flowing.wait()
                if down:
                    self.stats.bytes_down += len(chunk)
                else:
                    self.stats.bytes_up += len(chunk)
                later = self._delay if down else 0.0
                due.put_nowait((time.monotonic() + later, chunk))
            due.put_nowait((0.0, b""))  # end of stream: pass the close on once the rest is out
            await sender
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            sender.cancel()
            self._links.discard(link)
            link.close()

    async def _send_when_due(
        self, due: asyncio.Queue[tuple[float, bytes]], sink: asyncio.StreamWriter, link: _Link
    ) -> None:
        assert self._flowing is not None
        while True:
            at, chunk = await due.get()
            if not chunk:
                link.close()
                return
            if (wait := at - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            await self._flowing.wait()
            sink.write(chunk)
            await sink.drain()
