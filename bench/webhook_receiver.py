"""A webhook receiver for bench/webhooks.py and the tests: a small asyncio HTTP/1.1 server
(keep-alive, Content-Length bodies) that checks every request's Standard Webhooks signature
with the client package's geofence_client.webhooks.verify and records what it got: per
webhook-id the event ids, and per event id the webhook-ids it came under and when it first arrived.

Its `mode` says how it answers: "ok" (204), "fail" (500), "stall" (no answer until the mode
changes, so the sender times out), "gone" (410). `stop()` / `start()` take its port down and
up again (connections refused meanwhile). A bad signature is answered 401 and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from dataclasses import dataclass, field

import orjson
from geofence_client import webhooks


@dataclass
class Received:
    ids: dict[str, list[str]] = field(default_factory=dict)  # webhook-id -> event ids (first copy)
    copies: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))  # webhook-id -> times
    under: defaultdict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # event -> ids
    first_at: dict[str, float] = field(default_factory=dict)  # event id -> when it first arrived
    event_ts: dict[str, float] = field(default_factory=dict)  # event id -> its ts
    order: defaultdict[str, list[str]] = field(default_factory=lambda: defaultdict(list))  # object -> events
    requests: int = 0
    connections: int = 0
    kept: list[dict[str, object]] = field(default_factory=list)  # with keep=True: every event taken
    bad_signatures: int = 0
    refused: int = 0  # answered with a failure on purpose (fail / gone)


class Receiver:
    def __init__(self, secret: str, host: str = "127.0.0.1", keep: bool = False) -> None:
        self.secret, self.host, self.keep = secret, host, keep
        self.mode = "ok"
        self.got = Received()
        self.server: asyncio.Server | None = None
        self.port = 0
        self.changed = asyncio.Event()
        self.arrived = asyncio.Event()
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self.closing = False

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/hook"

    async def start(self) -> None:
        self.closing = False
        self.server = await asyncio.start_server(self._serve, self.host, self.port or 0, reuse_address=True)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Down: the port closed and every open connection cut."""
        if self.server is not None:
            self.closing = True
            self.set_mode(self.mode)  # a stalled answer gives up
            self.server.close()
            for w in list(self._writers):
                w.close()
            await asyncio.gather(*self._handlers, return_exceptions=True)  # each ends on its own
            with contextlib.suppress(Exception):
                await self.server.wait_closed()
            self.server = None

    def set_mode(self, mode: str) -> None:
        self.mode = mode
        self.changed.set()
        self.changed = asyncio.Event()

    def events(self) -> set[str]:
        return set(self.got.first_at)

    async def wait_for(self, n: int, timeout: float) -> bool:
        """Until `n` distinct events arrived (True) or the timeout (False)."""
        deadline = time.monotonic() + timeout
        while len(self.got.first_at) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), min(left, 1.0))
            self.arrived.clear()
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self.got.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                pairs = (x.partition(":") for x in lines[1:] if x)
                headers = {k.strip().lower(): v.strip() for k, _, v in pairs}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                status = await self._answer(headers, body)
                writer.write(f"HTTP/1.1 {status} X\r\ncontent-length: 0\r\n\r\n".encode())
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            self._writers.discard(writer)
            self._handlers.discard(task)
            writer.close()

    async def _answer(self, headers: dict[str, str], body: bytes) -> int:
        while self.mode == "stall" and not self.closing:
            await self.changed.wait()
        if self.closing:
            raise ConnectionError("the receiver is stopping")
        self.got.requests += 1
        if self.mode == "fail":
            self.got.refused += 1
            return 500
        if self.mode == "gone":
            self.got.refused += 1
            return 410
        try:
            msg_id = webhooks.verify(self.secret, headers, body, time.time())
        except (webhooks.BadSignature, ValueError):
            self.got.bad_signatures += 1
            return 401
        data = orjson.loads(body)
        events = data if isinstance(data, list) else [data]
        now = time.time()
        g = self.got
        g.copies[msg_id] += 1
        if msg_id not in g.ids:
            g.ids[msg_id] = [e["event_id"] for e in events]
        if self.keep:
            g.kept.extend(events)
        for e in events:
            eid = e["event_id"]
            g.under[eid].add(msg_id)
            if eid not in g.first_at:
                g.first_at[eid] = now
                g.event_ts[eid] = float(e["ts"])
                g.order[str(e.get("object_id", e.get("object")))].append(eid)
        self.arrived.set()
        return 204
