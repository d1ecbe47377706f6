"""The fence API over HTTP (FastAPI; OpenAPI at /openapi.json, docs at /docs).

A thin shell: authenticate (Firebase ID token, fence/auth.py), place the caller in its tenant
(`X-Geofence-Tenant` when it is a member of several), call fence/service.py, map its ApiError
to the status. Every route but /health, /docs, /openapi.json, the message schemas (/schemas)
and the public venue reads (/hives) needs `Authorization: Bearer <Firebase ID token>`; fences,
objects and subscriptions belong to the caller's tenant.
"""

# No `from __future__ import annotations` here: FastAPI reads the route signatures at
# definition time, and the dependency alias `Who` is local to create_app.
import logging
import time
import traceback
from typing import Annotated, Any, Protocol

import asyncpg
import orjson
from fastapi import Body, Depends, FastAPI, Header, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from exchanges.shell import Counters
from exchanges.tenancy import name_of
from exchanges.text import TextError, check_id
from exchanges.x_geo import queries
from fence import api_models as am
from fence import page_models as pm
from fence import problems
from fence.api_edges import BodyLimit, RateLimit, RequestMetrics
from fence.api_schemas import add_schema_routes
from fence.auth import AuthUnavailable, Unauthenticated, User
from fence.rate_limits import RateLimits
from fence.service import MAX_EVENTS, MAX_LIST, ApiError, Caller, FenceService, parse_bbox
from fence.store import MAX_CURSOR_CHARS
from fence.tenant_routes import add_tenant_routes
from fence.venues import owner_store as os_
from fence.venues import user_store as us
from fence.venues.commands import SensorCommands
from fence.venues.hive_index import MAX_RADIUS_M, MAX_RESULTS, SearchError
from fence.venues.reads import Unavailable, VenueReads
from fence.webhook_routes import add_webhook_routes

log = logging.getLogger("geofence")


class GeoJSONResponse(JSONResponse):
    """A fence (a Feature) or a page of them (a FeatureCollection), as RFC 7946 names it."""

    media_type = "application/geo+json"
WHERE_HELP = ('conditions on the positions\' extra fields, JSON: [["type", "==", "truck"], '
              '["speed", ">", 20]] (ops == != < <= > >= in between)')
STORE_RETRY_AFTER_S = 5  # a 503 while PostgreSQL is away: when to try again


def _where(raw: str | None) -> Any:
    if raw is None:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(422, f"where is not JSON: {exc}") from None


MAX_BODY_BYTES = 4 * 1024 * 1024  # a 10,000-vertex polygon is ~400 kB of GeoJSON

FEATURE_EXAMPLE = {
    "type": "Feature",
    "id": "vaduz-centre",
    "properties": {"name": "Vaduz centre", "timeout_s": 300},
    "geometry": {"type": "Polygon", "coordinates": [[[9.518, 47.137], [9.525, 47.137], [9.525, 47.143],
                                                     [9.518, 47.143], [9.518, 47.137]]]},
}
FOLLOW_EXAMPLE = {"follow": "car-0042", "radius_m": 150}
EVENT_SCHEMA = {
    "type": "object",
    "properties": {
        "event_id": {"type": "string", "description": "stable id: an event delivered twice is stored once"},
        "fence_id": {"type": "string"},
        "object_id": {"type": "string"},
        "event": {"type": "string", "enum": ["enter", "leave", "cross"]},
        "reason": {"type": "string"},
        "ts": {"type": "number", "description": "epoch seconds"},
        "visit_id": {"type": ["string", "null"], "description": "shared by a stay's ENTER and LEAVE"},
        "inside_s": {"type": ["number", "null"],
                     "description": "a LEAVE's (or a dwelled ENTER's) seconds inside"},
    },
}
EVENTS_PAGE_SCHEMA = {
    "type": "object",
    "title": "EventsPage",
    "required": ["fence_id", "since", "events", "next"],
    "properties": {
        "fence_id": {"type": "string"},
        "since": {"type": "number", "description": "the request's since"},
        "events": {"type": "array", "items": EVENT_SCHEMA, "description": "oldest first, by (ts, event_id)"},
        "next": {"type": ["string", "null"],
                 "description": "an opaque cursor: pass it as `cursor` for the next page; null at the end"},
    },
}
SUBSCRIPTION_EXAMPLE = {"object": "car-0042", "radius_m": 300, "match": "truck-*",
                        "where": [["speed", ">", 20]]}


