"""The tenants' HTTP routes (`/tenants...`): a caller's tenants, a tenant's members, a new tenant.

Who may do what: any signed-in user reads their own memberships; a tenant's admins (and
platform operators, the Firebase claim) read and change its members; only operators create
tenants. A caller who is not a member of a tenant gets the same 404 whether it exists or not
(a tenant's existence is not revealed); a member below admin gets 403. Member changes keep at
least one admin (fence/tenants.py `keep_admin`): the last admin is neither removed nor
demoted here (the command line can).
"""

# No `from __future__ import annotations`: FastAPI reads the route signatures at definition
# time, and the dependency type `who` is the caller's (a local of fence.api.create_app).
from typing import Annotated, Any

import asyncpg
from fastapi import Body, FastAPI, Response

from exchanges.fence_def import shown
from exchanges.tenancy import ROLES, InvalidTenant, is_tenant
from fence import api_models as am
from fence import quotas, tenants
from fence.service import ApiError, Caller, FenceService

ROLE_BODY = {"role": "editor"}
TENANT_BODY = {"id": "fleet", "name": "Fleet operations"}


def _not_found(tenant: str) -> ApiError:
    """The one answer to a tenant the caller may not see, whether it exists or not."""
    return ApiError(404, f"no tenant {shown(tenant, 40)}")


def _status(exc: Exception) -> ApiError:
    """A refusal of fence/tenants.py as the API answers it."""
    if isinstance(exc, tenants.UnknownTenant | tenants.UnknownMember):
        return ApiError(404, str(exc))
    if isinstance(exc, tenants.TenantExists | tenants.TenantInUse | tenants.LastAdmin):
        return ApiError(409, str(exc))
    return ApiError(422, str(exc))  # InvalidMember, InvalidTenant, InvalidTenantName


