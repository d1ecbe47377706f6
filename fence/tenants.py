"""Tenants (organisations) and their members in PostgreSQL (deploy/migrations/0024_tenants.sql).

A tenant is an id (exchanges/tenancy.py TENANT_RULE) and a name; its fences and proximity
subscriptions carry it as the prefix of their qualified ids (`<tenant>:<name>`, the generated
column `tenant`). A member is a Firebase uid with a role, viewer < editor < admin
(tenancy.ROLES); platform operators are a Firebase claim, not members.

Every refusal is an exception of this module (or tenancy.InvalidTenant) whose message says
what to do. The member changes of one tenant are serialised on its row (FOR NO KEY UPDATE,
which leaves the foreign-key checks of fence writes alone), so two admins removing each other
at once cannot leave a tenant without one.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from exchanges.fence_def import shown
from exchanges.tenancy import ROLES, InvalidTenant, check_tenant
from exchanges.text import TextError, check_text

__all__ = ["ROLES", "InvalidMember", "InvalidTenant", "InvalidTenantName", "LastAdmin", "Member", "Tenant",
           "TenantError", "TenantExists", "TenantInUse", "UnknownMember", "UnknownTenant", "add_tenant",
           "get_tenant", "list_tenants", "member_tenants", "members", "memberships", "put_member",
           "remove_member", "remove_tenant"]

MAX_NAME = 200  # characters of a tenant's name (the table's CHECK)
MAX_UID = 128  # characters of a Firebase uid (the table's CHECK)


class TenantError(Exception):
    """A refusal of this module; its message is for the user."""


class UnknownTenant(TenantError, LookupError):
    pass


class TenantExists(TenantError):
    pass


class TenantInUse(TenantError):
    """The tenant still holds fences or subscriptions."""


class LastAdmin(TenantError):
    """The change would leave the tenant without an admin."""


class UnknownMember(TenantError, LookupError):
    pass


class InvalidMember(TenantError, ValueError):
    """A uid or role that is not one."""


class InvalidTenantName(TenantError, ValueError):
    pass


@dataclass(frozen=True)
class Tenant:
    id: str
    name: str
    created_at: datetime
    members: int
    live_fences: int

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "created_at": self.created_at.timestamp(),
                "members": self.members, "live_fences": self.live_fences}


@dataclass(frozen=True)
class Member:
    tenant: str
    uid: str
    role: str
    added_at: datetime

    def to_json(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "uid": self.uid, "role": self.role,
                "added_at": self.added_at.timestamp()}


def _controls(text: str) -> bool:
    return any(unicodedata.category(c) in ("Cc", "Cs") for c in text)


def check_uid(uid: object) -> str:
    """A member's uid: a Firebase uid, 1-128 characters, no control characters, no spaces
    around it (a copy-paste slip)."""
    if not isinstance(uid, str) or not 0 < len(uid) <= MAX_UID or _controls(uid) or uid != uid.strip():
        raise InvalidMember(f"uid {shown(uid, 60)}: a Firebase uid is 1-{MAX_UID} characters, "
                            "without control characters or spaces around it")
    return uid


def check_role(role: object) -> str:
    if not isinstance(role, str) or role not in ROLES:
        raise InvalidMember(f"role {shown(role, 40)}: one of {', '.join(ROLES)}")
    return role


def check_name(name: object) -> str:
    """A tenant's name (may be empty): text as exchanges/text.py says, in NFC."""
    try:
        return check_text(name, "name", MAX_NAME, required=False)
    except TextError as exc:
        raise InvalidTenantName(str(exc)) from None


def _unknown(tenant_id: object) -> UnknownTenant:
    return UnknownTenant(f"no tenant {shown(tenant_id, 40)} (`geofence tenant list` shows them)")


_TENANTS = """SELECT t.id, t.name, t.created_at,
    (SELECT count(*) FROM tenant_member m WHERE m.tenant = t.id) AS members,
    (SELECT count(*) FROM fence f WHERE f.tenant = t.id AND f.deleted_at IS NULL) AS live_fences
FROM tenant t"""


def _tenant(row: asyncpg.Record) -> Tenant:
    return Tenant(row["id"], row["name"], row["created_at"], int(row["members"]), int(row["live_fences"]))


def _member(row: asyncpg.Record) -> Member:
    return Member(row["tenant"], row["uid"], row["role"], row["added_at"])


