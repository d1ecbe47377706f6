"""Tenants against the real PostgreSQL: fence/tenants.py, its HTTP routes (fence/tenant_routes.py),
`geofence tenant` as a subprocess, and migration 0024's rewrite of an existing deployment's ids.

Everything runs in scratch schemas of the stack's PostgreSQL (its role may not create
databases): deploy/migrate.py applies the migrations there (the DSN's search_path), and the
schema is dropped afterwards, so nothing here reads or changes the live tables, and the tests
do not depend on whether the stack's own database is migrated yet. Tenant ids are unique per
run. A stack that is not up fails them (tests/conftest.py `stack`)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

import asyncpg
import httpx
import pytest
from fastapi import Depends, FastAPI, Header, Request
from fastapi.responses import JSONResponse

from deploy.migrate import MIGRATIONS_DIR, migrate
from deploy.settings import ConnectionSettings
from exchanges import routing_store
from exchanges.tenancy import InvalidTenant, is_tenant
from fence import tenants
from fence.service import ApiError, Caller
from fence.tenant_routes import add_tenant_routes
from tests.integration.clients import geofence

TENANTS_MIGRATION = 24


def new_id(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


async def scratch_schema(dsn: str) -> tuple[str, str]:
    """(schema, DSN whose search_path is it): a new empty schema."""
    name = f"t_tenants_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'CREATE SCHEMA "{name}"')
    finally:
        await conn.close()
    return name, f"{dsn}{'&' if '?' in dsn else '?'}search_path={name}"


async def drop_schema(dsn: str, name: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'DROP SCHEMA "{name}" CASCADE')
    finally:
        await conn.close()


@pytest.fixture(scope="module")
async def tenant_db(stack: ConnectionSettings) -> AsyncIterator[str]:
    """The DSN of a scratch schema with every migration applied."""
    name, dsn = await scratch_schema(stack["postgres"]["dsn"])
    try:
        applied = await migrate(dsn)
        assert f"{TENANTS_MIGRATION:04d}_tenants" in applied
        yield dsn
    finally:
        await drop_schema(stack["postgres"]["dsn"], name)


@pytest.fixture
async def conn(tenant_db: str) -> AsyncIterator[asyncpg.Connection]:
    c = await routing_store.connect(tenant_db)
    try:
        yield c
    finally:
        await c.close()


async def add_fence(conn: asyncpg.Connection, fence_id: str, deleted: bool = False) -> None:
    await conn.execute("INSERT INTO fence (id, owner, geometry, version, min_lon, min_lat, max_lon, max_lat, "
                       "deleted_at) VALUES ($1, 'u1', '{\"type\": \"Polygon\"}'::text::jsonb, 1, 0, 0, 1, 1, "
                       "CASE WHEN $2 THEN now() END)", fence_id, deleted)


async def add_subscription(conn: asyncpg.Connection, sub_id: str, object_id: str) -> None:
    await conn.execute("INSERT INTO roam_subscription (id, owner, object_id, radius_m) "
                       "VALUES ($1, 'u1', $2, 10)", sub_id, object_id)


# -- the store ------------------------------------------------------------------------------------


async def test_add_get_list(conn: asyncpg.Connection) -> None:
    tid = new_id()
    made = await tenants.add_tenant(conn, tid, "Fleet operations")
    assert (made.id, made.name, made.members, made.live_fences) == (tid, "Fleet operations", 0, 0)
    await tenants.put_member(conn, tid, "uid-a", "admin")
    await tenants.put_member(conn, tid, "uid-b", "viewer")
    await add_fence(conn, f"{tid}:depot")
    await add_fence(conn, f"{tid}:yard")
    await add_fence(conn, f"{tid}:old", deleted=True)
    got = await tenants.get_tenant(conn, tid)
    assert (got.members, got.live_fences, got.created_at) == (2, 2, made.created_at)
    listed = {t.id: t for t in await tenants.list_tenants(conn)}
    assert listed[tid] == got
    assert got.to_json() == {"id": tid, "name": "Fleet operations", "created_at": made.created_at.timestamp(),
                             "members": 2, "live_fences": 2}
    assert [t.id for t in await tenants.list_tenants(conn)] == sorted(listed)


async def test_add_refuses_a_taken_or_bad_id_and_a_bad_name(conn: asyncpg.Connection) -> None:
    tid = new_id()
    await tenants.add_tenant(conn, tid)
    with pytest.raises(tenants.TenantExists, match="exists already"):
        await tenants.add_tenant(conn, tid, "again")
    for bad in ("", "Fleet", "-a", "a:b", "a\n", "a" * 33, "a\x00", "é"):
        with pytest.raises(InvalidTenant, match="1-32 characters"):
            await tenants.add_tenant(conn, bad)
    for name in ("x" * 201, "line\nbreak", "nul\x00"):
        with pytest.raises(tenants.InvalidTenantName, match=r"name: .*(at most 200|a control character)"):
            await tenants.add_tenant(conn, new_id(), name)
    assert (await tenants.add_tenant(conn, new_id(), "x" * 200)).name == "x" * 200


async def test_unknown_tenants(conn: asyncpg.Connection) -> None:
    for tid in (new_id(), "Not-A-Tenant", "x" * 1000):
        with pytest.raises(tenants.UnknownTenant, match="no tenant"):
            await tenants.get_tenant(conn, tid)
        with pytest.raises(tenants.UnknownTenant):
            await tenants.members(conn, tid)
        with pytest.raises(tenants.UnknownTenant):
            await tenants.remove_tenant(conn, tid)
        with pytest.raises(tenants.UnknownTenant):
            await tenants.remove_member(conn, tid, "uid-a")
    with pytest.raises(tenants.UnknownTenant):
        await tenants.put_member(conn, new_id(), "uid-a", "viewer")


async def test_remove_tenant(conn: asyncpg.Connection) -> None:
    tid = new_id()
    await tenants.add_tenant(conn, tid)
    await tenants.put_member(conn, tid, "uid-a", "admin")
    await add_fence(conn, f"{tid}:depot")
    with pytest.raises(tenants.TenantInUse, match="1 live fence"):
        await tenants.remove_tenant(conn, tid)
    await conn.execute("UPDATE fence SET deleted_at = now() WHERE id = $1", f"{tid}:depot")
    with pytest.raises(tenants.TenantInUse, match="keeps 1 deleted fence"):
        await tenants.remove_tenant(conn, tid)

    other = new_id()
    await tenants.add_tenant(conn, other)
    await add_subscription(conn, f"{other}:rs-1", f"{other}:car-1")
    with pytest.raises(tenants.TenantInUse, match="1 proximity subscription"):
        await tenants.remove_tenant(conn, other)
    await conn.execute("DELETE FROM roam_subscription WHERE id = $1", f"{other}:rs-1")
    member = f"uid-{uuid.uuid4().hex}"
    await tenants.put_member(conn, other, "uid-a", "admin")
    await tenants.put_member(conn, other, member, "editor")
    await tenants.remove_tenant(conn, other)
    with pytest.raises(tenants.UnknownTenant):
        await tenants.get_tenant(conn, other)
    assert await conn.fetchval("SELECT count(*) FROM tenant_member WHERE tenant = $1", other) == 0
    assert await tenants.memberships(conn, member) == {}
    assert (await tenants.get_tenant(conn, tid)).members == 1  # the refused one is untouched


async def test_members_and_roles(conn: asyncpg.Connection) -> None:
    tid, other = new_id(), new_id()
    await tenants.add_tenant(conn, tid)
    await tenants.add_tenant(conn, other)
    uid = f"uid-{uuid.uuid4().hex}"
    added = await tenants.put_member(conn, tid, uid, "viewer")
    assert (added.tenant, added.uid, added.role) == (tid, uid, "viewer")
    changed = await tenants.put_member(conn, tid, uid, "editor")
    assert changed.role == "editor" and changed.added_at == added.added_at
    await tenants.put_member(conn, other, uid, "admin")
    await tenants.put_member(conn, tid, "uid-0", "admin")
    assert await tenants.memberships(conn, uid) == {tid: "editor", other: "admin"}
    assert await tenants.member_tenants(conn, uid) == sorted(
        [{"tenant": tid, "name": "", "role": "editor"}, {"tenant": other, "name": "", "role": "admin"}],
        key=lambda d: d["tenant"])
    found = await tenants.members(conn, tid)
    assert [(m.uid, m.role) for m in found] == [("uid-0", "admin"), (uid, "editor")]
    await tenants.remove_member(conn, tid, uid)
    assert await tenants.memberships(conn, uid) == {other: "admin"}
    with pytest.raises(tenants.UnknownMember, match="not a member"):
        await tenants.remove_member(conn, tid, uid)
    assert await tenants.memberships(conn, "nobody") == {}
    assert await tenants.memberships(conn, "") == {} and await tenants.member_tenants(conn, "a\x00") == []


@pytest.mark.parametrize("uid", ["", "x" * 129, "a\x00b", "tab\there", " padded", "padded ", "\ud800", 7,
                                 None])
async def test_bad_uids_are_refused(conn: asyncpg.Connection, uid: Any) -> None:
    tid = new_id()
    await tenants.add_tenant(conn, tid)
    with pytest.raises(tenants.InvalidMember, match="Firebase uid"):
        await tenants.put_member(conn, tid, uid, "viewer")
    with pytest.raises(tenants.InvalidMember):
        await tenants.remove_member(conn, tid, uid)
    assert (await tenants.put_member(conn, tid, "é" * 128, "viewer")).uid == "é" * 128


@pytest.mark.parametrize("role", ["", "Admin", "owner", "admin ", None, 2])
async def test_bad_roles_are_refused(conn: asyncpg.Connection, role: Any) -> None:
    tid = new_id()
    await tenants.add_tenant(conn, tid)
    with pytest.raises(tenants.InvalidMember, match="viewer, editor, admin"):
        await tenants.put_member(conn, tid, "uid-a", role)


async def test_the_last_admin_stays_unless_asked(conn: asyncpg.Connection) -> None:
    tid = new_id()
    await tenants.add_tenant(conn, tid)
    await tenants.put_member(conn, tid, "uid-a", "admin")
    await tenants.put_member(conn, tid, "uid-v", "viewer")
    with pytest.raises(tenants.LastAdmin, match="last admin"):
        await tenants.remove_member(conn, tid, "uid-a")
    with pytest.raises(tenants.LastAdmin, match="last admin"):
        await tenants.put_member(conn, tid, "uid-a", "editor")
    await tenants.remove_member(conn, tid, "uid-v")  # not an admin: always
    await tenants.put_member(conn, tid, "uid-a", "admin")  # unchanged: fine
    await tenants.put_member(conn, tid, "uid-b", "admin")
    await tenants.put_member(conn, tid, "uid-a", "editor")  # another admin is left
    await tenants.put_member(conn, tid, "uid-b", "viewer", keep_admin=False)  # the command line's way
    assert [m.role for m in await tenants.members(conn, tid)] == ["editor", "viewer"]
    await tenants.put_member(conn, tid, "uid-a", "admin")
    await tenants.remove_member(conn, tid, "uid-a", keep_admin=False)
    assert [m.uid for m in await tenants.members(conn, tid)] == ["uid-b"]


async def test_two_admins_removing_each_other_at_once_leave_one(tenant_db: str) -> None:
    one, two = await routing_store.connect(tenant_db), await routing_store.connect(tenant_db)
    try:
        tid = new_id()
        await tenants.add_tenant(one, tid)
        await tenants.put_member(one, tid, "uid-a", "admin")
        await tenants.put_member(one, tid, "uid-b", "admin")
        done = await asyncio.gather(tenants.remove_member(one, tid, "uid-a"),
                                    tenants.put_member(two, tid, "uid-b", "viewer"), return_exceptions=True)
        assert sum(isinstance(d, tenants.LastAdmin) for d in done) == 1, done
        assert [m.role for m in await tenants.members(one, tid)].count("admin") == 1
    finally:
        await one.close()
        await two.close()


@pytest.mark.parametrize("bad", ["", "A", "-a", "a_b", "a:b", "a\n", "a" * 33, " a", "\uff41"])
async def test_the_schema_refuses_what_tenancy_refuses(conn: asyncpg.Connection, bad: str) -> None:
    assert not is_tenant(bad)
    with pytest.raises(asyncpg.CheckViolationError):
        await conn.execute("INSERT INTO tenant (id) VALUES ($1)", bad)


async def test_fences_and_subscriptions_belong_to_a_tenant(conn: asyncpg.Connection) -> None:
    tid, other = new_id(), new_id()
    await tenants.add_tenant(conn, tid)
    await tenants.add_tenant(conn, other)
    await add_fence(conn, f"{tid}:depot")
    assert await conn.fetchval("SELECT tenant FROM fence WHERE id = $1", f"{tid}:depot") == tid
    for bad in ("depot", f"{tid}:", f"{tid}:a:b", f":{tid}", f"{tid}:-x", f"{tid.upper()}:x"):
        with pytest.raises(asyncpg.CheckViolationError):
            await add_fence(conn, bad)
    with pytest.raises(asyncpg.ForeignKeyViolationError):
        await add_fence(conn, f"{new_id()}:depot")  # no such tenant
    follow = ("UPDATE fence SET follow_object = $2, follow_radius_m = 10 WHERE id = $1")
    await conn.execute(follow, f"{tid}:depot", f"{tid}:car-1")
    for bad in (f"{other}:car-1", "car-1"):  # another tenant's object; an unqualified one
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute(follow, f"{tid}:depot", bad)
    await add_subscription(conn, f"{tid}:rs-1", f"{tid}:car-1")
    assert await conn.fetchval("SELECT tenant FROM roam_subscription WHERE id = $1", f"{tid}:rs-1") == tid
    for sub_id, obj in (("rs-2", f"{tid}:car-1"), (f"{tid}:rs-2", f"{other}:car-1"),
                        (f"{tid}:rs-2", "car-1")):
        with pytest.raises(asyncpg.CheckViolationError):
            await add_subscription(conn, sub_id, obj)
    await conn.execute("INSERT INTO roam_subscription (id, owner, object_id, radius_m, point_lon, point_lat) "
                       "VALUES ($1, 'u1', $2, 10, 9.5, 47.1)", f"{tid}:rs-3", f"@{tid}:rs-3")
    ghost = new_id()
    with pytest.raises(asyncpg.ForeignKeyViolationError):
        await add_subscription(conn, f"{ghost}:rs-1", f"{ghost}:car-1")


# -- the HTTP routes ------------------------------------------------------------------------------


async def caller_from_headers(x_uid: Annotated[str, Header()],
                              x_operator: Annotated[str, Header()] = "") -> Caller:
    """The test's stand-in for fence/api.py's token check: the caller the headers name."""
    return Caller(x_uid, x_operator == "yes")




@pytest.fixture
async def client(tenant_db: str) -> AsyncIterator[httpx.AsyncClient]:
    """The routes on an app of their own; the caller is named by the headers X-Uid, X-Operator."""
    app = FastAPI()

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": exc.message}, status_code=exc.status)

    pool = await asyncpg.create_pool(tenant_db, init=routing_store.init_connection, min_size=1, max_size=4)
    try:
        add_tenant_routes(app, pool, Annotated[Caller, Depends(caller_from_headers)])
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            yield c
    finally:
        await pool.close()


def as_(uid: str, operator: bool = False) -> dict[str, str]:
    return {"X-Uid": uid, **({"X-Operator": "yes"} if operator else {})}


async def test_routes(client: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    tid, ghost = new_id(), new_id()
    admin, editor, outsider, op = (f"{r}-{uuid.uuid4().hex[:8]}" for r in ("admin", "editor", "out", "op"))
    # only an operator creates a tenant
    r = await client.post("/tenants", json={"id": tid, "name": "Fleet"}, headers=as_(admin))
    assert r.status_code == 403
    r = await client.post("/tenants", json={"id": tid, "name": "Fleet"}, headers=as_(op, operator=True))
    assert r.status_code == 201 and r.json()["id"] == tid
    assert r.headers["Location"] == f"/tenants/{tid}/members"
    refused: list[tuple[Any, int]] = [({"id": tid}, 409), ({"id": "Bad"}, 422), ({"name": "x"}, 422),
                                      ({"id": new_id(), "extra": 1}, 422), ([tid], 422),
                                      ({"id": new_id(), "name": 5}, 422)]
    for body, status in refused:
        r = await client.post("/tenants", json=body, headers=as_(op, operator=True))
        assert r.status_code == status, (body, r.text)
    # the operator adds the first admin; the admin adds an editor
    r = await client.put(f"/tenants/{tid}/members/{admin}", json={"role": "admin"},
                         headers=as_(op, operator=True))
    assert r.status_code == 200 and r.json()["role"] == "admin"
    r = await client.put(f"/tenants/{tid}/members/{editor}", json={"role": "editor"}, headers=as_(admin))
    assert r.status_code == 200
    r = await client.get("/tenants", headers=as_(editor))
    assert r.json() == {"tenants": [{"tenant": tid, "name": "Fleet", "role": "editor"}]}
    assert (await client.get("/tenants", headers=as_(outsider))).json() == {"tenants": []}
    # members: admins and operators read them; an editor is refused; an outsider learns nothing
    for who in (as_(admin), as_(op, operator=True)):
        r = await client.get(f"/tenants/{tid}/members", headers=who)
        assert r.status_code == 200
        assert {m["uid"]: m["role"] for m in r.json()["members"]} == {admin: "admin", editor: "editor"}
    assert (await client.get(f"/tenants/{tid}/members", headers=as_(editor))).status_code == 403
    hidden = [await client.get(f"/tenants/{t}/members", headers=as_(outsider)) for t in (tid, ghost)]
    assert [h.status_code for h in hidden] == [404, 404]
    assert hidden[0].json()["error"].replace(tid, ghost) == hidden[1].json()["error"]
    assert (await client.get(f"/tenants/{ghost}/members", headers=as_(op, operator=True))).status_code == 404
    assert (await client.get("/tenants/NOT%20A%20TENANT/members", headers=as_(admin))).status_code == 404
    # changes: only admins and operators; the last admin stays
    for who, status in ((as_(editor), 403), (as_(outsider), 404)):
        r = await client.put(f"/tenants/{tid}/members/{outsider}", json={"role": "admin"}, headers=who)
        assert r.status_code == status
        assert (await client.delete(f"/tenants/{tid}/members/{admin}", headers=who)).status_code == status
    r = await client.put(f"/tenants/{tid}/members/{admin}", json={"role": "viewer"}, headers=as_(admin))
    assert r.status_code == 409 and "last admin" in r.json()["error"]
    r = await client.delete(f"/tenants/{tid}/members/{admin}", headers=as_(op, operator=True))
    assert r.status_code == 409
    for body in ({"role": "owner"}, {"role": "admin", "x": 1}, {}, "admin"):
        r = await client.put(f"/tenants/{tid}/members/{outsider}", json=body, headers=as_(admin))
        assert r.status_code == 422, body
    r = await client.put(f"/tenants/{tid}/members/{'x' * 129}", json={"role": "viewer"}, headers=as_(admin))
    assert r.status_code == 422 and "Firebase uid" in r.json()["error"]
    assert (await client.delete(f"/tenants/{tid}/members/{outsider}", headers=as_(admin))).status_code == 404
    assert (await client.delete(f"/tenants/{tid}/members/{editor}", headers=as_(admin))).status_code == 204
    assert await tenants.memberships(conn, editor) == {}


# -- the command line -----------------------------------------------------------------------------


def run_cli(*args: str) -> tuple[int, str, str]:
    done = geofence("tenant", *args)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout, done.stderr


def test_command_line(tenant_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEOFENCE_POSTGRES_URL", tenant_db)  # the subprocess works in the scratch schema
    tid = new_id()
    assert run_cli("add", tid, "--name", "Fleet ops") == (0, f"tenant {tid} added (Fleet ops)\n", "")
    rc, out, err = run_cli("add", tid)
    assert rc == 1 and out == ""  # refused (deploy/exit_codes.py)
    assert err == f"geofence tenant add: error: tenant {tid!r} exists already; choose another id " \
        "(or change its members with `geofence tenant member`)\n"
    rc, _, err = run_cli("add", "Bad_Id")
    assert rc == 2 and "1-32 characters" in err and len(err.splitlines()) == 1
    added = run_cli("member", "add", tid, "uid-a", "--role", "viewer")
    assert added[:2] == (0, f"uid-a is viewer of {tid} (added)\n")
    assert run_cli("member", "add", tid, "uid-a", "--role", "admin")[1] == f"uid-a is admin of {tid} " \
        "(changed from viewer)\n"
    assert run_cli("member", "add", tid, "uid-b", "--role", "editor")[0] == 0
    rc, _, err = run_cli("member", "add", tid, "uid-c", "--role", "owner")
    assert rc == 2 and "invalid choice" in err
    rc, out, _ = run_cli("member", "list", tid, "--json")
    assert rc == 0
    assert [(m["uid"], m["role"]) for m in json.loads(out)] == [("uid-a", "admin"), ("uid-b", "editor")]
    rc, out, _ = run_cli("member", "list", tid)
    assert rc == 0 and out.splitlines()[0].split() == ["UID", "ROLE", "ADDED"] and "uid-b" in out
    rc, out, _ = run_cli("list", "--json")
    mine = next(t for t in json.loads(out) if t["id"] == tid)
    assert (mine["name"], mine["members"], mine["live_fences"]) == ("Fleet ops", 2, 0)
    rc, out, _ = run_cli("list")
    assert rc == 0 and any(line.split()[:3] == [tid, "2", "0"] for line in out.splitlines())
    # the command line may remove the last admin
    assert run_cli("member", "remove", tid, "uid-a") == (0, f"uid-a removed from {tid}\n", "")
    rc, _, err = run_cli("member", "remove", tid, "uid-a")
    assert rc == 1
    assert err == f"geofence tenant member remove: error: 'uid-a' is not a member of tenant {tid!r}\n"
    ghost = new_id()
    for args in (("remove", ghost), ("member", "list", ghost),
                 ("member", "add", ghost, "u", "--role", "admin")):
        rc, _, err = run_cli(*args)
        assert rc == 1 and f"no tenant {ghost!r}" in err and len(err.splitlines()) == 1, err
    assert run_cli("remove", tid) == (0, f"tenant {tid} removed\n", "")
    assert tid not in run_cli("list")[1]


def test_command_line_on_a_database_without_the_tables(stack: ConnectionSettings,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    name, dsn = asyncio.run(scratch_schema(stack["postgres"]["dsn"]))
    try:
        monkeypatch.setenv("GEOFENCE_POSTGRES_URL", dsn)
        rc, _, err = run_cli("list")
        assert rc == 1 and "run `geofence migrate`" in err and len(err.splitlines()) == 1
    finally:
        asyncio.run(drop_schema(stack["postgres"]["dsn"], name))


# -- migration 0024 -------------------------------------------------------------------------------

# The foreign keys on fence (id): the migration drops them for the rewrite and puts them back as
# they were.
FK_DEFS = {("fence_range", "fence_range_fence_id_fkey"):
           "FOREIGN KEY (fence_id) REFERENCES fence(id) ON DELETE CASCADE",
           ("hive", "hive_fence_id_fkey"): "FOREIGN KEY (fence_id) REFERENCES fence(id)"}

BEFORE_TENANTS = """
INSERT INTO fence (id, geometry, version, min_lon, min_lat, max_lon, max_lat, follow_object, follow_radius_m,
                   deleted_at) VALUES
    ('depot', '{}', 3, 0, 0, 1, 1, NULL, NULL, NULL), ('follower', '{}', 1, 0, 0, 1, 1, 'car-1', 50, NULL),
    ('old', '{}', 2, 0, 0, 1, 1, NULL, NULL, now());
