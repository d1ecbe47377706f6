"""Sidecars whose AMQP connections run through a TCP proxy the test controls.

`TcpProxy`: an asyncio proxy in a thread of its own, listening on a free port and forwarding
to the broker's AMQP port; `cut()` aborts every live connection both ways, `pause()` /
`resume()` hold the bytes. `Proxied`: the stack's instances of some sidecars replaced by ones
connecting through such a proxy, and the stack's own put back afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence
from typing import Any

from tests.faults.stack import QueueProbe, Stack, sidecar_queues
from tests.faults.timing import CONSUMER_DEADLINE_S, poll_until, say


class TcpProxy:
    """127.0.0.1:<free port> -> (host, port), in a thread with its own event loop, so nothing
    the test's loop does (nor a blocking call there) slows the proxied traffic."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self.accepted = 0
        self.cuts = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._live: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._flowing = asyncio.Event()
        self._server: asyncio.Server | None = None

    def start(self) -> int:
        self._thread.start()
        self.port = self._call(self._start())
        return self.port

    def _call(self, coro: Any, timeout: float = 10) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _start(self) -> int:
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            broker_r, broker_w = await asyncio.open_connection(*self.target)
        except OSError:  # the broker is away: the client sees its connection refused-ish
            client_w.transport.abort()
            return
        self.accepted += 1
        pair = (client_w, broker_w)
        self._live.add(pair)
        try:
            await asyncio.gather(self._pipe(client_r, broker_w), self._pipe(broker_r, client_w))
        finally:
            self._live.discard(pair)
            for w in pair:
                w.transport.abort()

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            while data := await r.read(1 << 16):
                await self._flowing.wait()
                w.write(data)
                await w.drain()
        w.transport.abort()  # one side gone: the other goes too, as a cut link would

    def cut(self) -> int:
        """Abort every live connection both ways (RST); returns how many were cut."""
        self.cuts += 1
        return int(self._call(self._cut()))

    async def _cut(self) -> int:
        live = list(self._live)
        for pair in live:
            for w in pair:
                w.transport.abort()
        return len(live)

    def pause(self) -> None:
        """Hold the bytes (connections stay open, heartbeats stop flowing)."""
        self._loop.call_soon_threadsafe(self._flowing.clear)

    def resume(self) -> None:
        self._loop.call_soon_threadsafe(self._flowing.set)

    def connections(self) -> int:
        return len(self._live)

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._cut()


class Proxied:
    """The stack's instances of `names` replaced by ones connecting through a TcpProxy;
    `restore()` puts the stack's own back."""

    def __init__(self, stack: Stack, names: Sequence[str]) -> None:
        self.stack, self.names = stack, list(names)
        self.proxy = TcpProxy(stack.settings.host, stack.settings.amqp_port)
        self.swapped: list[str] = []
        self.probe = QueueProbe(stack)

    async def start(self) -> None:
        port = await asyncio.to_thread(self.proxy.start)
        say(f"TCP proxy on 127.0.0.1:{port} -> {self.stack.settings.host}:{self.stack.settings.amqp_port}")
        for name in self.names:
            await asyncio.to_thread(self.stack.terminate, name)
            self.swapped.append(name)
            self.stack.proxy_port[name] = port
            await asyncio.to_thread(self.stack.launch, name)
        await self._consuming()

    async def _consuming(self) -> None:
        queues = [(v, q) for n in self.names for v, q in sidecar_queues(self.stack.topology, n)]

        async def ok() -> bool:
            return not await self.probe.consumed(queues)

        assert await poll_until(ok, CONSUMER_DEADLINE_S), \
            f"no consumer on {await self.probe.consumed(queues)} after the swap"

    async def restore(self) -> None:
        self.proxy.resume()
        for name in self.swapped:
            self.stack.proxy_port.pop(name, None)
            await asyncio.to_thread(self.stack.terminate, name)
            await asyncio.to_thread(self.stack.launch, name)
        self.swapped.clear()
        self.proxy.close()
        try:
            await self._consuming()
        finally:
            await self.probe.close()
