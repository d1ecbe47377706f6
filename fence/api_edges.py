"""The layers every HTTP request (and the map's websocket) passes before fence/api.py's routes,
outermost first as create_app stacks them: the request's metrics, the rate limits (the shell of
fence/rate_limits.py), the body limit. fence/page_policy.py adds the policy headers around all.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from exchanges.shell import Counters
from fence import problems
from fence.rate_limits import RateLimits, retry_after_header

log = logging.getLogger("geofence")


class BodyLimit:
    """ASGI middleware: a request body over `limit` bytes is answered 413, whether announced
    (Content-Length, refused before reading) or chunked (read until the limit and no
    further). The body is read here whole, at most `limit` bytes, then handed to the app as
    it came in one piece: the app never reads past the limit."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        size = dict(scope["headers"]).get(b"content-length", b"")
        if size.isdigit() and (len(size) > 18 or int(size) > self.limit):  # int() of 5,000 digits raises
            reason = f"body of {size[:30].decode()} bytes; at most {self.limit}"
            await self.refuse(scope, receive, send, reason)
            return
        chunks, total = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: nobody to answer
                return
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.limit:
                await self.refuse(scope, receive, send, f"body over {self.limit} bytes; at most {self.limit}")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body: list[Message] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay() -> Message:
            return body.pop() if body else await receive()  # then: the disconnect, as usual

        await self.app(scope, replay, send)

    @staticmethod
    async def refuse(scope: Scope, receive: Receive, send: Send, reason: str) -> None:
        await problems.response(413, reason, "too-large")(scope, receive, send)


class RequestMetrics:
    """ASGI middleware: each HTTP request's time to its response's start into the histogram
    http_request_seconds, and its status class into http_responses_<n>xx (for /metrics)."""

    def __init__(self, app: ASGIApp, counters: Counters) -> None:
        self.app, self.counters = app, counters

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()

        async def timed(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.counters.observe("http_request_seconds", time.perf_counter() - started)
                self.counters.bump(f"http_responses_{int(message['status']) // 100}xx")
            await send(message)

        await self.app(scope, receive, timed)


class RateLimit:
    """ASGI middleware, the shell of fence/rate_limits.py: before a request or a websocket, the
    client's address (and bearer token) against the limits, a 429 with Retry-After when over
    (a websocket: refused before its handshake completes, which the browser sees as a failed
    connection and retries later); after it, a 401 (a websocket's 4401) counted as a failed
    sign-in of that address. Counted: api_rate_limited, api_sign_in_failures."""

    def __init__(self, app: ASGIApp, limits: RateLimits, counters: Counters | None = None,
                 clock: Any = time.monotonic) -> None:
        self.app, self.limits, self.counters, self.clock = app, limits, counters, clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        address = client[0] if client else "unknown"
        token = _bearer(scope) if scope["type"] == "http" else None
        verdict = self.limits.check(address, token, self.clock())
        if not verdict.allowed:
            self._count("api_rate_limited")
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            wait = retry_after_header(verdict.retry_after)
            await problems.response(429, f"too many {verdict.why}: try again in {wait} s", "rate-limited",
                                    headers={"Retry-After": wait})(scope, receive, send)
            return

        async def watched(message: Message) -> None:
            refused = (message["type"] == "http.response.start" and message["status"] == 401) or (
                message["type"] == "websocket.close" and message.get("code") == 4401)
            if refused:
                if self.limits.failed(address, self.clock()):
                    log.warning("sign-ins from %s refused too often: throttled", address)
                self._count("api_sign_in_failures")
            await send(message)

        await self.app(scope, receive, watched)

    def _count(self, name: str) -> None:
        if self.counters is not None:
            self.counters.bump(name)


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() or None if scheme.lower() == "bearer" else None
    return None
