"""The events archiver's store against the real PostgreSQL (issue 5): what it reports stored
is committed, also when its connection was left inside a transaction (a store cancelled with
its session: what ran next would have been savepoints, acked and never committed)."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
import pytest

from deploy.settings import ConnectionSettings
from exchanges.shell import SidecarConfig
from exchanges.tenancy import qualify
from fence import store
from fence.archive import Archiver


def rows(prefix: str, n: int) -> list[store.EventRow]:
    return [(f"{prefix}-{i}", f"{prefix}-fence", f"{prefix}-obj", "enter", "entered", 1.0e9 + i, f"{i:08x}",
             None) for i in range(n)]


async def committed(dsn: str, prefix: str, tenant: str = "") -> int:
    """The archived events of the fence `<prefix>-fence` (of `tenant`: stored qualified)."""
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM fence_event WHERE fence_id = $1",
                                       qualify(tenant, f"{prefix}-fence")))
    finally:
        await conn.close()


async def forget(dsn: str, prefix: str, tenant: str = "") -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("DELETE FROM fence_event WHERE fence_id = ANY($1::text[])",
                           [f"{prefix}-fence", qualify(tenant, f"{prefix}-fence")])
    finally:
        await conn.close()


async def test_a_connection_left_in_a_transaction_is_replaced_and_the_rows_are_committed(
        stack: ConnectionSettings) -> None:
    dsn = stack["postgres"]["dsn"]
    prefix = f"t-arch-{uuid.uuid4().hex[:10]}"
    archiver = Archiver(SidecarConfig.from_env("fence-archiver", "", {
        "GEOFENCE_AMQP_URL": "amqp://u:p@127.0.0.1:5672/", "GEOFENCE_POSTGRES_URL": dsn,
        "GEOFENCE_REGIONS": "a,b", "GEOFENCE_WORKERS": "w0,w1"}))
    try:
        assert await archiver.store(rows(prefix, 3)) == 3
        assert await committed(dsn, prefix) == 3
        assert archiver._pg is not None
        await archiver._pg.execute("BEGIN")  # as a cancelled store can leave it
        assert await archiver.store(rows(prefix, 5)) == 2  # 3 known, 2 new
        assert await committed(dsn, prefix) == 5  # seen from another connection: committed
        assert archiver._pg is not None and not archiver._pg.is_in_transaction()
    finally:
        await archiver.close()
        await forget(dsn, prefix)


async def test_archive_events_refuses_to_run_inside_a_callers_transaction(stack: ConnectionSettings) -> None:
    conn = await asyncpg.connect(stack["postgres"]["dsn"])
    try:
        async with conn.transaction():
            with pytest.raises(asyncpg.InterfaceError, match="inside a transaction"):
                await store.archive_events(conn, rows("t-arch-never", 1))
    finally:
        await conn.close()


class Message:
    """What Archiver.handle reads of an incoming message (and dead_letter copies)."""

    def __init__(self, body: bytes) -> None:
        self.body, self.routing_key = body, "w0"
        self.headers: dict[str, object] = {}
        self.content_type, self.message_id = "application/json", None


async def test_a_batch_message_is_stored_and_its_bad_events_dead_lettered(
        stack: ConnectionSettings, monkeypatch: pytest.MonkeyPatch, tenant: str) -> None:
    import orjson

    from exchanges import shell

    dsn = stack["postgres"]["dsn"]
    prefix = f"t-arch-{uuid.uuid4().hex[:10]}"
    archiver = Archiver(SidecarConfig.from_env("fence-archiver", "", {
        "GEOFENCE_AMQP_URL": "amqp://u:p@127.0.0.1:5672/", "GEOFENCE_POSTGRES_URL": dsn,
        "GEOFENCE_REGIONS": "a,b", "GEOFENCE_WORKERS": "w0,w1"}))
    archiver.dlx = type("X", (), {"name": "dead-letters"})()
    published: list[shell.Out] = []

    async def publish_all(outs: list[shell.Out], counters: object, deadline: float | None = None) -> None:
        published.extend(outs)

    monkeypatch.setattr(shell, "publish_all", publish_all)

    def event(i: int, **change: object) -> dict[str, object]:
        return {"event": "enter", "fence_id": f"{prefix}-fence", "object_id": f"o{i}", "ts": 1.0e9 + i,
                "reason": "entered", "event_id": f"{prefix}-{i}", **change}

    # a tenant's event (names unqualified, `tenant` beside them) and one of no tenant id
    batch = [event(0), event(1, reason="teleported"), event(2), event(4, tenant=tenant)]
    try:
        messages: list[Any] = [Message(orjson.dumps(batch)), Message(orjson.dumps(event(3))),
                               Message(b"not json"), Message(orjson.dumps([event(0)])),
                               Message(orjson.dumps([event(5, tenant="Not_A_Tenant")]))]
        await archiver.handle(messages)
        assert await committed(dsn, prefix) == 3  # 0, 2 and 3; event 0 twice, stored once
        assert await committed(dsn, prefix, tenant) == 1  # 4, stored as the pipeline names it
        conn = await asyncpg.connect(dsn)
        try:
            assert await conn.fetchval("SELECT object_id FROM fence_event WHERE event_id = $1",
                                       f"{prefix}-4") == qualify(tenant, "o4")
        finally:
            await conn.close()
        reasons = [o.headers["x-geofence-reason"] for o in published if o.headers]
        assert len(reasons) == 3, reasons
        assert reasons[0].startswith("event 1 of 4: event reason 'teleported'")
        assert reasons[1].startswith("event is not JSON")
        assert reasons[2].startswith("event 0 of 1: event tenant 'Not_A_Tenant'"), reasons[2]
        assert archiver.counters.events == 4 and published[0].body == orjson.dumps(batch)
    finally:
        await archiver.close()
        await forget(dsn, prefix, tenant)