async def add_tenant(conn: asyncpg.Connection, tenant_id: str, name: str = "") -> Tenant:
    """Create a tenant (no members yet). InvalidTenant, InvalidTenantName, TenantExists."""
    check_tenant(tenant_id)
    name = check_name(name)
    row = await conn.fetchrow("INSERT INTO tenant (id, name) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING "
                              "RETURNING id, name, created_at, 0 AS members, 0 AS live_fences",
                              tenant_id, name)
    if row is None:
        raise TenantExists(f"tenant {tenant_id!r} exists already; choose another id "
                           "(or change its members with `geofence tenant member`)")
    return _tenant(row)


async def get_tenant(conn: asyncpg.Connection, tenant_id: str) -> Tenant:
    if not _is_tenant(tenant_id):
        raise _unknown(tenant_id)
    row = await conn.fetchrow(_TENANTS + " WHERE t.id = $1", tenant_id)
    if row is None:
        raise _unknown(tenant_id)
    return _tenant(row)


async def list_tenants(conn: asyncpg.Connection) -> list[Tenant]:
    """Every tenant by id, with its member count and live fence count."""
    return [_tenant(r) for r in await conn.fetch(_TENANTS + " ORDER BY t.id")]


async def remove_tenant(conn: asyncpg.Connection, tenant_id: str) -> None:
    """Delete a tenant and its members. Refused (TenantInUse) while it holds live fences or
    proximity subscriptions, and while it keeps deleted fences: their rows carry the version a
    re-created fence id continues (x-geo and x-fence ignore an older version), and their
    archived events would be read by a new tenant given the same id."""
    if not _is_tenant(tenant_id):
        raise _unknown(tenant_id)
    async with conn.transaction():
        if await conn.fetchval("SELECT id FROM tenant WHERE id = $1 FOR UPDATE", tenant_id) is None:
            raise _unknown(tenant_id)
        row = await conn.fetchrow(
            "SELECT (SELECT count(*) FROM fence WHERE tenant = $1 AND deleted_at IS NULL) AS live, "
            "(SELECT count(*) FROM fence WHERE tenant = $1 AND deleted_at IS NOT NULL) AS deleted, "
            "(SELECT count(*) FROM roam_subscription WHERE tenant = $1) AS subs", tenant_id)
        live, deleted, subs = int(row["live"]), int(row["deleted"]), int(row["subs"])
        if live or subs:
            raise TenantInUse(f"tenant {tenant_id!r} still has {live} live fence(s) and {subs} proximity "
                              "subscription(s); delete them first")
        if deleted:
            raise TenantInUse(f"tenant {tenant_id!r} keeps {deleted} deleted fence(s): their rows hold the "
                              "versions a re-created fence continues and their archived events stay theirs, "
                              "so a tenant that had fences is kept (remove its members instead)")
        await conn.execute("DELETE FROM tenant WHERE id = $1", tenant_id)  # members: ON DELETE CASCADE


def _is_tenant(value: object) -> bool:
    try:
        check_tenant(value)
    except InvalidTenant:
        return False
    return True


async def _lock(conn: asyncpg.Connection, tenant_id: str) -> None:
    """Inside a transaction: the tenant's row, locked against other member changes."""
    if await conn.fetchval("SELECT id FROM tenant WHERE id = $1 FOR NO KEY UPDATE", tenant_id) is None:
        raise _unknown(tenant_id)


async def _admins(conn: asyncpg.Connection, tenant_id: str) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM tenant_member WHERE tenant = $1 AND role = 'admin'",
                                   tenant_id))


def _last_admin(tenant_id: str, uid: str, what: str) -> LastAdmin:
    return LastAdmin(f"{uid!r} is the last admin of tenant {tenant_id!r}: make another member admin before "
                     f"{what}")


async def put_member(conn: asyncpg.Connection, tenant_id: str, uid: str, role: str,
                     keep_admin: bool = True) -> Member:
    """Add a member, or change a member's role. With keep_admin (the API's default), the last
    admin is not demoted (LastAdmin). InvalidTenant, UnknownTenant, InvalidMember."""
    check_tenant(tenant_id)
    check_uid(uid)
    check_role(role)
    async with conn.transaction():
        await _lock(conn, tenant_id)
        was = await conn.fetchval("SELECT role FROM tenant_member WHERE tenant = $1 AND uid = $2",
                                  tenant_id, uid)
        if keep_admin and was == "admin" and role != "admin" and await _admins(conn, tenant_id) == 1:
            raise _last_admin(tenant_id, uid, f"making them {role}")
        row = await conn.fetchrow(
            "INSERT INTO tenant_member (tenant, uid, role) VALUES ($1, $2, $3) "
            "ON CONFLICT (tenant, uid) DO UPDATE SET role = EXCLUDED.role RETURNING *", tenant_id, uid, role)
    return _member(row)


