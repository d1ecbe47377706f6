"""The pages' data, behind sign-in (the pages themselves are static files: fence/pages.py).

- `/ops/data`: the pipeline's figures (fence/ops.py), a platform operator's only (the Firebase
  claim `geofence_operator`): 401 without a token, 403 for anyone else.
- `/map/fences`, `/map/objects/{id}`: the live map's fences and an object's last position. A
  tenant's member sees its tenant's, named as the tenant names them; an operator acting in no
  tenant sees every tenant's, ids qualified (`<tenant>:<id>`) so they stay unique; a caller in
  no tenant gets the service's refusal (fence/service.py `Caller.scoped`: no membership,
  several without `X-Geofence-Tenant`).
- `/map/ws`: the live map's frames (fence/map_feed.py). A browser always sends `Origin`: it must
  be this server's own (the scheme and host[:port] of the request's Host header), else the
  socket is closed with 4403 before anything is sent, so no other site's page can open a map
  with a visitor's credentials; no Origin at all is a client that is not a browser, which
  has to sign in like anyone. Then the first message must be `{"token": "<Firebase ID token>",
  "tenant": "<tenant>" | null}` within `SIGN_IN_S`, checked as a request's header would be
  (`app.state.caller_of`); refused: 4401 (no token, a bad or expired one) or 4403 (no tenant,
  not a member, not allowed), with the reason; nothing is sent before. Then the map gets its
  caller's frames (a tenant's: its own objects, counts and events; an operator's in no tenant:
  everything), and the sign-in is checked again every `RECHECK_S` (an expired token: 4401, a
  membership removed: 4403).

Behind a proxy that terminates TLS, the API must know the scheme the browser used (uvicorn's
proxy headers from a trusted proxy), or the Origin check refuses every map.
"""

# No `from __future__ import annotations`: FastAPI reads the route signatures at definition
# time, and the dependency type `who` is the caller's (a local of fence.api.create_app).
import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Any
from urllib.parse import urlsplit

import orjson
from fastapi import FastAPI, Header, Query, WebSocket, WebSocketDisconnect

from exchanges.fence_def import InvalidFence, check_fence_id, shown
from exchanges.ids import OBJECT_ID_RULE, is_object_id
from exchanges.tenancy import is_tenant, qualify, split
from fence import api_models as am
from fence import page_models as pm
from fence.map_feed import MAX_FENCES_PAGE, ClientGone, MapClient, MapFeed
from fence.ops import OpsFigures, Unavailable
from fence.service import OPERATOR_CLAIM, ApiError, Caller

log = logging.getLogger("geofence")

SIGN_IN_S = 10.0  # the map's first message, its sign-in, within this
RECHECK_S = 60.0  # an open map's sign-in checked again (token expiry, membership removed)
MAX_REASON_BYTES = 123  # a websocket close reason (RFC 6455: 125 bytes with the code)
NOT_SIGNED_IN = 4401  # close codes: the HTTP statuses, in the application's range
NOT_ALLOWED = 4403
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
OPS_ONLY = (f"the pipeline's figures are for the platform's operators (a Firebase user with the "
            f"{OPERATOR_CLAIM} claim): sign in as one")

CallerOf = Callable[[str | None, str | None], Awaitable[Caller]]


class Refused(Exception):
    """A map's socket closed by the server (its sign-in refused): the socket's tasks end."""


def map_scope(caller: Caller, asked: str | None = None) -> str | None:
    """Whose map the caller sees: its tenant's, or None (every tenant's) for an operator acting
    in no tenant (and naming none: an operator naming a tenant that is no tenant id is refused,
    not shown everything). ApiError (the service's 403 / 400, with its reason) for a caller in
    no tenant."""
    if caller.operator and not caller.tenant and not asked:
        return None
    return caller.scoped("viewer")


