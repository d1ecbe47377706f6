"""The fence API over AMQP: request / reply on queue fence.api (vhost gf-fences).

A request is a JSON body `{"op": ..., "token": "<Firebase ID token>", ...arguments}` with
`reply_to` (RabbitMQ's direct reply-to, `amq.rabbitmq.reply-to`, needs no queue) and a
`correlation_id`. The reply is `{"status": <HTTP-like status>, "result": ...}` or
`{"status": 4xx/5xx, "error": "..."}` with the request's correlation id. The operations and
their arguments are the HTTP API's (fence/service.py), so both APIs behave the same:

    create {feature}                 get {fence_id}            list {bbox?, limit?, after?}
    replace {fence_id, body, if_match?}   delete {fence_id, if_match?}
    objects {fence_id}   object_fences {object_id}   events {fence_id, since?, limit?, cursor?}

`events` answers a page as over HTTP: `{"fence_id", "since", "events", "next"}`; `next` (null
at the end) goes back as `cursor` for the events strictly after that page.

A request that is not JSON or names no known op is answered with 400 (if it has reply_to)
and dead-lettered with the reason; the queue's batch is acked once every reply is confirmed.
Requests of one batch run concurrently: the service is safe for that.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractIncomingMessage

from exchanges import shell
from exchanges import topology as t
from exchanges.fence_def import shown
from fence.api import Verifier
from fence.auth import AuthUnavailable, Unauthenticated
from fence.service import ApiError, Caller, FenceService

log = logging.getLogger("geofence")


# Arguments are taken as JSON gives them, never coerced: 5 is not fence "5", "10" not a limit
# (the HTTP API's path and query are text, checked by the service and FastAPI).
def _text(a: dict[str, Any], key: str, default: str | None = None) -> str:
    v = a.get(key, default)
    if not isinstance(v, str):
        raise ApiError(400, f"{key} {shown(v)}: a string expected")
    return v


def _optional_text(a: dict[str, Any], key: str) -> str | None:
    """A string, or None when absent or null (a client that sends every argument)."""
    v = a.get(key)
    return None if v is None else _text(a, key)


def _int(a: dict[str, Any], key: str, default: int) -> int:
    v = a.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ApiError(400, f"{key} {shown(v)}: an integer expected")
    return v


def _number(a: dict[str, Any], key: str, default: float) -> float:
    v = a.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ApiError(400, f"{key} {shown(v)}: a number expected")
    return float(v)  # orjson reads no integer beyond 64 bits: float() cannot overflow


async def _unsubscribed(service: FenceService, caller: Caller, sub_id: str) -> dict[str, Any]:
    await service.delete_subscription(caller, sub_id)
    return {"id": sub_id, "deleted": True}


OPS: dict[str, Callable[[FenceService, Caller, dict[str, Any]], Awaitable[dict[str, Any]]]] = {
    "create": lambda s, c, a: s.create(c, a.get("feature")),
    "get": lambda s, c, a: s.get(c, _text(a, "fence_id")),
    "list": lambda s, c, a: s.list(c, a.get("bbox"), _int(a, "limit", 1000), _text(a, "after", "")),
    "replace": lambda s, c, a: s.replace(c, _text(a, "fence_id"), a.get("body"), a.get("if_match")),
    "delete": lambda s, c, a: s.delete(c, _text(a, "fence_id"), a.get("if_match")),
    "objects": lambda s, c, a: s.objects(c, _text(a, "fence_id")),
    "object_fences": lambda s, c, a: s.object_fences(c, _text(a, "object_id")),
    "events": lambda s, c, a: s.events(c, _text(a, "fence_id"), _number(a, "since", 0.0),
                                       _int(a, "limit", 1000), _optional_text(a, "cursor")),
    "query": lambda s, c, a: s.query(c, a.get("query_args")),
    "loitering": lambda s, c, a: s.loitering(c, _text(a, "fence_id"), _number(a, "min_s", 0.0)),
    # proximity subscriptions (an operator's, as over HTTP)
    "subscribe": lambda s, c, a: s.put_subscription(c, a.get("subscription"), a.get("id")),
    "subscription": lambda s, c, a: s.get_subscription(c, _text(a, "id")),
    "subscriptions": lambda s, c, a: s.list_subscriptions(c),
    "unsubscribe": lambda s, c, a: _unsubscribed(s, c, _text(a, "id")),
}
STATUS_OK = {"create": 201}


class RpcServer:
    def __init__(self, service: FenceService, verifier: Verifier, counters: shell.Counters) -> None:
        self.service, self.verifier, self.counters = service, verifier, counters

    def bind(self, channel: AbstractChannel, dlx: AbstractExchange) -> None:
        self.channel, self.dlx = channel, dlx

    async def handle(self, messages: Sequence[AbstractIncomingMessage]) -> None:
        answers = await asyncio.gather(*(self.answer(m) for m in messages))
        outs: list[shell.Out] = []
        for m, (payload, bad) in zip(messages, answers, strict=True):
            if bad is not None:
                outs.append(shell.dead_letter(self.dlx, m, bad, t.API_QUEUE, self.counters))
            out = shell.reply(self.channel, m, payload)
            if out is not None:
                outs.append(out)
        await shell.publish_all(outs, self.counters)

    async def answer(self, m: AbstractIncomingMessage) -> tuple[dict[str, Any], str | None]:
        """(the reply, the dead-letter reason if the request itself is malformed)."""
        try:
            request = orjson.loads(m.body)
            if not isinstance(request, dict):
                raise ValueError("a JSON object expected")
            op = request.get("op")
            if not isinstance(op, str) or op not in OPS:  # a list or an object is unhashable
                raise ValueError(f"unknown op {shown(op)}; known: {', '.join(OPS)}")
        except ValueError as exc:
            reason = f"malformed fence API request: {exc}"
            return {"status": 400, "error": reason}, reason
        self.counters.bump(f"op_{op}")
        try:
            token = request.get("token")
            user = await self.verifier.verify(f"Bearer {token}" if isinstance(token, str) else None)
            asked = request.get("tenant")
            if asked is not None and not isinstance(asked, str):
                raise ApiError(400, f"tenant {shown(asked)}: a string expected")
            caller = await self.service.caller(user.uid, user.claims, asked)
            result = await OPS[op](self.service, caller, request)
            return {"status": STATUS_OK.get(op, 200), "result": result}, None
        except AuthUnavailable as exc:
            return {"status": 503, "error": str(exc)}, None
        except Unauthenticated as exc:
            return {"status": 401, "error": str(exc)}, None
        except ApiError as exc:
            return {"status": exc.status, "error": exc.message}, None
        except (KeyError, TypeError, ValueError) as exc:
            return {"status": 400, "error": f"bad arguments for {op}: {type(exc).__name__}: {exc}"}, None
        except Exception as exc:  # a bug or a backend down: the caller learns, the server lives
            log.exception("fence API op %s failed", op)
            return {"status": 500, "error": f"internal error: {type(exc).__name__}"}, None