INSERT INTO fence_range (fence_id, region, version, bits, ranges, interior)
    VALUES ('depot', 'a', 3, 26, '', '');
INSERT INTO hive (id, name, type, lon, lat, fence_id) VALUES ('h1', 'Bar', 'bar', 9.5, 47.1, 'depot');
INSERT INTO fence_binding VALUES ('depot', 3, 26, 0, '', '', 'run-1');
INSERT INTO fence_binding_diff VALUES ('run-1', 'repair', 'a', 'depot', 3, 'add', 0, 1, 0, 1);
INSERT INTO fence_event (event_id, fence_id, object_id, event, reason, ts) VALUES
    ('e1', 'depot', 'car-1', 'enter', 'entered', 1), ('e2', 'old', 'truck-2', 'leave', 'fence_deleted', 2),
    ('e3', 'gone', 'car-1', 'enter', 'entered', 3), ('e4', 'x:depot', 'x:car-9', 'enter', 'entered', 4);
INSERT INTO occupancy_hourly (fence_id, day, hour, entries, exits, mean_occupancy, peak_occupancy, stays)
    VALUES ('depot', '2024-05-01', 7, 1, 0, 0.5, 1, 1);
INSERT INTO occupancy_open (day, fence_id, object_ids) VALUES ('2024-05-01', 'depot', '{car-1,truck-2}');
INSERT INTO occupancy_busiest (as_of, fence_id, weekday, rank, hour, mean_occupancy, days)
    VALUES ('2024-05-01', 'depot', 3, 1, 7, 0.5, 1);
