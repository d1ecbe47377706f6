"""A small callback-driven async client of the fence API over AMQP (the server's fence/rpc.py).

    async with FenceClient(amqp_url, token) as client:
        client.request("get", {"fence_id": "f1"}, on_reply)   # on_reply(Reply) when it comes
        reply = await client.call("create", feature=feature)   # or await the reply
        fence = await client.create(feature)                   # or raise FenceApiError
        events = [e async for e in client.all_events("f1")]    # every archived event, page by page

One connection, one channel with publisher confirms; replies come by direct reply-to
(no reply queue to declare or clean up) and are matched on the correlation id. A request
whose reply does not come within its timeout gets a Reply with status 504. `token` is a
Firebase ID token, or a callable returning a fresh one (ID tokens expire after an hour).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange, AbstractIncomingMessage

API_EXCHANGE = "fence.api"  # vhost gf-fences (exchanges/topology.py; a unit test holds them equal)
DIRECT_REPLY_TO = "amq.rabbitmq.reply-to"
TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Reply:
    status: int
    result: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class FenceApiError(RuntimeError):
    def __init__(self, reply: Reply) -> None:
        super().__init__(f"{reply.status}: {reply.error}")
        self.reply = reply


Callback = Callable[[Reply], Any]


class FenceClient:
    def __init__(self, amqp_url: str, token: str | Callable[[], str], timeout: float = TIMEOUT_S) -> None:
        """`amqp_url` points at the gf-fences vhost (a tenant's application user, `geofence app
        add`, or any with write on fence.api)."""
        self.amqp_url, self._token, self.timeout = amqp_url, token, timeout
        self._pending: dict[str, tuple[Callback, asyncio.TimerHandle]] = {}

    async def __aenter__(self) -> FenceClient:
        self._conn: AbstractConnection = await aio_pika.connect(self.amqp_url, timeout=10)
        try:
            self._channel: AbstractChannel = await self._conn.channel(publisher_confirms=True)
            replies = await self._channel.get_queue(DIRECT_REPLY_TO, ensure=False)
            await replies.consume(self._on_reply, no_ack=True)
            self._exchange: AbstractExchange = await self._channel.get_exchange(API_EXCHANGE, ensure=False)
        except BaseException:
            await self._conn.close()
            raise
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        for cid in list(self._pending):
            self._finish(cid, Reply(499, error="client closed before the reply"))
        await self._conn.close()

    def _finish(self, cid: str, reply: Reply) -> None:
        entry = self._pending.pop(cid, None)
        if entry is not None:
            callback, timer = entry
            timer.cancel()
            callback(reply)

    async def _on_reply(self, message: AbstractIncomingMessage) -> None:
        try:
            body = json.loads(message.body)
            reply = Reply(int(body["status"]), body.get("result"), body.get("error"))
        except (ValueError, KeyError, TypeError) as exc:
            reply = Reply(502, error=f"unreadable reply: {exc}")
        self._finish(message.correlation_id or "", reply)

    async def request(self, op: str, args: dict[str, Any], callback: Callback,
                      timeout: float | None = None) -> str:
        """Send a request; `callback(reply)` runs on the event loop when the reply (or the
        timeout, status 504) comes. Returns the correlation id."""
        token = self._token() if callable(self._token) else self._token
        cid = uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        timer = loop.call_later(timeout or self.timeout, self._finish, cid,
                                Reply(504, error=f"no reply within {timeout or self.timeout:g}s"))
        self._pending[cid] = (callback, timer)
        try:
            await self._exchange.publish(
                aio_pika.Message(json.dumps({"op": op, "token": token, **args}).encode(),
                                 content_type="application/json", correlation_id=cid,
                                 reply_to=DIRECT_REPLY_TO,
                                 delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key="", mandatory=True)
        except BaseException:
            entry = self._pending.pop(cid, None)
            if entry is not None:
                entry[1].cancel()
            raise
        return cid

    async def call(self, op: str, timeout: float | None = None, **args: Any) -> Reply:
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        def done(reply: Reply) -> None:
            if not fut.done():
                fut.set_result(reply)

        await self.request(op, args, done, timeout)
        return await fut

    async def _ok(self, op: str, **args: Any) -> Any:
        reply = await self.call(op, **args)
        if not reply.ok:
            raise FenceApiError(reply)
        return reply.result

    # -- the operations -------------------------------------------------------------------

    async def create(self, feature: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await self._ok("create", feature=feature)
        return result

    async def get(self, fence_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._ok("get", fence_id=fence_id)
        return result

    async def replace(self, fence_id: str, body: dict[str, Any],
                      if_match: int | None = None) -> dict[str, Any]:
        result: dict[str, Any] = await self._ok("replace", fence_id=fence_id, body=body,
                                                if_match=None if if_match is None else str(if_match))
        return result

    async def delete(self, fence_id: str, if_match: int | None = None) -> dict[str, Any]:
        result: dict[str, Any] = await self._ok("delete", fence_id=fence_id,
                                                if_match=None if if_match is None else str(if_match))
        return result

    async def list(self, bbox: str | None = None, limit: int = 1000, after: str = "") -> dict[str, Any]:
        result: dict[str, Any] = await self._ok("list", bbox=bbox, limit=limit, after=after)
        return result

    async def objects(self, fence_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._ok("objects", fence_id=fence_id)
        return result

    async def object_fences(self, object_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._ok("object_fences", object_id=object_id)
        return result

    async def events(self, fence_id: str, since: float = 0.0, limit: int = 1000,
                     cursor: str | None = None) -> dict[str, Any]:
        """One page of the fence's archived events: `{"fence_id", "since", "events", "next"}`;
        pass `next` back as `cursor` for the events strictly after it (None: the end)."""
        args: dict[str, Any] = {"fence_id": fence_id, "since": since, "limit": limit}
        if cursor is not None:
            args["cursor"] = cursor
        result: dict[str, Any] = await self._ok("events", **args)
        return result

    async def all_events(self, fence_id: str, since: float = 0.0,
                         limit: int = 1000) -> AsyncIterator[dict[str, Any]]:
        """Every archived event of the fence from `since`, oldest first, each once: the pages
        one after the other, following their `next` cursors (a page of `limit` per request)."""
        cursor: str | None = None
        while True:
            page = await self.events(fence_id, since, limit, cursor)
            for event in page["events"]:
                yield event
            cursor = page.get("next")
            if cursor is None:
                return

    async def loitering(self, fence_id: str, min_s: float = 0.0) -> dict[str, Any]:
        """Who has been inside the fence at least min_s seconds, longest first."""
        result: dict[str, Any] = await self._ok("loitering", fence_id=fence_id, min_s=min_s)
        return result

    # proximity subscriptions (an editor's of the tenant: between its own objects)

    async def subscribe(self, subscription: dict[str, Any], sub_id: str | None = None) -> dict[str, Any]:
        """Create (no id) or change a subscription: {"object", "radius_m", "match", "where"}."""
        result: dict[str, Any] = await self._ok("subscribe", subscription=subscription, id=sub_id)
        return result

    async def subscription(self, sub_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._ok("subscription", id=sub_id)
        return result

    async def subscriptions(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._ok("subscriptions")
        return result

    async def unsubscribe(self, sub_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._ok("unsubscribe", id=sub_id)
        return result