class Verifier(Protocol):
    async def verify(self, authorization: str | None) -> User: ...


def create_app(service: FenceService, verifier: Verifier, health: Any = None,
               venues: VenueReads | None = None, commands: SensorCommands | None = None,
               counters: Counters | None = None, limits: RateLimits | None = None) -> FastAPI:
    app = FastAPI(
        title="geofence fence API",
        version="1",
        description="Create, move, delete and inspect your tenant's fences; read their live occupants "
                    "and archived events. Authenticate with a Firebase ID token (`Authorization: Bearer "
                    "...`); a member of several tenants names one with `X-Geofence-Tenant`. Events "
                    "stream on RabbitMQ to the tenant's applications (exchange `fence.events`, key "
                    "`fence-events.<tenant>.<fence_id>.<enter|leave|cross>.<object_id>`, one message per "
                    "event; exchange `fence.tenant-batches`, key `<tenant>`, its events in batches); this "
                    "API is the control side. Errors are RFC 9457 problem details "
                    "(`application/problem+json`).",
        responses=problems.RESPONSES,
        # an operation's id is its function's name: a generated client's calls read `get_fence`
        generate_unique_id_function=lambda route: route.name,
    )

    openapi = app.openapi
    app.openapi = lambda: problems.retyped(openapi())  # type: ignore[method-assign]
    am.document(app)

    async def caller(authorization: Annotated[str | None, Header()] = None,
                     x_geofence_tenant: Annotated[str | None, Header(
                         description="the tenant to act in (a member of several names one)")] = None
                     ) -> Caller:
        try:
            user = await verifier.verify(authorization)
        except AuthUnavailable as exc:  # our side: the token service is unreachable
            raise ApiError(503, str(exc)) from None
        except Unauthenticated as exc:
            raise ApiError(401, str(exc)) from None
        return await service.caller(user.uid, user.claims, x_geofence_tenant)

    Who = Annotated[Caller, Depends(caller)]

    async def caller_of(token: str | None, tenant: str | None) -> Caller:
        """The caller of a token given another way than a header (a websocket's first message)."""
        return await caller(f"Bearer {token}" if token else None, tenant)

    # for the routes other modules add (fence/page_data.py): the caller dependency, and the
    # caller of a token a websocket sends
    app.state.who = Who
    app.state.caller_of = caller_of

    # every error answer is a problem (RFC 9457, fence/problems.py), `error` kept beside `detail`
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": 'Bearer realm="geofence"'} if exc.status == 401 else None
        return problems.response(exc.status, exc.message, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # FastAPI's own: no such route (404), a method it does not take (405)
        return problems.response(exc.status_code, str(exc.detail), headers=exc.headers)

    @app.exception_handler(asyncpg.DataError)
    async def data_refused(request: Request, exc: asyncpg.DataError) -> JSONResponse:
        # a value the checks let through and PostgreSQL refused (a NUL in a path parameter, a
        # string too long for its column): the caller's mistake, said, not a 500
        log.warning("%s %s: PostgreSQL refused a value: %s", request.method, request.url.path, exc)
        return problems.response(422, f"a value was refused: {str(exc)[:200]}", "refused-value")

    @app.exception_handler(OSError)
    @app.exception_handler(asyncpg.PostgresConnectionError)
    @app.exception_handler(asyncpg.InterfaceError)
    @app.exception_handler(asyncpg.exceptions.OperatorInterventionError)  # (routing_store.STORE_AWAY)
    async def store_away(request: Request, exc: Exception) -> JSONResponse:
        # PostgreSQL away (stopped, restarting, unreachable): our side, for a while; the
        # request's transaction did not commit unless it had before the connection went
        store = not isinstance(exc, OSError) or any(
            "asyncpg" in f.filename for f in traceback.extract_tb(exc.__traceback__))
        what = "the fence store (PostgreSQL)" if store else "a service this request needs"
        log.warning("%s %s: %s is unreachable: %s: %s", request.method, request.url.path, what,
                    type(exc).__name__, exc)
        return problems.response(503, f"{what} is unreachable: try again shortly", "unavailable",
                                 headers={"Retry-After": str(STORE_RETRY_AFTER_S)})

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return problems.response(422, f"{where}: {first.get('msg', 'invalid request')}", "validation",
                                 errors=[{"loc": e.get("loc"), "msg": e.get("msg")} for e in errors])

    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)
    if limits is not None:  # outside the body limit: a throttled client's body is never read
        app.add_middleware(RateLimit, limits=limits, counters=counters)
    if counters is not None:
        app.add_middleware(RequestMetrics, counters=counters)

    def tagged(response: Response, result: dict[str, Any]) -> dict[str, Any]:
        version = (result.get("properties") or {}).get("version")
        if version is not None:
            response.headers["ETag"] = f'"{version}"'
        return result

    @app.get("/health", tags=["service"], summary="Liveness (no authentication)",
             response_model=None, responses=am.answer(am.Health))
    async def get_health() -> dict[str, Any]:
        return {"ok": True, **(health() if health else {})}

    @app.post("/fences", status_code=201, tags=["fences"], response_class=GeoJSONResponse,
              summary="Create a fence from a GeoJSON Feature (Polygon or MultiPolygon)",
              response_model=None, responses=am.answer(am.Fence, 201), openapi_extra=am.body(am.FenceIn))
    async def post_fence(who: Who, response: Response,
                         body: Annotated[dict[str, Any], Body(openapi_examples={
                             "polygon": {"value": FEATURE_EXAMPLE}})]) -> dict[str, Any]:
        result = await service.create(who, body)
        response.headers["Location"] = f"/fences/{result['id']}"
        return tagged(response, result)

    @app.get("/fences", tags=["fences"], summary="Your fences, optionally those meeting a bbox",
             response_class=GeoJSONResponse, response_model=None, responses=am.answer(am.FencePage))
    async def list_fences(who: Who,
                          bbox: Annotated[str | None,
                                          Query(description="min_lon,min_lat,max_lon,max_lat")] = None,
                          limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = MAX_LIST,
                          after: Annotated[str, Query(description="page after this fence id")] = ""
                          ) -> dict[str, Any]:
        return await service.list(who, bbox, limit, after)

    @app.get("/fences/{fence_id}", tags=["fences"], summary="One fence (ETag: its version)",
             response_class=GeoJSONResponse, response_model=None, responses=am.answer(am.Fence))
    async def get_fence(who: Who, fence_id: str, response: Response) -> dict[str, Any]:
        return tagged(response, await service.get(who, fence_id))

    @app.put("/fences/{fence_id}", tags=["fences"], response_class=GeoJSONResponse,
             response_model=None, responses=am.answer(am.Fence),
             openapi_extra=am.body(am.FenceIn, am.FollowIn),
             summary="Replace / move a fence, or attach it to an object it then follows",
             description="A GeoJSON Feature replaces the geometry (and stops following); "
                         "`{\"follow\": object_id, \"radius_m\": metres}` makes the fence a circle that "
                         "moves with the object. `If-Match: \"<version>\"` refuses the change (409) if "
                         "the fence changed since that version.")
    async def put_fence(who: Who, fence_id: str, response: Response,
                        body: Annotated[dict[str, Any], Body(openapi_examples={
                            "move": {"value": FEATURE_EXAMPLE}, "follow": {"value": FOLLOW_EXAMPLE}})],
                        if_match: Annotated[str | None, Header()] = None) -> dict[str, Any]:
        return tagged(response, await service.replace(who, fence_id, body, if_match))

    @app.delete("/fences/{fence_id}", tags=["fences"], response_model=None,
                responses=am.answer(am.FenceDeleted),
                summary="Delete a fence (objects inside get LEAVE fence_deleted)")
    async def delete_fence(who: Who, fence_id: str,
                           if_match: Annotated[str | None, Header()] = None) -> dict[str, Any]:
        return await service.delete(who, fence_id, if_match)

    @app.get("/fences/{fence_id}/objects", tags=["live state"], response_model=None,
             responses=am.answer(am.FenceOccupants),
             summary="Who is inside the fence now (from its x-fence worker)")
    async def fence_objects(who: Who, fence_id: str) -> dict[str, Any]:
        return await service.objects(who, fence_id)

    @app.get("/fences/{fence_id}/loitering", tags=["live state"], response_model=None,
             responses=am.answer(am.Loitering),
             summary="The loitering report: who has been inside the fence at least min_s seconds")
    async def fence_loitering(who: Who, fence_id: str,
                              min_s: Annotated[float, Query(ge=0, le=365 * 86400,
                                                            description="seconds inside, at least")] = 0.0,
                              ) -> dict[str, Any]:
        return await service.loitering(who, fence_id, min_s)

    @app.get("/fences/{fence_id}/events", tags=["events"],
             summary="The fence's archived events, a page at a time",
             description="Oldest first, in the order (ts, event_id). A page holds at most `limit` events; "
                         "`next` is an opaque cursor while more follow (null at the end): ask again with "
                         "`cursor=<next>` (and the same `since`) for the events strictly after this page, "
                         "so events sharing one ts (a delete's LEAVEs, a creation's ENTERs) are paged "
                         "through, each once. A cursor this API did not give for this fence is a 400.",
             responses={200: {"description": "A page of events",
                              "content": {"application/json": {"schema": EVENTS_PAGE_SCHEMA}}},
                        400: {"description": "a malformed or altered cursor, or another fence's"}})
    async def fence_events(who: Who, fence_id: str,
                           since: Annotated[float, Query(description="epoch seconds, inclusive: where "
                                                                     "the first page starts")] = 0.0,
                           limit: Annotated[int, Query(ge=1, le=MAX_EVENTS)] = 1000,
                           cursor: Annotated[str | None, Query(
                               description="the previous page's `next` (opaque, at most "
                                           f"{MAX_CURSOR_CHARS} characters): continue strictly after it")
                           ] = None
                           ) -> dict[str, Any]:
        return await service.events(who, fence_id, since, limit, cursor)

    @app.get("/objects/within", tags=["live state"], response_model=None, responses=am.answer(am.ObjectsPage),
             summary="Your tenant's objects last seen in a bbox, or within one of its fences")
    async def objects_within(
            who: Who,
            bbox: Annotated[str | None, Query(description="min_lon,min_lat,max_lon,max_lat")] = None,
            fence_id: Annotated[str | None, Query(description="one of your fences")] = None,
            limit: Annotated[int, Query(ge=1, le=queries.MAX_LIMIT)] = 1000,
            after: Annotated[str, Query(description="the previous page's next_after")] = "",
            where: Annotated[str | None, Query(description=WHERE_HELP)] = None
    ) -> dict[str, Any]:
        if (bbox is None) == (fence_id is None):
            raise ApiError(422, "give bbox or fence_id")
        if fence_id is not None:
            return await service.query(who, {"fence_id": fence_id, "limit": limit, "after": after,
                                             "where": _where(where)})
        box = list(parse_bbox(bbox) or ())
        return await service.query(who, {"query": "bbox", "bbox": box, "limit": limit, "after": after,
                                         "where": _where(where)})

    @app.post("/objects/within", tags=["live state"], response_model=None,
              responses=am.answer(am.ObjectsPage),
              openapi_extra=am.body(am.Polygon, am.MultiPolygon),
              summary="Your tenant's objects last seen strictly inside a GeoJSON polygon")
    async def objects_within_shape(who: Who, body: Annotated[Any, Body()],
                                   limit: Annotated[int, Query(ge=1, le=queries.MAX_LIMIT)] = 1000,
                                   after: str = "",
                                   where: Annotated[str | None, Query(description=WHERE_HELP)] = None
                                   ) -> dict[str, Any]:
        shape = body.get("geometry", body) if isinstance(body, dict) else body
        return await service.query(who, {"query": "within", "shape": shape, "limit": limit, "after": after,
                                         "where": _where(where)})

    @app.get("/objects/nearby", tags=["live state"], response_model=None, responses=am.answer(am.ObjectsPage),
             summary="Your tenant's objects last seen nearest a point, within a radius")
    async def objects_nearby(who: Who, lon: float, lat: float, radius_m: float,
                             limit: Annotated[int, Query(ge=1, le=queries.MAX_LIMIT)] = 100,
                             where: Annotated[str | None, Query(description=WHERE_HELP)] = None
                             ) -> dict[str, Any]:
        return await service.query(who, {"query": "nearby", "point": [lon, lat], "radius_m": radius_m,
                                         "limit": limit, "where": _where(where)})

    @app.get("/objects/{object_id}/fences", tags=["live state"], response_model=None,
             responses=am.answer(am.ObjectFences),
             summary="Which of your fences the object is in now (from every x-fence worker)")
    async def object_fences(who: Who, object_id: str) -> dict[str, Any]:
        return await service.object_fences(who, object_id)

    @app.post("/subscriptions", status_code=201, tags=["proximity"], response_model=None,
              responses=am.answer(am.Subscription, 201), openapi_extra=am.body(am.SubscriptionIn),
              summary="Subscribe to your tenant's objects coming near one of them (an editor's)",
              description="`{\"object\": id, \"radius_m\": metres, \"match\": glob on the other ids, "
                          "\"where\": filters}`: `nearby` / `faraway` events on fence.events with key "
                          "`roam-events.<tenant>.<subscription>.<nearby|faraway>.<object>` (an application "
                          "of the tenant binds `roam-events.<tenant>.<subscription>.#`).")
    async def post_subscription(who: Who, response: Response,
                                body: Annotated[dict[str, Any], Body(openapi_examples={
                                    "meet": {"value": SUBSCRIPTION_EXAMPLE}})]) -> dict[str, Any]:
        result = await service.put_subscription(who, body)
        response.headers["Location"] = f"/subscriptions/{result['id']}"
        return result

    @app.put("/subscriptions/{sub_id}", tags=["proximity"], summary="Create or change a subscription",
             response_model=None, responses=am.answer(am.Subscription),
             openapi_extra=am.body(am.SubscriptionIn))
    async def put_subscription(who: Who, sub_id: str,
                               body: Annotated[dict[str, Any], Body()]) -> dict[str, Any]:
        return await service.put_subscription(who, body, sub_id)

    @app.get("/subscriptions", tags=["proximity"], summary="Your proximity subscriptions",
             response_model=None, responses=am.answer(am.SubscriptionList))
    async def list_subscriptions(who: Who) -> dict[str, Any]:
        return await service.list_subscriptions(who)

    @app.get("/subscriptions/{sub_id}", tags=["proximity"], summary="One of your subscriptions",
             response_model=None, responses=am.answer(am.Subscription))
    async def get_subscription(who: Who, sub_id: str) -> dict[str, Any]:
        return await service.get_subscription(who, sub_id)

    @app.delete("/subscriptions/{sub_id}", status_code=204, tags=["proximity"],
                summary="Delete a subscription (it reports nothing more)")
    async def delete_subscription(who: Who, sub_id: str) -> None:
        await service.delete_subscription(who, sub_id)

    add_tenant_routes(app, service.manager.pool, Who, service)
    add_webhook_routes(app, service.manager.pool, Who)
    add_schema_routes(app)
    if venues is not None:
        add_venue_routes(app, venues)
        add_user_routes(app, venues, Who)
        add_owner_routes(app, venues, commands, Who)
    return app


