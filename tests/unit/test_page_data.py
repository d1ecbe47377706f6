"""The pages' data behind sign-in (fence/page_data.py), without services: the routes and the
map's websocket on the API's app (fence/api.py create_app) with a fake token verifier, fake
memberships and a map feed that is not consuming. Who gets what: /ops/data an operator's only;
/map/fences and /map/objects/{id} a tenant's own, names unqualified (an operator in no tenant:
everyone's, qualified); the websocket refused (4403 for a foreign Origin, 4401 / 4403 for its
sign-in) before any frame, then a tenant's frames only."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, ClassVar, cast
from unittest import mock

import numpy as np
import pytest
from fastapi.testclient import TestClient
from shapely.geometry import box
from starlette.testclient import WebSocketTestSession

from exchanges.fence_def import FenceDef
from exchanges.shell import Counters
from fence import page_data, store, tenants
from fence.api import create_app
from fence.auth import Reason, Unauthenticated, User
from fence.map_feed import MapFeed
from fence.map_view import MapView
from fence.page_data import NOT_ALLOWED, NOT_SIGNED_IN, add_page_data
from fence.service import FenceService

NOW = datetime(2026, 1, 1, tzinfo=UTC)
OPERATOR = {"geofence_operator": True}
# token -> (uid, claims)
TOKENS: dict[str, tuple[str, dict[str, Any]]] = {
    "member": ("uid-1", {}), "several": ("uid-4", {}), "lonely": ("uid-3", {}),
    "operator": ("uid-9", OPERATOR)}
MEMBERS: dict[str, dict[str, str]] = {}  # uid -> tenant -> role (reset by each test's app)


def record(fence_id: str) -> store.FenceRecord:
    return store.FenceRecord(FenceDef(fence_id=fence_id, version=1, geometry=box(9.5, 47.1, 9.51, 47.11),
                                      timeout_s=300.0, name=f"name of {fence_id}"), "uid-1", NOW, NOW)


FENCES = [record(f) for f in ("t1:depot", "t1:yard", "t2:depot")]


class Verifier:
    async def verify(self, authorization: str | None) -> User:
        if not authorization:
            raise Unauthenticated(Reason.MISSING_HEADER)
        found = TOKENS.get(authorization.removeprefix("Bearer "))
        if found is None:
            raise Unauthenticated(Reason.INVALID, "not a test token")
        return User(found[0], None, found[1])


class Pool:
    @contextlib.asynccontextmanager
    async def acquire(self) -> Any:
        yield None


class Manager:
    pool = Pool()
    workers: ClassVar[list[str]] = []


class Ops:
    async def take(self) -> dict[str, Any]:
        return {"processes": [], "at": 1.0}


@contextlib.contextmanager
def app(ops: Any = None, with_feed: bool = True
        ) -> Iterator[tuple[TestClient, list[tuple[Any, ...]], MapFeed]]:
    """The API's app with the pages' data; the store's find_fences recorded."""
    MEMBERS.clear()
    MEMBERS.update({"uid-1": {"t1": "viewer"}, "uid-4": {"t1": "viewer", "t2": "editor"}})
    calls: list[tuple[Any, ...]] = []

    async def find_fences(conn: Any, tenant: str | None, bbox: Any, limit: int, after: str) -> list[Any]:
        calls.append((tenant, bbox, limit, after))
        return [r for r in FENCES if (tenant is None or r.fence.fence_id.startswith(f"{tenant}:"))
                and r.fence.fence_id > after][:limit]

    async def memberships(conn: Any, uid: str) -> dict[str, str]:
        return dict(MEMBERS.get(uid, {}))

    view = MapView()
    now = datetime.now(UTC).timestamp()
    ids = ["t1:car-1", "t2:car-1", "t2:car-2", "hive-1"]
    view.add_sample(ids, np.array([9.51, 9.52, 9.53, 9.54]), np.array([47.1] * 4), np.array([now] * 4), 4,
                    now)
    view.set_counts({"t1:depot": 1, "t2:depot": 2})
    feed = MapFeed(cast(Any, None), cast(Any, Manager()), Counters(), view)
    api = create_app(FenceService(cast(Any, Manager())), Verifier())
    add_page_data(api, ops, feed if with_feed else None)
    with mock.patch.object(store, "find_fences", find_fences), \
            mock.patch.object(tenants, "memberships", memberships), TestClient(api) as client:
        yield client, calls, feed


