"""The sensor sidecar's reads outside a batch's commit (the periodic reload of sensors and hives,
a frame naming a sensor not known yet, the phones of a hive's new fence) go through its
StoreConnection's retry like the commit does. In CI a PostgreSQL shutting down answered the
reload's connect with "the database system is shutting down" (CannotConnectNowError) and the
error ended the sidecar: the venue queues kept no consumer for the rest of the run."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from exchanges import shell
from fence.venues import sidecar as venue_sidecar
from fence.venues import venue_store

CONFIG = shell.SidecarConfig("venue-sensors", "", "amqp://t@localhost/", "postgresql://t@localhost/",
                             ("a",), ("w0",))


class FakeConn:
    def __init__(self) -> None:
        self.closed = False

    def is_closed(self) -> bool:
        return self.closed

    async def close(self) -> None:
        self.closed = True


def refusing_first(s: Any, refusals: int, attempts: list[int]) -> None:
    """`s.connection()` refuses `refusals` times the way a PostgreSQL shutting down does."""

    async def connection() -> Any:
        attempts.append(1)
        if len(attempts) <= refusals:
            raise asyncpg.exceptions.CannotConnectNowError("the database system is shutting down")
        if s.conn is None or s.conn.is_closed():
            s.conn = FakeConn()
        return s.conn

    s.connection = connection


async def test_the_periodic_reload_waits_for_a_postgresql_shutting_down(
        monkeypatch: pytest.MonkeyPatch) -> None:
    car = venue_sidecar.SensorSidecar(CONFIG)
    attempts: list[int] = []
    refusing_first(car.db, 2, attempts)
    loads: list[Any] = []

    async def load(conn: Any, sensor_ids: list[str] | None = None) -> Any:
        loads.append((conn, sensor_ids))
        return {}, {}, {}

    monkeypatch.setattr(venue_store, "load", load)
    moved = await asyncio.wait_for(car._reload_locked(), 10)
    assert moved == [] and len(attempts) == 3 and len(loads) == 1
    assert isinstance(loads[0][0], FakeConn)


async def test_a_stop_during_the_outage_ends_the_reload_with_the_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    car = venue_sidecar.SensorSidecar(CONFIG)
    attempts: list[int] = []
    refusing_first(car.db, 10**6, attempts)
    car.db.stop.set()
    with pytest.raises(asyncpg.exceptions.CannotConnectNowError):
        await asyncio.wait_for(car._reload_locked(), 10)
    assert len(attempts) == 1
