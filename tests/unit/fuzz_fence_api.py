"""The fence API without a store, for the fuzz tests (tests/unit/test_fuzz_*.py): a FenceService
over an in-memory manager, an empty store, a token verifier that takes "Bearer good", and the
HTTP app on a test client.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, cast
from unittest import mock

from fence import store, tenants
from fence.auth import Reason, Unauthenticated, User
from fence.manager import Change
from fence.service import FenceService
from tests.unit.fuzz_sidecars import (
    RING,
    WORKERS,
)


class FakeManager:
    """What FenceService needs of the FenceManager, in memory: put echoes the spec."""

    ring = RING
    workers = WORKERS

    async def put(self, spec: Any, expected: int | None = None, create: bool | None = None,
                  owner: str | None = None, follow_ts: float | None = None, quota_of: str | None = None
                  ) -> Change:
        now = datetime.now(UTC)
        record = store.FenceRecord(spec.definition(1), owner or "", now, now, ("a",), spec.follow)
        return Change(spec.fence_id, 1, ("a",), 1, 20, "w0", record=record)

    async def remove(self, fence_id: str, expected: int | None = None, owner: str | None = None) -> Change:
        raise store.UnknownFence(fence_id)

    async def ask_worker(self, worker: str, request: dict[str, Any]) -> dict[str, Any]:
        return {"fence": None, "object": {"fences": []}}

    @property
    def pool(self) -> Any:
        return self

    @contextlib.asynccontextmanager
    async def acquire(self) -> Any:
        yield None


@contextlib.contextmanager
def no_fences() -> Iterator[None]:
    """The store, empty (FakeManager's connections are None)."""
    async def unknown(conn: Any, fence_id: str) -> Any:
        raise store.UnknownFence(fence_id)

    async def nothing(*args: Any) -> Any:
        return None

    async def none_found(*args: Any) -> list[Any]:
        return []

    with mock.patch.object(store, "get_fence", unknown), mock.patch.object(store, "fence_owner", nothing), \
            mock.patch.object(store, "find_fences", none_found), \
            mock.patch.object(tenants, "memberships", member_of_t1):
        yield


async def member_of_t1(conn: Any, uid: str) -> dict[str, str]:
    """Every caller is an editor of tenant t1 (fence/tenants.py memberships)."""
    return {"t1": "editor"}


def service() -> FenceService:
    return FenceService(cast(Any, FakeManager()))


class Verifier:
    async def verify(self, authorization: str | None) -> User:
        if authorization != "Bearer good":
            raise Unauthenticated(Reason.INVALID, "not the test token")
        return User("uid-1", None, {})


def http_client() -> Any:
    from fastapi.testclient import TestClient

    from fence.api import create_app

    return TestClient(create_app(service(), Verifier()), raise_server_exceptions=False)


HTTP = http_client()