INSERT INTO occupancy_forecast (fence_id, day, hour, occupancy, seasonal, trend, basis, samples)
    VALUES ('depot', '2024-05-02', 7, 0.5, 0.5, 1, 'weekday', 1);
INSERT INTO occupancy_hourly_stage (run_id, fence_id, day, hour, entries, exits, mean_occupancy,
    peak_occupancy, stays) VALUES ('run-2', 'depot', '2024-05-01', 7, 1, 0, 0.5, 1, 1);
INSERT INTO occupancy_open_stage (run_id, day, fence_id, object_ids)
    VALUES ('run-2', '2024-05-01', 'depot', '{b,a}');
INSERT INTO roam_subscription (id, owner, object_id, radius_m, point_lon, point_lat) VALUES
    ('rs-1', 'u', 'car-1', 100, NULL, NULL), ('rs-2', 'u', '@rs-2', 50, 9.5, 47.1);
INSERT INTO roam_change (subscription_id, definition) VALUES
    ('rs-1', '{"id": "rs-1", "object": "car-1", "radius_m": 100, "match": "truck-*"}'),
    ('rs-2', '{"id": "rs-2", "point": [9.5, 47.1], "radius_m": 50}'), ('rs-3', NULL);
"""


async def migrate_upto(dsn: str, last: int, directory: Path) -> None:
    for path in sorted(MIGRATIONS_DIR.glob("*.sql"))[:last]:
        shutil.copy(path, directory)
    assert len(await migrate(dsn, directory)) == last


async def fk_definitions(c: asyncpg.Connection) -> dict[tuple[str, str], str]:
    rows = await c.fetch("SELECT conrelid::regclass::text AS t, conname, pg_get_constraintdef(oid) AS d "
                         "FROM pg_constraint WHERE confrelid = 'fence'::regclass")
    return {(r["t"], r["conname"]): r["d"] for r in rows}


async def pairs(c: asyncpg.Connection, sql: str) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in await c.fetch(sql)]


async def check_after_tenants(c: asyncpg.Connection) -> None:
    assert await pairs(c, "SELECT id, name FROM tenant") == [("default", "Existing data (before tenants)")]
    assert await pairs(c, "SELECT id, tenant, version, follow_object, deleted_at IS NOT NULL FROM fence "
                          "ORDER BY id") == [("default:depot", "default", 3, None, False),
                                             ("default:follower", "default", 1, "default:car-1", False),
                                             ("default:old", "default", 2, None, True)]
    for table in ("fence_range", "hive", "fence_binding", "fence_binding_diff", "occupancy_hourly",
                  "occupancy_busiest", "occupancy_forecast", "occupancy_hourly_stage"):
        assert await pairs(c, f"SELECT fence_id FROM {table}") == [("default:depot",)], table
    assert await pairs(c, "SELECT event_id, fence_id, object_id FROM fence_event ORDER BY 1") == [
        ("e1", "default:depot", "default:car-1"), ("e2", "default:old", "default:truck-2"),
        ("e3", "default:gone", "default:car-1"), ("e4", "x:depot", "x:car-9")]  # already qualified: as it was
    assert await pairs(c, "SELECT fence_id, object_ids FROM occupancy_open") == [
        ("default:depot", ["default:car-1", "default:truck-2"])]
    assert await pairs(c, "SELECT fence_id, object_ids FROM occupancy_open_stage") == [
        ("default:depot", ["default:b", "default:a"])]  # the order kept
    assert await pairs(c, "SELECT id, object_id, tenant FROM roam_subscription ORDER BY id") == [
        ("default:rs-1", "default:car-1", "default"), ("default:rs-2", "@default:rs-2", "default")]
    assert await pairs(c, "SELECT subscription_id, definition FROM roam_change ORDER BY seq") == [
        ("default:rs-1", {"id": "default:rs-1", "object": "default:car-1", "radius_m": 100,
                          "match": "truck-*"}),
        ("default:rs-2", {"id": "default:rs-2", "point": [9.5, 47.1], "radius_m": 50}),
        ("default:rs-3", None)]
    # the foreign keys hold again
    with pytest.raises(asyncpg.ForeignKeyViolationError):
        await c.execute("INSERT INTO fence_range (fence_id, region, version, bits, ranges, interior) "
                        "VALUES ('default:nope', 'b', 1, 26, '', '')")
    with pytest.raises(asyncpg.ForeignKeyViolationError):
        await c.execute("DELETE FROM fence WHERE id = 'default:depot'")  # the hive's
    await c.execute("UPDATE hive SET fence_id = NULL")
    await c.execute("DELETE FROM fence WHERE id = 'default:depot'")
    assert await c.fetchval("SELECT count(*) FROM fence_range") == 0  # ON DELETE CASCADE
    with pytest.raises(asyncpg.ForeignKeyViolationError):
        await c.execute("DELETE FROM tenant WHERE id = 'default'")  # its fences hold it


async def test_migration_on_an_empty_database(stack: ConnectionSettings) -> None:
    name, dsn = await scratch_schema(stack["postgres"]["dsn"])
    try:
        await migrate(dsn)
        c = await asyncpg.connect(dsn)
        try:
            assert await c.fetchval("SELECT count(*) FROM tenant") == 0
            assert await c.fetchval("SELECT max(number) FROM schema_migration") >= TENANTS_MIGRATION
            assert await fk_definitions(c) == FK_DEFS
            generated = await c.fetch("SELECT attrelid::regclass::text AS t FROM pg_attribute "
                                      "WHERE attname = 'tenant' AND attgenerated = 's' AND "
                                      "attrelid::regclass::text IN ('fence', 'roam_subscription') ORDER BY 1")
            assert [r["t"] for r in generated] == ["fence", "roam_subscription"]
            indexes = await c.fetch("SELECT indexname FROM pg_indexes WHERE schemaname = $1", name)
            assert {"fence_by_tenant", "roam_subscription_by_tenant", "tenant_member_by_uid"} <= {
                r["indexname"] for r in indexes}
        finally:
            await c.close()
    finally:
        await drop_schema(stack["postgres"]["dsn"], name)


async def test_migration_rewrites_an_existing_deployment(stack: ConnectionSettings, tmp_path: Path) -> None:
    name, dsn = await scratch_schema(stack["postgres"]["dsn"])
    try:
        await migrate_upto(dsn, TENANTS_MIGRATION - 1, tmp_path)
        c = await routing_store.connect(dsn)
        try:
            assert await fk_definitions(c) == FK_DEFS
            await c.execute(BEFORE_TENANTS)
            assert (await migrate(dsn))[0] == f"{TENANTS_MIGRATION:04d}_tenants"  # then the later ones
            assert await fk_definitions(c) == FK_DEFS
            await check_after_tenants(c)
        finally:
            await c.close()
    finally:
        await drop_schema(stack["postgres"]["dsn"], name)


@pytest.mark.parametrize("kind", ["fence", "subscription", "hive", "hive-fence", "event", "nothing"])
async def test_what_makes_the_default_tenant(stack: ConnectionSettings, tmp_path: Path, kind: str) -> None:
    name, dsn = await scratch_schema(stack["postgres"]["dsn"])
    fence = "INSERT INTO fence (id, geometry, version, min_lon, min_lat, max_lon, max_lat) " \
            "VALUES ('f1', '{}', 1, 0, 0, 1, 1);"
    hive = "INSERT INTO hive (id, name, type, lon, lat, fence_id) VALUES ('h1', 'H', 'bar', 9.5, 47.1, "
    rows = {"fence": fence,
            "subscription": "INSERT INTO roam_subscription (id, owner, object_id, radius_m) "
                            "VALUES ('rs-1', 'u', 'car-1', 5)",
            "hive": hive + "NULL)",
            "hive-fence": fence + hive + "'f1')",
            "event": "INSERT INTO fence_event (event_id, fence_id, object_id, event, reason, ts) "
                     "VALUES ('e1', 'gone', 'car-1', 'enter', 'entered', 1)",
            "nothing": "SELECT 1"}
    try:
        await migrate_upto(dsn, TENANTS_MIGRATION - 1, tmp_path)
        c = await asyncpg.connect(dsn)
        try:
            await c.execute(rows[kind])
            await migrate(dsn)
            # a hive without a fence is venue data, not a tenant's
            expected = [] if kind in ("hive", "nothing") else [("default", "Existing data (before tenants)")]
            assert await pairs(c, "SELECT id, name FROM tenant") == expected
        finally:
            await c.close()
    finally:
        await drop_schema(stack["postgres"]["dsn"], name)