def _fields(body: Any, allowed: tuple[str, ...], required: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(422, f"a JSON object expected, with {', '.join(allowed)}")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise ApiError(422, f"unknown fields {shown(unknown, 80)}: only {', '.join(allowed)}")
    missing = [k for k in required if k not in body]
    if missing:
        raise ApiError(422, f"missing {', '.join(missing)}")
    return body


def add_tenant_routes(app: FastAPI, pool: asyncpg.Pool, who: Any,
                      service: FenceService | None = None) -> None:
    """The `/tenants` routes on `app`, reading and writing through `pool`; `who` is the
    dependency type that gives the authenticated `Caller`; `service` takes a withdrawn
    presence share off the fences that counted it."""

    async def admin_of(conn: asyncpg.Connection, caller: Caller, tenant: str) -> None:
        """Return if the caller may manage the tenant's members; else the 404 or 403."""
        if caller.operator:
            return
        role = (await tenants.memberships(conn, caller.uid)).get(tenant) if is_tenant(tenant) else None
        if role is None:
            raise _not_found(tenant)
        if role != "admin":
            raise ApiError(403, f"you are {role} of tenant {tenant!r}: only its admins manage its members")

    async def seen_by(conn: asyncpg.Connection, caller: Caller, tenant: str) -> None:
        """Return if the caller may read the tenant's own pages (any member, an operator); else
        the 404 of a tenant that does not exist."""
        if not caller.operator and tenant not in await tenants.memberships(conn, caller.uid):
            raise _not_found(tenant)

    @app.get("/tenants", tags=["tenants"], summary="Your tenants and your role in each",
             response_model=None, responses=am.answer(am.MyTenants))
    async def my_tenants(caller: who) -> dict[str, Any]:
        async with pool.acquire() as conn:
            return {"tenants": await tenants.member_tenants(conn, caller.uid)}

    @app.post("/tenants", status_code=201, tags=["tenants"], response_model=None,
              responses=am.answer(am.Tenant, 201), openapi_extra=am.body(am.TenantIn),
              summary="Create a tenant (a platform operator's)",
              description="`{\"id\": tenant id, \"name\": text}`: the id is 1-32 characters from a-z 0-9 -, "
                          "starting with a letter or digit, and is the prefix of the tenant's names inside "
                          "the pipeline. The tenant has no members yet: add its first admin with "
                          "`PUT /tenants/{tenant}/members/{uid}`.")
    async def create_tenant(caller: who, response: Response,
                            body: Annotated[Any, Body(openapi_examples={"fleet": {"value": TENANT_BODY}})]
                            ) -> dict[str, Any]:
        if not caller.operator:
            raise ApiError(403, "only a platform operator creates tenants")
        fields = _fields(body, ("id", "name"), ("id",))
        try:
            async with pool.acquire() as conn:
                made = await tenants.add_tenant(conn, fields["id"], fields.get("name", ""))
        except (tenants.TenantError, InvalidTenant) as exc:
            raise _status(exc) from None
        response.headers["Location"] = f"/tenants/{made.id}/members"
        return made.to_json()

    @app.get("/tenants/{tenant}/members", tags=["tenants"], response_model=None,
             responses=am.answer(am.Members),
             summary="A tenant's members and their roles (its admins', or an operator's)")
    async def list_members(caller: who, tenant: str) -> dict[str, Any]:
        async with pool.acquire() as conn:
            await admin_of(conn, caller, tenant)
            try:
                found = await tenants.members(conn, tenant)
            except tenants.UnknownTenant:
                raise _not_found(tenant) from None
        return {"tenant": tenant, "members": [m.to_json() for m in found]}

    @app.put("/tenants/{tenant}/members/{uid}", tags=["tenants"], response_model=None,
             responses=am.answer(am.Member), openapi_extra=am.body(am.RoleIn),
             summary="Add a member, or change a member's role (its admins', or an operator's)",
             description=f"`{{\"role\": {' | '.join(ROLES)}}}`: each role may do what the one before it "
                         "may; admins also manage the members. The last admin is not demoted (409).")
    async def put_member(caller: who, tenant: str, uid: str,
                         body: Annotated[Any, Body(openapi_examples={"editor": {"value": ROLE_BODY}})]
                         ) -> dict[str, Any]:
        fields = _fields(body, ("role",), ("role",))
        async with pool.acquire() as conn:
            await admin_of(conn, caller, tenant)
            try:
                member = await tenants.put_member(conn, tenant, uid, fields["role"], keep_admin=True)
            except tenants.UnknownTenant:
                raise _not_found(tenant) from None
            except (tenants.TenantError, InvalidTenant) as exc:
                raise _status(exc) from None
        return member.to_json()

    @app.delete("/tenants/{tenant}/members/{uid}", status_code=204, tags=["tenants"],
                summary="Remove a member (its admins', or an operator's); the last admin stays (409)")
    async def remove_member(caller: who, tenant: str, uid: str) -> None:
        async with pool.acquire() as conn:
            await admin_of(conn, caller, tenant)
            try:
                await tenants.remove_member(conn, tenant, uid, keep_admin=True)
            except tenants.UnknownTenant:
                raise _not_found(tenant) from None
            except (tenants.TenantError, InvalidTenant) as exc:
                raise _status(exc) from None

    @app.get("/tenants/{tenant}/quota", tags=["tenants"], response_model=None, responses=am.answer(am.Quota),
             summary="What the tenant holds against its quotas (any member's, or an operator's)",
             description="Each quota (fences, vertices, follow_fences, subscriptions): `max`, `used`, and "
                         "whether `max` is the platform's default. A change past a quota is answered 403 "
                         "with the quota named; operators change them (`geofence tenant quota`).")
    async def get_quota(caller: who, tenant: str) -> dict[str, Any]:
        async with pool.acquire() as conn:
            await seen_by(conn, caller, tenant)
            try:
                await tenants.get_tenant(conn, tenant)
            except (tenants.UnknownTenant, InvalidTenant):
                raise _not_found(tenant) from None
            return {"tenant": tenant, "quota": await quotas.report(conn, tenant)}

    @app.get("/tenants/{tenant}/shares", tags=["tenants"], response_model=None,
             responses=am.answer(am.Shares),
             summary="Whom the tenant shares its objects' presence with, and who shares with it",
             description="Cross-tenant presence: a tenant's fence counts another tenant's objects "
                         "(`counts_from`) only while that tenant shares with it, and then as counts "
                         "only, never identities (docs/reference.md, the README's privacy rules).")
    async def list_shares(caller: who, tenant: str) -> dict[str, Any]:
        async with pool.acquire() as conn:
            await seen_by(conn, caller, tenant)
            return {"tenant": tenant, **await tenants.shares(conn, tenant)}

    @app.put("/tenants/{tenant}/shares/{to_tenant}", status_code=204, tags=["tenants"],
             summary="Share the tenant's objects' presence with another tenant (its admins')",
             description="The other tenant's fences may then count this tenant's objects (their "
                         "`counts_from`), as counts only: never an object's id, position or events.")
    async def put_share(caller: who, tenant: str, to_tenant: str) -> None:
        async with pool.acquire() as conn:
            await admin_of(conn, caller, tenant)
            try:
                await tenants.put_share(conn, tenant, to_tenant, caller.uid)
            except tenants.UnknownTenant:
                raise _not_found(to_tenant if is_tenant(tenant) else tenant) from None
            except tenants.TenantError as exc:
                raise _status(exc) from None

    @app.delete("/tenants/{tenant}/shares/{to_tenant}", tags=["tenants"], response_model=None,
                responses=am.answer(am.ShareWithdrawn),
                summary="Withdraw a share (its admins'): the other tenant's fences stop counting")
    async def remove_share(caller: who, tenant: str, to_tenant: str) -> dict[str, Any]:
        async with pool.acquire() as conn:
            await admin_of(conn, caller, tenant)
            if not await tenants.remove_share(conn, tenant, to_tenant):
                raise ApiError(404, f"tenant {tenant!r} does not share with {shown(to_tenant, 40)}")
        changed = [] if service is None else await service.withdraw_share(tenant, to_tenant)
        return {"tenant": tenant, "to_tenant": to_tenant, "fences_changed": len(changed)}
