"""The webhooks' HTTP routes (`/webhooks...`): a tenant's admins add, read, enable, rotate and
remove its endpoints, read and replay what was given up. The secret is shown once, in the answer
to `POST /webhooks` (and to a rotation). An endpoint of another tenant is a 404, whether it
exists or not. A URL must be a public HTTPS address: a private one is for the operator to allow
(`geofence webhook add --local`), never through the API.
"""

# No `from __future__ import annotations`: FastAPI reads the route signatures at definition time.
import contextlib
from collections.abc import Iterator
from typing import Annotated, Any

import asyncpg
from fastapi import Body, FastAPI, Query, Response

from fence import webhook_models as m
from fence.service import ApiError
from fence.webhooks import endpoints, notices, signing, store
from fence.webhooks.endpoints import ENDPOINT_ID_RE, InvalidEndpoint

EXAMPLE = {"url": "https://dispatch.example.com/geofence", "fences": ["depot"], "kinds": ["enter", "leave"],
           "batch": 1, "description": "dispatcher backend"}
DESCRIPTION = (
    "`{\"url\": https URL, \"fences\"?: [fence ids], \"kinds\"?: [enter|leave|cross|nearby|faraway], "
    "\"objects\"?: [object ids], \"batch\"?: 1-500, \"timeout_s\"?: 0.5-30, \"retry_for_s\"?: 1-259200, "
    "\"description\"?: text}` (an empty or absent filter: every one). Each of the tenant's events it "
    "wants is POSTed as it comes (the event's JSON, exchanges/schemas/event.schema.json or "
    "proximity-event.schema.json; with `batch` > 1, a JSON array of up to `batch` events), signed "
    "by the Standard Webhooks scheme (`webhook-id`, `webhook-timestamp`, `webhook-signature`: "
    "`v1,<base64 HMAC-SHA256 of id.timestamp.body>` under the secret returned here, once). At least "
    "once, in order per object; a retry keeps its `webhook-id`. A failure is retried with "
    "exponential backoff for `retry_for_s` (default a day), then given up (`GET "
    "/webhooks/{id}/dead`); an endpoint answering 410, or failing every attempt for 3 days, is "
    "disabled. At most 20 endpoints per tenant.")


@contextlib.contextmanager
def _found() -> Iterator[None]:
    """An endpoint of another tenant, or none: the one 404."""
    try:
        yield
    except store.UnknownEndpoint as exc:
        raise ApiError(404, str(exc)) from None


def _check_id(endpoint_id: str) -> None:
    if not ENDPOINT_ID_RE.fullmatch(endpoint_id):
        raise ApiError(404, f"no webhook endpoint {endpoint_id[:40]!r}")