async def run(call: Any) -> Any:
    """A venue store call, its UserError answered with its status."""
    try:
        return await call
    except us.UserError as exc:
        raise ApiError(exc.status, exc.message) from None


def _hive_in(caller: Caller, body: Any) -> Any:
    """A hive's body with its fence named in the caller's tenant (an editor's fence)."""
    if isinstance(body, dict) and body.get("fence_id") is not None:
        try:
            fence_id = check_id(body["fence_id"], "fence_id")
        except TextError as exc:
            raise ApiError(422, str(exc)) from None
        caller.scoped("editor")
        return {**body, "fence_id": caller.name(fence_id)}
    return body


def _hive_out(h: dict[str, Any]) -> dict[str, Any]:
    if isinstance(h.get("fence_id"), str):
        return {**h, "fence_id": name_of(h["fence_id"])}
    return h


def add_owner_routes(app: FastAPI, venues: VenueReads, commands: SensorCommands | None, who: Any) -> None:
    """A venue owner's hives, sensors and sensor configurations (`/owner/...`, a token needed)."""
    pool = venues.pool

    @app.post("/owner/hives", status_code=201, tags=["venue owners"], summary="Add a hive you own",
              response_model=None, responses=am.answer(am.HiveStored, 201),
              openapi_extra=am.body(am.HiveIn),
              description="`{id, name, type, lon, lat, tz, address?, reset_hour?, opening_hours?, capacity?, "
                          "fence_id?}`: tz an IANA zone (sensors' legacy frames are its local time), "
                          "reset_hour the local hour the day's count starts again (4), fence_id one of your "
                          "fences (phones inside it give the app's occupancy figure).")
    async def add_hive(caller: who, response: Response, body: Annotated[Any, Body()]) -> dict[str, Any]:
        h: dict[str, Any] = _hive_out(await run(os_.put_hive(pool, caller.uid, _hive_in(caller, body))))
        await venues.invalidate_index()
        response.headers["Location"] = f"/hives/{h['id']}"
        return h

    @app.put("/owner/hives/{hive_id}", tags=["venue owners"], summary="Change a hive of yours",
             response_model=None, responses=am.answer(am.HiveStored), openapi_extra=am.body(am.HiveIn))
    async def put_hive(caller: who, hive_id: str, body: Annotated[Any, Body()]) -> dict[str, Any]:
        h: dict[str, Any] = _hive_out(
            await run(os_.put_hive(pool, caller.uid, _hive_in(caller, body), hive_id)))
        await venues.invalidate_index()
        return h

    @app.get("/owner/hives", tags=["venue owners"], summary="Your hives and how busy they are",
             response_model=None, responses=am.answer(am.OwnedHives))
    async def owner_hives(caller: who) -> dict[str, Any]:
        return {"hives": await os_.my_hives(pool, caller.uid)}

    @app.get("/owner/hives/{hive_id}/sensors", tags=["venue owners"], response_model=None,
             responses=am.answer(pm.OwnerSensors),
             summary="A hive's sensors: last report, battery, signal, configuration, silent / low battery")
    async def owner_sensors(caller: who, hive_id: str) -> dict[str, Any]:
        return {"sensors": await run(os_.sensors(pool, caller.uid, hive_id))}

    @app.get("/owner/hives/{hive_id}/analytics", tags=["venue owners"], response_model=None,
             responses=am.answer(pm.HiveAnalytics),
             summary="A hive's days by hour (sensors and phones), popular times and forecast",
             description="From the nightly occupancy-analytics job: `days` business days up to the "
                         "latest computed, each local hour's entries, exits, mean and peak occupancy "
                         "(drift-corrected) beside the phones inside the hive's fence; the 7 x 24 "
                         "weekday-by-hour profile; the forecast of each of those days and of the next, "
                         "beside what happened.")
    async def owner_analytics(caller: who, hive_id: str,
                              days: Annotated[int, Query(ge=1, le=os_.MAX_ANALYTICS_DAYS)] = 14
                              ) -> dict[str, Any]:
        got: dict[str, Any] = await run(os_.analytics(pool, caller.uid, hive_id, days))
        return got

    @app.post("/owner/sensors/{sensor_id}/config", status_code=202, tags=["venue owners"],
              response_model=None, responses=am.answer(am.ConfigSent, 202),
              openapi_extra=am.body(am.SensorConfigIn),
              summary="Send a sensor a configuration (applied once its next status carries the id)",
              description="`{threshold_cm, reporting_interval_min, status_interval_min, event_threshold}`; "
                          "published on MQTT commands/sensor/<sensor_id> (12 bytes).")
    async def owner_config(caller: who, sensor_id: str, body: Annotated[Any, Body()]) -> dict[str, Any]:
        if commands is None:
            raise ApiError(503, "sensor commands are not configured on this server")
        config = await run(os_.new_config(pool, caller.uid, sensor_id, body))
        try:
            await commands.send(sensor_id, config.encode())
        except Exception as exc:  # the broker: the configuration stays pending, unsent
            raise ApiError(503, f"the broker did not take the configuration: {exc!r}") from None
        await os_.config_sent(pool, sensor_id, config.configuration_id)
        return {"configuration_id": config.configuration_id, "state": "pending"}


