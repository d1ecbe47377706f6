"""exchanges/routing_store.StoreConnection: one connection, one operation at a time. Tasks
that share it (the venue sidecar's notifier and its sensor watch) take turns; a connection
asyncpg lost track of (InternalClientError, what two overlapping operations once caused) is
closed and the work done again on a new one."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from exchanges.routing_store import StoreConnection


class FakeConn:
    """Records whether two operations ever overlap on it."""

    def __init__(self, name: int) -> None:
        self.name, self.busy, self.overlaps, self.closed = name, False, 0, False

    def is_closed(self) -> bool:
        return self.closed

    async def close(self) -> None:
        self.closed = True

    async def op(self, seconds: float) -> int:
        if self.busy:
            self.overlaps += 1
        self.busy = True
        await asyncio.sleep(seconds)
        self.busy = False
        return self.name


def store(conns: list[FakeConn]) -> StoreConnection:
    s = StoreConnection("postgresql://unused")

    async def connection() -> Any:
        if s.conn is None or s.conn.is_closed():
            s.conn = conns[len([c for c in conns if c.closed])]
        return s.conn

    s.connection = connection  # type: ignore[method-assign]
    return s


async def test_concurrent_callers_take_turns() -> None:
    conn = FakeConn(0)
    s = store([conn])
    got = await asyncio.gather(*(s.run(lambda c: c.op(0.01), f"op {i}") for i in range(8)))
    assert got == [0] * 8 and conn.overlaps == 0


async def test_a_connection_asyncpg_lost_track_of_is_replaced_and_the_work_redone() -> None:
    first, second = FakeConn(1), FakeConn(2)
    s = store([first, second])
    calls: list[int] = []

    async def work(c: FakeConn) -> int:
        calls.append(c.name)
        if c.name == 1:
            raise asyncpg.exceptions.InternalClientError("got result for unknown protocol state 3")
        return await c.op(0.0)

    assert await s.run(work, "watch the sensors") == 2  # type: ignore[arg-type]
    assert calls == [1, 2] and first.closed