def add_webhook_routes(app: FastAPI, pool: asyncpg.Pool, who: Any) -> None:
    """The `/webhooks` routes on `app`; `who` is the dependency type of the authenticated Caller."""

    async def shown(conn: asyncpg.Connection, tenant: str, endpoint_id: str) -> dict[str, Any]:
        with _found():
            ep = await store.get(conn, tenant, endpoint_id)
            st = await store.stats(conn, tenant, endpoint_id)
        return {**ep.public(), "delivery": st.to_json()}

    @app.post("/webhooks", status_code=201, tags=["webhooks"], response_model=m.WebhookCreated,
              summary="Add an HTTPS endpoint for your tenant's events (an admin's)", description=DESCRIPTION)
    async def post_webhook(caller: who, response: Response,
                           body: Annotated[m.WebhookIn, Body(openapi_examples={
                               "dispatch": {"value": EXAMPLE}})]) -> dict[str, Any]:
        tenant = caller.scoped("admin")
        secret = signing.new_secret()
        try:
            ep = endpoints.from_request(body.model_dump(exclude_none=True), store.new_id(), tenant, secret)
        except InvalidEndpoint as exc:
            raise ApiError(422, str(exc)) from None
        async with pool.acquire() as conn:
            try:
                await store.create(conn, ep)
            except store.TooManyEndpoints as exc:
                raise ApiError(409, str(exc)) from None
        response.headers["Location"] = f"/webhooks/{ep.id}"
        return {**ep.public(), "secret": secret}

    @app.get("/webhooks", tags=["webhooks"], response_model=m.WebhookList,
             summary="Your tenant's webhook endpoints (an admin's)")
    async def list_webhooks(caller: who) -> dict[str, Any]:
        tenant = caller.scoped("admin")
        async with pool.acquire() as conn:
            return {"webhooks": [ep.public() for ep in await store.listed(conn, tenant)]}

    @app.get("/webhooks/{endpoint_id}", tags=["webhooks"], response_model=m.WebhookShown,
             summary="One endpoint and its delivery: events waiting, given up, the last error")
    async def get_webhook(caller: who, endpoint_id: str) -> dict[str, Any]:
        tenant = caller.scoped("admin")
        _check_id(endpoint_id)
        async with pool.acquire() as conn:
            return await shown(conn, tenant, endpoint_id)

    @app.delete("/webhooks/{endpoint_id}", status_code=204, tags=["webhooks"],
                summary="Remove an endpoint (its undelivered events with it)")
    async def delete_webhook(caller: who, endpoint_id: str) -> None:
        tenant = caller.scoped("admin")
        _check_id(endpoint_id)
        async with pool.acquire() as conn:
            with _found():
                await store.remove(conn, tenant, endpoint_id)

    @app.post("/webhooks/{endpoint_id}/enable", tags=["webhooks"], response_model=m.WebhookShown,
              summary="Enable a disabled endpoint: its waiting events are delivered again")
    async def enable_webhook(caller: who, endpoint_id: str) -> dict[str, Any]:
        tenant = caller.scoped("admin")
        _check_id(endpoint_id)
        async with pool.acquire() as conn:
            with _found():
                await store.enable(conn, tenant, endpoint_id)
            return await shown(conn, tenant, endpoint_id)

    @app.post("/webhooks/{endpoint_id}/rotate", tags=["webhooks"], response_model=m.Rotated,
              summary="A new signing secret (the previous one signs too, until the next rotation)")
    async def rotate_webhook(caller: who, endpoint_id: str) -> dict[str, Any]:
        tenant = caller.scoped("admin")
        _check_id(endpoint_id)
        secret = signing.new_secret()
        async with pool.acquire() as conn:
            with _found():
                await store.rotate(conn, tenant, endpoint_id, secret)
        return {"id": endpoint_id, "secret": secret}

    @app.get("/notices", tags=["webhooks"], response_model=m.NoticePage,
             summary="What the platform told your tenant's admins, oldest first (an admin's)",
             description="A webhook endpoint disabled after sustained failure (`webhook.disabled`), "
                         "with the reason; each notice is also pushed to the admins' devices registered "
                         "with `POST /me/device-tokens`. Cursor: `after`, the last id.")
    async def list_notices(caller: who, after: Annotated[int, Query(ge=0)] = 0,
                           limit: Annotated[int, Query(ge=1, le=notices.MAX_PAGE)] = 50) -> dict[str, Any]:
        tenant = caller.scoped("admin")
        async with pool.acquire() as conn:
            rows = await notices.page(conn, tenant, after, limit)
        return {"notices": rows, "next": rows[-1]["id"] if len(rows) == limit else None}

    @app.get("/webhooks/{endpoint_id}/dead", tags=["webhooks"], response_model=m.DeadPage,
             summary="Events given up, oldest first, with the reason (cursor: `after`, the last seq)")
    async def dead_webhook(caller: who, endpoint_id: str, after: Annotated[int, Query(ge=0)] = 0,
                           limit: Annotated[int, Query(ge=1, le=store.MAX_PAGE)] = 100) -> dict[str, Any]:
        tenant = caller.scoped("admin")
        _check_id(endpoint_id)
        async with pool.acquire() as conn:
            with _found():
                rows = await store.dead(conn, tenant, endpoint_id, after, limit)
        return {"dead": rows, "next": rows[-1]["seq"] if len(rows) == limit else None}

    @app.post("/webhooks/{endpoint_id}/dead/replay", tags=["webhooks"], response_model=m.Replayed,
              summary="Queue every given-up event again (each under its webhook-id)")
    async def replay_webhook(caller: who, endpoint_id: str) -> dict[str, Any]:
        tenant = caller.scoped("admin")
        _check_id(endpoint_id)
        async with pool.acquire() as conn:
            with _found():
                n = await store.replay(conn, tenant, endpoint_id)
        return {"id": endpoint_id, "queued": n}