def auth(token: str, tenant: str | None = None) -> dict[str, str]:
    out = {"Authorization": f"Bearer {token}"}
    if tenant is not None:
        out["X-Geofence-Tenant"] = tenant
    return out


# --------------------------------------------------------------------------- /ops/data


def test_ops_data_is_an_operators_only() -> None:
    with app(Ops()) as (client, _, _):
        r = client.get("/ops/data")
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        assert client.get("/ops/data", headers=auth("forged")).status_code == 401
        for who in ("member", "several", "lonely"):
            r = client.get("/ops/data", headers=auth(who))
            assert r.status_code == 403 and "operators" in r.json()["error"]
            assert "geofence_operator" in r.json()["error"]
        r = client.get("/ops/data", headers=auth("operator"))
        assert r.status_code == 200 and r.json() == {"processes": [], "at": 1.0}
    with app(None) as (client, _, _):
        r = client.get("/ops/data", headers=auth("operator"))
        assert r.status_code == 503 and "Prometheus" in r.json()["error"]
        assert client.get("/ops/data", headers=auth("member")).status_code == 403  # before the 503


# --------------------------------------------------------------------------- /map/fences


def test_a_member_gets_its_tenants_fences_unqualified() -> None:
    with app() as (client, calls, _):
        r = client.get("/map/fences", headers=auth("member"))
        assert r.status_code == 200, r.text
        got = r.json()
        assert [f["id"] for f in got["features"]] == ["depot", "yard"]
        assert {f["properties"]["tenant"] for f in got["features"]} == {"t1"}
        assert calls == [("t1", None, 5000, "")]
        r = client.get("/map/fences", params={"after": "depot", "limit": 1}, headers=auth("member"))
        assert [f["id"] for f in r.json()["features"]] == ["yard"] and r.json()["next_after"] == "yard"
        assert calls[-1] == ("t1", None, 1, "t1:depot")  # the cursor qualified by the caller's tenant


def test_a_member_of_several_names_its_tenant() -> None:
    with app() as (client, calls, _):
        r = client.get("/map/fences", headers=auth("several"))
        assert r.status_code == 403 and "several tenants" in r.json()["error"]
        r = client.get("/map/fences", headers=auth("several", "t2"))
        assert [f["id"] for f in r.json()["features"]] == ["depot"] and calls == [("t2", None, 5000, "")]
        r = client.get("/map/fences", headers=auth("member", "t2"))  # not a member of t2
        assert r.status_code == 403 and "not a member of tenant 't2'" in r.json()["error"]


def test_a_caller_in_no_tenant_gets_the_services_refusal() -> None:
    with app() as (client, calls, _):
        assert client.get("/map/fences").status_code == 401
        r = client.get("/map/fences", headers=auth("lonely"))
        assert r.status_code == 403 and "member of no tenant" in r.json()["error"]
        assert calls == []