def add_user_routes(app: FastAPI, venues: VenueReads, who: Any) -> None:
    """An app user's favourites, notifications and device tokens (`/me/...`, a token needed)."""
    pool = venues.pool

    @app.get("/me/hives", tags=["app users"], summary="Your favourite and recently viewed hives",
             response_model=None, responses=am.answer(am.MyHives))
    async def my_hives(caller: who) -> dict[str, Any]:
        return await us.my_hives(pool, caller.uid)

    @app.put("/me/favourites/{hive_id}", status_code=204, tags=["app users"], summary="Favourite a hive")
    async def favourite(caller: who, hive_id: str) -> None:
        await run(us.set_favourite(pool, caller.uid, hive_id, True))

    @app.delete("/me/favourites/{hive_id}", status_code=204, tags=["app users"],
                summary="Unfavourite a hive")
    async def unfavourite(caller: who, hive_id: str) -> None:
        await run(us.set_favourite(pool, caller.uid, hive_id, False))

    @app.post("/me/hives/{hive_id}/viewed", status_code=204, tags=["app users"],
              summary="Record a hive as recently viewed")
    async def viewed(caller: who, hive_id: str) -> None:
        await run(us.viewed(pool, caller.uid, hive_id))

    @app.get("/me/notifications", tags=["app users"], summary="Your occupancy notifications",
             response_model=None, responses=am.answer(am.Notifications))
    async def my_notifications(caller: who) -> dict[str, Any]:
        return {"notifications": await us.definitions(pool, caller.uid)}

    @app.post("/me/notifications", status_code=201, tags=["app users"], response_model=None,
              responses=am.answer(am.Notification, 201), openapi_extra=am.body(am.NotificationIn),
              summary="Be told when a hive goes above (or below) a number of people",
              description="`{\"hive_id\", \"threshold\": people, \"direction\": \"above\" | \"below\", "
                          "\"quiet_start\": \"22:00\", \"quiet_end\": \"08:00\"}` (quiet hours in the "
                          "hive's local time, optional). Once per crossing, with hysteresis and a cool-down.")
    async def add_notification(caller: who, body: Annotated[Any, Body()]) -> dict[str, Any]:
        added: dict[str, Any] = await run(us.add_definition(pool, caller.uid, body))
        return added

    @app.delete("/me/notifications/{def_id}", status_code=204, tags=["app users"],
                summary="Stop a notification")
    async def remove_notification(caller: who, def_id: int) -> None:
        await run(us.remove_definition(pool, caller.uid, def_id))

    @app.post("/me/device-tokens", status_code=204, tags=["app users"],
              openapi_extra=am.body(am.DeviceTokenIn),
              summary="Register this device's FCM token (`{\"token\", \"platform\"}`)")
    async def add_token(caller: who, body: Annotated[dict[str, Any], Body()]) -> None:
        await run(us.add_token(pool, caller.uid, body.get("token"), body.get("platform")))

    @app.delete("/me/device-tokens/{token}", status_code=204, tags=["app users"],
                summary="Forget a device token")
    async def remove_token(caller: who, token: str) -> None:
        await run(us.remove_token(pool, caller.uid, token))


