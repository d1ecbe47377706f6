"""The fence API's refusals of wrong input (fence/service.py, fence/rpc.py, fence/api.py),
without services: a clear 4xx with the value named, before anything reaches PostgreSQL, and
never a 500. (tests/unit/test_fuzz_decoders.py fuzzes the same fronts; these pin the cases.)"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast
from unittest import mock

import orjson
import pytest
from aio_pika.abc import AbstractIncomingMessage
from fastapi.testclient import TestClient
from shapely.geometry import box
from starlette.types import Receive, Scope, Send

from exchanges import shell
from exchanges.fence_def import FenceDef
from fence import store, tenants
from fence.api import create_app
from fence.api_edges import BodyLimit
from fence.auth import Reason, Unauthenticated, User
from fence.rpc import RpcServer
from fence.service import ApiError, Caller, FenceService

NOW = datetime(2026, 1, 1, tzinfo=UTC)
YARD = box(9.500, 47.100, 9.510, 47.110)
STORED = store.FenceRecord(FenceDef(fence_id="t1:f-1", version=3, geometry=YARD, timeout_s=300.0,
                                    name="yard"), "uid-1", NOW, NOW, ("a",), None)
ME = Caller("uid-1", tenant="t1", role="editor")  # an editor of tenant t1, whose fence f-1 is
OTHER = Caller("uid-2", tenant="t2", role="admin")  # an admin of another tenant
OPERATOR = Caller("uid-9", operator=True)  # the operator claim, in no tenant


class Pool:
    """The manager's pool: connections are None (the store's functions are patched)."""

    @contextlib.asynccontextmanager
    async def acquire(self) -> Any:
        yield None


class Manager:
    pool = Pool()

    async def put(self, *args: Any, **kw: Any) -> Any:
        raise AssertionError("a refused request reached the store")


class Verifier:
    async def verify(self, authorization: str | None) -> User:
        if authorization != "Bearer good":
            raise Unauthenticated(Reason.INVALID, "not the test token")
        return User("uid-1", None, {})


def service() -> FenceService:
    return FenceService(cast(Any, Manager()))


@contextlib.contextmanager
def stored() -> Iterator[list[tuple[str, Any]]]:
    """One fence f-1 of uid-1; what reaches the store is recorded (name, arguments)."""
    calls: list[tuple[str, Any]] = []

    async def get_fence(conn: Any, fence_id: str) -> store.FenceRecord:
        calls.append(("get_fence", fence_id))
        if fence_id != "t1:f-1":
            raise store.UnknownFence(fence_id)
        return STORED

    async def find_fences(conn: Any, *args: Any) -> list[Any]:
        calls.append(("find_fences", args))
        return []

    async def fence_owner(conn: Any, fence_id: str) -> str | None:
        calls.append(("fence_owner", fence_id))
        return "uid-1" if fence_id == "t1:f-1" else None

    async def memberships(conn: Any, uid: str) -> dict[str, str]:
        return {"t1": "editor"} if uid == "uid-1" else {}

    with mock.patch.object(store, "get_fence", get_fence), \
            mock.patch.object(store, "find_fences", find_fences), \
            mock.patch.object(store, "fence_owner", fence_owner), \
            mock.patch.object(tenants, "memberships", memberships):
        yield calls


def refused(call: Any, status: int = 422) -> str:
    with pytest.raises(ApiError) as info:
        asyncio.run(call)
    assert info.value.status == status, info.value.message
    assert info.value.message.isprintable() and info.value.message.strip()
    return info.value.message


# --------------------------------------------------------------------------- the service


@pytest.mark.parametrize("after", ["a\x00b", "a b", "-a", "x" * 65, "\ud800"])
def test_a_page_cursor_that_is_no_fence_id_is_refused_before_the_store(after: str) -> None:
    with stored() as calls:
        assert refused(service().list(ME, after=after)).startswith("after: fence id ")
    assert calls == []


def test_a_page_cursor_that_is_a_fence_id_reaches_the_store() -> None:
    with stored() as calls:
        assert asyncio.run(service().list(ME, after="f-0"))["features"] == []
    assert [name for name, _ in calls] == ["find_fences"]


@pytest.mark.parametrize("fence_id", ["a\x00b", "", "a/b"])
def test_the_events_of_a_fence_id_that_cannot_be_are_refused_before_the_store(fence_id: str) -> None:
    with stored() as calls:
        assert "fence id " in refused(service().events(ME, fence_id))
    assert calls == []


@pytest.mark.parametrize(("body", "words"), [
    ({"follow": "car-1", "radius_m": 10**400}, "radius_m an integer of"),
    ({"follow": "car-1", "radius_m": float("nan")}, "radius_m nan"),
    ({"follow": "car-1", "radius_m": 100, "lon": "9.5", "lat": 47.1}, "lon '9.5'"),
    ({"follow": "car-1", "radius_m": 100, "lon": 9.5, "lat": True}, "lat True"),
    ({"follow": "car-1", "radius_m": 100, "lon": 9.5}, "lat None"),
    ({"follow": "car-1", "radius_m": 100, "lon": 9.5, "lat": 10**400}, "lat an integer of"),
    ({"follow": "car-1", "radius_m": 100, "name": "a\x00b"}, "control character U+0000"),
    ({"type": "Feature", "properties": "x", "geometry": None}, "properties must be an object"),
    ({"type": "Feature", "properties": [], "geometry": None}, "properties must be an object"),
])
def test_replace_refuses_wrong_values_with_their_name(body: dict[str, Any], words: str) -> None:
    with stored():
        assert words in refused(service().replace(ME, "f-1", body))


SQUARE = {"type": "Polygon", "coordinates": [[[9.5, 47.1], [9.51, 47.1], [9.51, 47.11], [9.5, 47.1]]]}


@pytest.mark.parametrize(("top", "props"), [
    ({"id": ["a"]}, {}), ({"id": {"a": 1}}, {}), ({"id": "f-2"}, {}), ({"id": 5}, {}),
    ({}, {"fence_id": "f-2"}), ({}, {"id": "f-2"}), ({"id": "f-1"}, {"fence_id": "f-2"}),
])
def test_replace_refuses_a_feature_naming_another_fence_than_the_path(top: dict[str, Any],
                                                                      props: dict[str, Any]) -> None:
    with stored() as calls:
        body = {"type": "Feature", **top, "properties": props, "geometry": SQUARE}
        assert "the Feature names fence " in refused(service().replace(ME, "f-1", body))
    assert calls == []


@pytest.mark.parametrize(("top", "props"), [({}, {}), ({"id": "f-1"}, {}), ({}, {"fence_id": "f-1"}),
                                            ({"id": "f-1"}, {"id": "f-1"})])
def test_replace_takes_a_feature_naming_the_paths_fence_or_none(top: dict[str, Any],
                                                                props: dict[str, Any]) -> None:
    body = {"type": "Feature", **top, "properties": props, "geometry": SQUARE}
    assert asyncio.run(service()._spec(body, "f-1", ME)).fence_id == "t1:f-1"  # qualified by its tenant


@pytest.mark.parametrize("given", [5, 1.5, True, 0, False, "", "a\x00"])
def test_create_takes_the_id_given_as_it_is(given: Any) -> None:
    f = {"type": "Feature", "id": given, "properties": {}, "geometry": {"type": "Polygon", "coordinates": [
        [[9.5, 47.1], [9.51, 47.1], [9.51, 47.11], [9.5, 47.1]]]}}
    assert refused(service().create(ME, f)).startswith("fence id ")


# --------------------------------------------------------------------------- the AMQP API


@dataclass
class Msg:
    body: bytes
    reply_to: str | None = None
    correlation_id: str | None = None


def answer(request: Any) -> tuple[dict[str, Any], str | None]:
    server = RpcServer(service(), Verifier(), shell.Counters())
    with stored():
        return asyncio.run(server.answer(cast(AbstractIncomingMessage, Msg(orjson.dumps(request)))))


@pytest.mark.parametrize("op", [[], {}, ["get"], {"op": "get"}, 5, None, "x" * 500])
def test_an_op_that_is_no_known_name_is_a_400_and_dead_lettered(op: Any) -> None:
    reply, bad = answer({"op": op, "token": "good"})
    assert reply["status"] == 400 and bad is not None and bad == reply["error"]
    assert "unknown op" in bad and len(bad) < 320  # the 500-character op is cut short


@pytest.mark.parametrize(("request_", "words"), [
    ({"op": "get", "fence_id": 5}, "fence_id 5: a string expected"),
    ({"op": "get"}, "fence_id None: a string expected"),
    ({"op": "list", "limit": "10"}, "limit '10': an integer expected"),
    ({"op": "list", "limit": True}, "limit True: an integer expected"),
    ({"op": "list", "after": 5}, "after 5: a string expected"),
    ({"op": "events", "fence_id": "f-1", "since": "0"}, "since '0': a number expected"),
    ({"op": "object_fences", "object_id": ["car-1"]}, "object_id ['car-1']: a string expected"),
])
def test_arguments_of_the_wrong_type_are_a_400_naming_them(request_: dict[str, Any], words: str) -> None:
    reply, bad = answer({**request_, "token": "good"})
    assert reply == {"status": 400, "error": words} and bad is None  # well formed: not dead-lettered


@pytest.mark.parametrize("bbox", [[9, 47, 10, 48], 5, {"x": 1}, True])
def test_a_bbox_that_is_not_a_string_is_a_422(bbox: Any) -> None:
    reply, bad = answer({"op": "list", "token": "good", "bbox": bbox})
    assert reply["status"] == 422 and reply["error"].startswith("bbox ") and bad is None


def test_well_typed_arguments_are_answered() -> None:
    reply, _ = answer({"op": "events", "token": "good", "fence_id": "f-2", "since": 0, "limit": 5})
    assert reply == {"status": 404, "error": "no fence 'f-2'"}
    reply, _ = answer({"op": "list", "token": "good", "limit": 5, "after": "f-0", "bbox": "9,47,10,48"})
    assert reply == {"status": 200, "result": {"type": "FeatureCollection", "features": []}}


# --------------------------------------------------------------------------- the HTTP API


async def echo(scope: Scope, receive: Receive, send: Send) -> None:
    """An app that answers with the body it read (and how many reads that took)."""
    body, reads = b"", 0
    while True:
        message = await receive()
        reads += 1
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    await send({"type": "http.response.start", "status": 200, "headers": [(b"x-reads", str(reads).encode())]})
    await send({"type": "http.response.body", "body": body})


LIMITED = TestClient(cast(Any, BodyLimit(echo, 10)))


def chunks(*parts: bytes) -> Iterator[bytes]:
    yield from parts


@pytest.mark.parametrize("parts", [(), (b"",), (b"0123456789",), (b"01234", b"", b"56789")])
def test_a_chunked_body_up_to_the_limit_reaches_the_app_whole(parts: tuple[bytes, ...]) -> None:
    r = LIMITED.post("/", content=chunks(*parts))
    assert (r.status_code, r.content, r.headers["x-reads"]) == (200, b"".join(parts), "1")


@pytest.mark.parametrize("parts", [(b"0123456789a",), (b"01234", b"56789", b"a"), (b"x" * 1000,) * 3])
def test_a_chunked_body_over_the_limit_is_a_413(parts: tuple[bytes, ...]) -> None:
    r = LIMITED.post("/", content=chunks(*parts))
    assert r.status_code == 413 and r.json()["error"] == "body over 10 bytes; at most 10"


def test_an_announced_body_over_the_limit_is_a_413_and_one_at_it_is_read() -> None:
    r = LIMITED.post("/", content=b"0123456789a")
    assert r.status_code == 413 and r.json()["error"] == "body of 11 bytes; at most 10"
    assert LIMITED.post("/", content=b"0123456789").content == b"0123456789"
    assert LIMITED.get("/").status_code == 200


def test_the_fence_api_answers_a_chunked_body_over_4_mib_with_413() -> None:
    http = TestClient(create_app(service(), Verifier()), raise_server_exceptions=False)
    r = http.post("/fences", content=chunks(b'{"name": "', *[b"x" * (1 << 20)] * 5, b'"}'),
                  headers={"Authorization": "Bearer good", "Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"] == "body over 4194304 bytes; at most 4194304"


# --------------------------------------------------------------------------- spatial queries


class Regions(Manager):
    """A manager whose regions answer queries from two fixed sets of rows."""

    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []

    async def ask_regions(self, kind: str, request: dict[str, Any], timeout: float = 10.0
                          ) -> dict[str, dict[str, Any]]:
        assert kind == "query"
        self.asked.append(request)
        # the regions filter by the request's tenant (exchanges/x_geo/queries.py); these rows are
        # what they would answer for t1 (or, without a tenant, for everyone)
        rows_a = [{"id": "t1:o2", "lon": 9.505, "lat": 47.105, "ts": 2.0}]
        rows_b = [{"id": "t1:o1", "lon": 9.501, "lat": 47.101, "ts": 1.0},
                  {"id": "t1:o2", "lon": 9.7, "lat": 47.2, "ts": 1.0}]
        if "tenant" not in request:
            rows_b.append({"id": "t2:o1", "lon": 9.6, "lat": 47.2, "ts": 3.0})
        return {"a": {"objects": rows_a}, "b": {"objects": rows_b}}


def test_a_member_queries_its_tenants_objects_and_the_operator_everyones() -> None:
    regions = Regions()
    svc = FenceService(cast(Any, regions))
    bbox = {"query": "bbox", "bbox": [9.4, 47.0, 9.8, 47.3], "tenant": "t2"}  # the body's tenant is ignored
    got = asyncio.run(svc.query(ME, bbox))
    assert regions.asked[-1]["tenant"] == "t1"
    assert [(r["id"], r["ts"]) for r in got["objects"]] == [("o1", 1.0), ("o2", 2.0)]  # the newer o2
    assert all("tenant" not in r for r in got["objects"])
    everyone = asyncio.run(svc.query(OPERATOR, {"query": "bbox", "bbox": [9.4, 47.0, 9.8, 47.3]}))
    assert "tenant" not in regions.asked[-1]
    assert [(r["id"], r["tenant"]) for r in everyone["objects"]] == [
        ("t1:o1", "t1"), ("t1:o2", "t1"), ("t2:o1", "t2")]
    page = asyncio.run(svc.query(ME, {**bbox, "limit": 1, "after": "o0"}))
    assert regions.asked[-1]["after"] == "t1:o0" and page["next_after"] == "o1"  # names, as the tenant's
    with stored() as calls:
        mine = asyncio.run(svc.query(ME, {"fence_id": "f-1"}))
        assert mine["query"] == "within" and regions.asked[-1]["query"] == "within"
        # another tenant's fence cannot be named: not found, as one that does not exist
        assert "no fence" in refused(svc.query(OTHER, {"fence_id": "f-1"}), 404)
        assert "no fence" in refused(svc.query(ME, {"fence_id": "f-9"}), 404)
    assert calls == [("get_fence", "t1:f-1"), ("get_fence", "t2:f-1"), ("get_fence", "t1:f-9")]
    assert "member of no tenant" in refused(svc.query(Caller("uid-3"), bbox), 403)
    assert "radius_m" in refused(svc.query(OPERATOR,
                                           {"query": "nearby", "point": [9.5, 47.1], "radius_m": -1}))
    assert "fence_id goes with" in refused(svc.query(ME, {"fence_id": "f-1", "query": "bbox"}))
    assert "JSON object" in refused(svc.query(OPERATOR, ["bbox"]))


def test_the_operator_claim_comes_from_the_token() -> None:
    assert Caller.of("u", {"geofence_operator": True}).operator
    assert not Caller.of("u", {"geofence_operator": "true"}).operator  # only a JSON true
    assert not Caller.of("u", {}).operator