def test_an_operator_sees_every_tenants_fences_qualified() -> None:
    with app() as (client, calls, _):
        r = client.get("/map/fences", headers=auth("operator"))
        assert [f["id"] for f in r.json()["features"]] == ["t1:depot", "t1:yard", "t2:depot"]
        assert [f["properties"]["tenant"] for f in r.json()["features"]] == ["t1", "t1", "t2"]
        assert calls == [(None, None, 5000, "")]
        r = client.get("/map/fences", params={"after": "t1:yard"}, headers=auth("operator"))
        assert [f["id"] for f in r.json()["features"]] == ["t2:depot"]
        r = client.get("/map/fences", headers=auth("operator", "t2"))  # acting in a tenant: its map
        assert [f["id"] for f in r.json()["features"]] == ["depot"] and calls[-1][0] == "t2"
        r = client.get("/map/fences", headers=auth("operator", "Not A Tenant"))
        assert r.status_code == 400 and "not a tenant id" in r.json()["error"]


@pytest.mark.parametrize(("token", "after"), [("member", "a\x00b"), ("member", "t1:depot"), ("member", "-x"),
                                              ("operator", "T1:depot"), ("operator", "t1:a b")])
def test_a_page_cursor_that_is_no_fence_id_is_refused_before_the_store(token: str, after: str) -> None:
    with app() as (client, calls, _):
        r = client.get("/map/fences", params={"after": after}, headers=auth(token))
        assert r.status_code == 422 and "after" in r.json()["error"]
        assert calls == []


def test_no_feed_is_a_503_after_the_sign_in() -> None:
    with app(with_feed=False) as (client, _, _):
        assert client.get("/map/fences").status_code == 401
        assert client.get("/map/fences", headers=auth("member")).status_code == 503


# --------------------------------------------------------------------------- /map/objects/{id}


def test_an_object_of_the_callers_tenant_only() -> None:
    with app() as (client, _, _):
        assert client.get("/map/objects/car-1").status_code == 401
        r = client.get("/map/objects/car-1", headers=auth("member"))
        assert r.status_code == 200 and r.json()["object_id"] == "car-1" and r.json()["lon"] == 9.51
        assert "tenant" not in r.json()
        assert client.get("/map/objects/car-2", headers=auth("member")).status_code == 404  # t2's
        assert client.get("/map/objects/t2:car-2", headers=auth("member")).status_code == 422
        assert client.get("/map/objects/hive-1", headers=auth("member")).status_code == 404
        r = client.get("/map/objects/car-1", headers=auth("several", "t2"))
        assert r.status_code == 200 and r.json()["lon"] == 9.52
        assert client.get("/map/objects/car-1", headers=auth("lonely")).status_code == 403


def test_an_operator_names_any_object_qualified() -> None:
    with app() as (client, _, _):
        r = client.get("/map/objects/t2:car-2", headers=auth("operator"))
        assert r.status_code == 200 and r.json()["tenant"] == "t2" and r.json()["lon"] == 9.53
        assert client.get("/map/objects/car-2", headers=auth("operator")).status_code == 404


# --------------------------------------------------------------------------- /map/ws


def closed(ws: WebSocketTestSession) -> tuple[int, str]:
    """The server's close (code, reason): what it sent first must be that close, no frame."""
    message = ws.receive()
    assert message["type"] == "websocket.close", f"a frame before the close: {str(message)[:200]}"
    return int(message["code"]), str(message.get("reason") or "")


def test_a_foreign_origin_is_closed_4403_before_anything() -> None:
    with app() as (client, _, _):
        for origin in ("http://evil.example", "null", "https://testserver", "http://testserver:8080"):
            with client.websocket_connect("/map/ws", headers={"origin": origin}) as ws:
                code, reason = closed(ws)
                assert code == NOT_ALLOWED and "origin" in reason