def add_venue_routes(app: FastAPI, venues: VenueReads) -> None:
    """The public venue reads (fence/venues/reads.py): no token, memcached first."""

    @app.get("/hives", tags=["venues"], summary="Hives by proximity, type and name, with live occupancy",
             response_model=None, responses=am.answer(am.HivePage),
             description="Public (no token). `near=lon,lat` and `radius_m` (default 1000, at most "
                         f"{MAX_RADIUS_M:g}) sort by distance; `type` (restaurant, bar, cafe, shop, "
                         "supermarket, other) and `q` (words of the name, any case or accent) filter. "
                         "Occupancy is at most a minute or two old (see docs/reference.md).")
    async def list_hives(near: Annotated[str | None, Query(description="lon,lat")] = None,
                         radius_m: Annotated[float | None, Query(gt=0, le=MAX_RADIUS_M)] = None,
                         type: Annotated[str | None, Query(max_length=32)] = None,
                         q: Annotated[str | None, Query(max_length=100)] = None,
                         limit: Annotated[int, Query(ge=1, le=MAX_RESULTS)] = 50) -> dict[str, Any]:
        try:
            return await venues.hives(near, radius_m, type, q, limit, time.time())
        except SearchError as exc:
            raise ApiError(422, str(exc)) from None
        except Unavailable as exc:
            raise ApiError(503, str(exc)) from None

    @app.get("/hives/{hive_id}", tags=["venues"], summary="One hive and how busy it is now (public)",
             response_model=None, responses=am.answer(am.Hive))
    async def get_hive(hive_id: str) -> dict[str, Any]:
        try:
            found = await venues.hive(hive_id, time.time())
        except Unavailable as exc:
            raise ApiError(503, str(exc)) from None
        if found is None:
            raise ApiError(404, f"no hive {hive_id!r}")
        return found