async def remove_member(conn: asyncpg.Connection, tenant_id: str, uid: str, keep_admin: bool = True) -> None:
    """Remove a member. With keep_admin (the API's default; the command line passes False), the
    last admin stays (LastAdmin). UnknownTenant, UnknownMember, InvalidMember."""
    if not _is_tenant(tenant_id):
        raise _unknown(tenant_id)
    check_uid(uid)
    async with conn.transaction():
        await _lock(conn, tenant_id)
        was = await conn.fetchval("SELECT role FROM tenant_member WHERE tenant = $1 AND uid = $2",
                                  tenant_id, uid)
        if was is None:
            raise UnknownMember(f"{uid!r} is not a member of tenant {tenant_id!r}")
        if keep_admin and was == "admin" and await _admins(conn, tenant_id) == 1:
            raise _last_admin(tenant_id, uid, "removing them")
        await conn.execute("DELETE FROM tenant_member WHERE tenant = $1 AND uid = $2", tenant_id, uid)


async def members(conn: asyncpg.Connection, tenant_id: str) -> list[Member]:
    """A tenant's members by uid (UnknownTenant if there is no such tenant)."""
    if not _is_tenant(tenant_id):
        raise _unknown(tenant_id)
    if await conn.fetchval("SELECT id FROM tenant WHERE id = $1", tenant_id) is None:
        raise _unknown(tenant_id)
    rows = await conn.fetch("SELECT * FROM tenant_member WHERE tenant = $1 ORDER BY uid", tenant_id)
    return [_member(r) for r in rows]


async def memberships(conn: asyncpg.Connection, uid: str) -> dict[str, str]:
    """tenant -> role of a uid's memberships (none for a uid that cannot be a member)."""
    try:
        check_uid(uid)
    except InvalidMember:
        return {}
    rows = await conn.fetch("SELECT tenant, role FROM tenant_member WHERE uid = $1 ORDER BY tenant", uid)
    return {r["tenant"]: r["role"] for r in rows}


async def member_tenants(conn: asyncpg.Connection, uid: str) -> list[dict[str, str]]:
    """A uid's tenants by id: {tenant, name, role} each (what `GET /tenants` answers)."""
    try:
        check_uid(uid)
    except InvalidMember:
        return []
    rows = await conn.fetch("SELECT m.tenant, t.name, m.role FROM tenant_member m "
                            "JOIN tenant t ON t.id = m.tenant WHERE m.uid = $1 ORDER BY m.tenant", uid)
    return [{"tenant": r["tenant"], "name": r["name"], "role": r["role"]} for r in rows]


# --------------------------------------------------------------------------- presence shares


async def put_share(conn: asyncpg.Connection, tenant_id: str, to_tenant: str, granted_by: str) -> None:
    """`tenant` shares its objects' presence with `to_tenant` (whose fences may then count them,
    as counts only: exchanges/fence_options/shares.py). Idempotent."""
    if tenant_id == to_tenant:
        raise InvalidMember("a tenant's fences see its own objects already: share with another tenant")
    for t in (tenant_id, to_tenant):
        if not _is_tenant(t) or await conn.fetchval("SELECT 1 FROM tenant WHERE id = $1", t) is None:
            raise _unknown(t)
    await conn.execute("INSERT INTO presence_share (tenant, to_tenant, granted_by) VALUES ($1, $2, $3) "
                       "ON CONFLICT DO NOTHING", tenant_id, to_tenant, check_uid(granted_by))


async def remove_share(conn: asyncpg.Connection, tenant_id: str, to_tenant: str) -> bool:
    """Withdraw a share; whether there was one."""
    done = await conn.execute("DELETE FROM presence_share WHERE tenant = $1 AND to_tenant = $2",
                              tenant_id, to_tenant)
    return bool(done.endswith(" 1"))


async def shares(conn: asyncpg.Connection, tenant_id: str) -> dict[str, list[str]]:
    """Whom a tenant shares its objects' presence with, and who shares theirs with it."""
    to = await conn.fetch("SELECT to_tenant FROM presence_share WHERE tenant = $1 ORDER BY 1", tenant_id)
    by = await conn.fetch("SELECT tenant FROM presence_share WHERE to_tenant = $1 ORDER BY 1", tenant_id)
    return {"shares_with": [r[0] for r in to], "shared_by": [r[0] for r in by]}


async def sharing_with(conn: asyncpg.Connection, tenant_ids: list[str], to_tenant: str) -> set[str]:
    """Those of `tenant_ids` that share their objects' presence with `to_tenant` now."""
    rows = await conn.fetch("SELECT tenant FROM presence_share WHERE to_tenant = $1 "
                            "AND tenant = ANY($2::text[])", to_tenant, tenant_ids)
    return {r[0] for r in rows}