def _origin(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an origin or a URL; None when it is not one."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname or parts.username is not None \
            or parts.password is not None:
        return None
    return scheme, parts.hostname.lower(), port if port is not None else DEFAULT_PORTS[scheme]


def same_origin(origin: str | None, scheme: str, host: str | None) -> bool:
    """Whether a websocket's `Origin` header is this server's own: its scheme (http for ws,
    https for wss) and host[:port] those of the request (`scheme`, the Host header `host`).
    No Origin (a client that is not a browser: browsers always send one) is allowed; "null"
    (a sandboxed page, a file) and anything malformed are not."""
    if origin is None:
        return True
    if host is None:
        return False
    page = _origin(origin)
    if page is None or urlsplit(origin).path not in ("", "/"):
        return False
    own = _origin(f"{'https' if scheme.lower() in ('wss', 'https') else 'http'}://{host}")
    return own is not None and page == own


def _reason(text: str) -> str:
    """A close reason: at most MAX_REASON_BYTES of UTF-8, cut on a character."""
    data = text.encode()
    if len(data) <= MAX_REASON_BYTES:
        return text
    return data[:MAX_REASON_BYTES - 3].decode(errors="ignore") + "..."


async def _refuse(ws: WebSocket, code: int, reason: str) -> None:
    with contextlib.suppress(Exception):  # the client may be gone already
        await ws.close(code=code, reason=_reason(reason))


def add_page_data(app: FastAPI, ops: OpsFigures | None, feed: MapFeed | None) -> None:
    """The pages' data routes on `app` (fence/api.py create_app: its `app.state.who`, the caller
    dependency, and `app.state.caller_of`, a token's caller): /ops/data, /map/fences,
    /map/objects/{id}, /map/ws."""
    _add(app, app.state.who, app.state.caller_of, ops, feed)


def _add(app: FastAPI, who: Any, caller_of: CallerOf, ops: OpsFigures | None, feed: MapFeed | None) -> None:
    @app.get("/ops/data", tags=["operators"], summary="The pipeline's figures (from Prometheus)",
             response_model=None, responses=am.answer(pm.OpsData),
             description="A platform operator's (the Firebase claim `geofence_operator`): 403 for anyone "
                         "else. Per process: up, messages/s, positions/s, events/s, objects, fences, held "
                         "positions; the deepest queues; dead letters by reason (all time and the last 15 "
                         "minutes); device-to-event latency p50 / p99; updates/s, events/s and p99 over the "
                         "last 15 minutes; the alerts firing. 503 when Prometheus does not answer.")
    async def ops_data(caller: who) -> dict[str, Any]:
        if not caller.operator:
            raise ApiError(403, OPS_ONLY)
        if ops is None:
            raise ApiError(503, "no Prometheus configured (GEOFENCE_PROMETHEUS_URL)")
        try:
            return await ops.take()
        except Unavailable as exc:
            raise ApiError(503, str(exc)) from None

    @app.get("/map/fences", tags=["live map"], summary="The live map's fences, a page at a time",
             response_model=None, responses=am.answer(am.FencePage),
             description="GeoJSON FeatureCollection of your tenant's live fences by id (an operator "
                         "acting in no tenant: every tenant's, ids qualified `<tenant>:<id>`); "
                         "`next_after` when there are more.")
    async def map_fences(caller: who, after: str = "",
                         limit: Annotated[int, Query(ge=1, le=MAX_FENCES_PAGE)] = MAX_FENCES_PAGE,
                         x_geofence_tenant: Annotated[str | None, Header(include_in_schema=False)] = None
                         ) -> dict[str, Any]:
        tenant = map_scope(caller, x_geofence_tenant)
        _check_after(after, tenant)
        if feed is None:
            raise ApiError(503, "no map feed in this process")
        return await feed.fences(after, limit, tenant)

    @app.get("/map/objects/{object_id}", tags=["live map"], summary="An object's last position on the map",
             response_model=None, responses=am.answer(pm.MapObject),
             description="One of your tenant's objects (an operator acting in no tenant names any, "
                         "qualified `<tenant>:<id>`).")
    async def map_object(caller: who, object_id: str,
                         x_geofence_tenant: Annotated[str | None, Header(include_in_schema=False)] = None
                         ) -> dict[str, Any]:
        tenant = map_scope(caller, x_geofence_tenant)
        if tenant is not None:
            if not is_object_id(object_id):
                raise ApiError(422, f"object id {shown(object_id)}: {OBJECT_ID_RULE}")
            key = qualify(tenant, object_id)
        else:
            key = object_id
        got = None if feed is None else feed.view.position(key)
        if got is None:
            raise ApiError(404, f"object {object_id!r} is not on the map (no position in the last minutes, "
                                "or no map open to collect them)")
        out: dict[str, Any] = {"object_id": object_id, "lon": got[0], "lat": got[1], "ts": got[2]}
        if tenant is None:
            out["tenant"] = split(key)[0]
        return out

    @app.websocket("/map/ws")
    async def map_ws(ws: WebSocket) -> None:
        origin_ok = same_origin(ws.headers.get("origin"), ws.url.scheme, ws.headers.get("host"))
        await ws.accept()
        if not origin_ok:
            await _refuse(ws, NOT_ALLOWED, "this map's page is served by another origin: "
                                           "open /map on this server")
            return
        if feed is None:
            await _refuse(ws, 1013, "no map feed in this process")
            return
        signed = await _sign_in(ws, caller_of)
        if signed is None:
            return
        token, asked, tenant = signed
        client = feed.join(tenant)
        try:
            async with asyncio.TaskGroup() as tg:
                sender = tg.create_task(_pump(ws, client, feed))
                checker = tg.create_task(_recheck(ws, caller_of, token, asked, tenant))
                await _until_closed(ws)
                sender.cancel()
                checker.cancel()
        except* (WebSocketDisconnect, ClientGone, Refused):
            pass
        finally:
            feed.leave(client)
            with contextlib.suppress(Exception):
                await ws.close(code=1001)


def _check_after(after: str, tenant: str | None) -> None:
    """A page cursor checked before it reaches the store (a fence id as the caller names it)."""
    if after == "":
        return
    owner, name = split(after) if tenant is None else ("", after)
    try:
        check_fence_id(name)
    except InvalidFence as exc:
        raise ApiError(422, f"after: {exc}") from None
    if owner and not is_tenant(owner):
        raise ApiError(422, f"after {shown(after)}: <tenant>:<fence id> or a fence id")


async def _sign_in(ws: WebSocket, caller_of: CallerOf) -> tuple[str, str | None, str | None] | None:
    """The map's sign-in, its first message: (token, the tenant asked, whose map) or None once
    the socket is closed (refused, or the client left)."""
    try:
        message = await asyncio.wait_for(ws.receive(), SIGN_IN_S)
    except TimeoutError:
        await _refuse(ws, NOT_SIGNED_IN, f"no sign-in within {SIGN_IN_S:g} s: the first message is "
                                         '{"token": "<Firebase ID token>", "tenant": ...}')
        return None
    if message["type"] != "websocket.receive":
        return None  # gone
    raw = message.get("text") if message.get("text") is not None else message.get("bytes")
    try:
        body = orjson.loads(raw or b"")
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("token"), str) or not body["token"]:
        await _refuse(ws, NOT_SIGNED_IN, 'sign in first: {"token": "<Firebase ID token>", "tenant": ...}')
        return None
    asked = body.get("tenant") or None
    if asked is not None and not isinstance(asked, str):
        await _refuse(ws, NOT_ALLOWED, f"tenant {shown(asked, 40)}: a tenant id or null")
        return None
    token: str = body["token"]
    try:
        return token, asked, await _scope_of(ws, caller_of, token, asked)
    except Refused:
        return None