@pytest.mark.parametrize(("first", "code", "words"), [
    ("not json", NOT_SIGNED_IN, "sign in first"),
    ("{}", NOT_SIGNED_IN, "sign in first"),
    ('{"token": ""}', NOT_SIGNED_IN, "sign in first"),
    ('{"token": 5}', NOT_SIGNED_IN, "sign in first"),
    ('{"token": "forged"}', NOT_SIGNED_IN, "invalid token"),
    ('{"token": "member", "tenant": 5}', NOT_ALLOWED, "tenant 5"),
    ('{"token": "lonely"}', NOT_ALLOWED, "member of no tenant"),
    ('{"token": "several"}', NOT_ALLOWED, "several tenants"),
    ('{"token": "member", "tenant": "t2"}', NOT_ALLOWED, "not a member"),
    ('{"token": "operator", "tenant": "Bad Tenant"}', NOT_ALLOWED, "not a tenant id"),
])
def test_a_refused_sign_in_closes_with_its_reason_before_any_frame(first: str, code: int, words: str) -> None:
    with app() as (client, _, feed), client.websocket_connect(
            "/map/ws", headers={"origin": "http://testserver"}) as ws:
        ws.send_text(first)
        got, reason = closed(ws)
        assert (got, words in reason) == (code, True), reason
        assert len(reason.encode()) <= 123
        assert feed.clients == set()


def test_no_sign_in_in_time_is_closed_4401(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(page_data, "SIGN_IN_S", 0.2)
    with app() as (client, _, _), client.websocket_connect("/map/ws") as ws:
        code, reason = closed(ws)
        assert code == NOT_SIGNED_IN and "no sign-in within" in reason


def frames(ws: WebSocketTestSession) -> dict[str, Any]:
    message = ws.receive()
    assert message["type"] == "websocket.send", message
    data = message.get("bytes") or message.get("text")
    assert data is not None
    return dict(json.loads(data))


def test_a_member_gets_its_tenants_frames_only() -> None:
    with app() as (client, _, feed), client.websocket_connect("/map/ws") as ws:  # no Origin: no browser
        ws.send_text(json.dumps({"token": "several", "tenant": "t2"}))
        snap = frames(ws)
        assert snap["type"] == "snapshot" and sorted(snap["objects"]["ids"]) == ["car-1", "car-2"]
        assert snap["counts"] == {"depot": 2} and snap["stats"] == {"objects": 2, "fences_occupied": 1,
                                                                    "inside": 2}
        assert "t1" not in json.dumps(snap) and "hive-1" not in json.dumps(snap)
        assert [c.tenant for c in feed.clients] == ["t2"]


def test_an_operators_map_has_everything_qualified() -> None:
    with app() as (client, _, feed), client.websocket_connect(
            "/map/ws", headers={"origin": "http://testserver"}) as ws:
        ws.send_text(json.dumps({"token": "operator", "tenant": None}))
        snap = frames(ws)
        assert sorted(snap["objects"]["ids"]) == ["hive-1", "t1:car-1", "t2:car-1", "t2:car-2"]
        assert snap["counts"] == {"t1:depot": 1, "t2:depot": 2} and "positions_per_s" in snap["stats"]
        assert [c.tenant for c in feed.clients] == [None]


def test_an_open_map_is_closed_when_its_member_is_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(page_data, "RECHECK_S", 0.05)
    with app() as (client, _, _), client.websocket_connect("/map/ws") as ws:
        ws.send_text(json.dumps({"token": "member"}))
        assert frames(ws)["type"] == "snapshot"
        MEMBERS["uid-1"] = {}
        code, reason = closed(ws)
        assert code == NOT_ALLOWED and "member of no tenant" in reason


def test_an_open_map_is_closed_when_its_token_stops_verifying(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(page_data, "RECHECK_S", 0.05)
    monkeypatch.setitem(TOKENS, "short", ("uid-1", {}))
    with app() as (client, _, _), client.websocket_connect("/map/ws") as ws:
        ws.send_text(json.dumps({"token": "short"}))
        assert frames(ws)["type"] == "snapshot"
        del TOKENS["short"]  # expired, revoked
        code, _ = closed(ws)
        assert code == NOT_SIGNED_IN


def test_no_feed_closes_1013_after_the_origin_check() -> None:
    with app(with_feed=False) as (client, _, _), client.websocket_connect("/map/ws") as ws:
        assert closed(ws)[0] == 1013