async def _scope_of(ws: WebSocket, caller_of: CallerOf, token: str, asked: str | None) -> str | None:
    """Whose map the token's caller sees (`map_scope`); Refused once the socket is closed
    with the reason (4401: the token; 4403: the tenant; 1013 / 1011: the server's trouble)."""
    try:
        return map_scope(await caller_of(token, asked), asked)
    except ApiError as exc:
        code = NOT_SIGNED_IN if exc.status == 401 else 1013 if exc.status >= 500 else NOT_ALLOWED
        await _refuse(ws, code, exc.message)
    except Exception as exc:  # PostgreSQL away (the memberships): the server's trouble, said so
        log.warning("map: could not check a sign-in: %r", exc)
        await _refuse(ws, 1011, "the server could not check your sign-in; try again")
    raise Refused


async def _recheck(ws: WebSocket, caller_of: CallerOf, token: str, asked: str | None,
                   tenant: str | None) -> None:
    """Every RECHECK_S the sign-in again: the same token still valid and the caller still seeing
    the same map; else the socket is closed (4401 / 4403) and Refused ends its tasks."""
    while True:
        await asyncio.sleep(RECHECK_S)
        if await _scope_of(ws, caller_of, token, asked) != tenant:
            await _refuse(ws, NOT_ALLOWED, "your access changed: open the map again")
            raise Refused


async def _pump(ws: WebSocket, client: MapClient, feed: MapFeed) -> None:
    tenant = client.tenant

    def snapshot() -> bytes:
        return feed.snapshot(tenant)

    while True:
        await ws.send_bytes(await client.next(snapshot))


async def _until_closed(ws: WebSocket) -> None:
    """A map sends nothing that matters after its sign-in; this returns when it closes."""
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return
