"""The events archive's page cursor (fence/store.py `event_cursor` / `read_event_cursor`) and
its use by the service, the AMQP op, the HTTP route (with its OpenAPI) and FenceClient,
without services: a cursor reads back to exactly the (ts, event_id) it was made of; anything
else (cut, extended, one character changed, re-encoded by hand, another fence's, not text) is
refused with a message naming the cursor, and over HTTP / AMQP that is a 400, before the store."""

from __future__ import annotations

import asyncio
import base64
import math
import string
from collections.abc import Iterator
from typing import Any, cast
from unittest import mock

import orjson
import pytest
from fastapi.testclient import TestClient
from geofence_client.amqp import FenceClient, Reply
from hypothesis import given
from hypothesis import strategies as st

from fence import store, tenants
from fence.api import create_app
from fence.service import ApiError, Caller
from tests.unit.test_fence_api_inputs import Verifier, answer, service

FENCE_IDS = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", fullmatch=True)
# an archived event id: no NUL (fence/archive.py refuses it), no lone surrogate (UTF-8 has none)
EVENT_IDS = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), min_size=1,
                    max_size=200)
TS = st.floats(allow_nan=False, allow_infinity=False)
URL_SAFE = set(string.ascii_letters + string.digits + "-_")


@given(FENCE_IDS, TS, EVENT_IDS)
def test_a_cursor_reads_back_to_exactly_its_position(fence_id: str, ts: float, event_id: str) -> None:
    cursor = store.event_cursor(fence_id, ts, event_id)
    assert set(cursor) <= URL_SAFE and 0 < len(cursor) <= store.MAX_CURSOR_CHARS
    got_ts, got_id = store.read_event_cursor(cursor, fence_id)
    assert got_id == event_id
    assert got_ts == ts and math.copysign(1.0, got_ts) == math.copysign(1.0, ts)  # the same double


def test_the_longest_ids_make_a_cursor_within_the_limit() -> None:
    worst = "\U0010ffff\x1f" * 100  # 4-byte characters and characters JSON escapes
    cursor = store.event_cursor("f" * 64, -1.2345678901234567e-300, worst)
    assert len(cursor) <= store.MAX_CURSOR_CHARS
    assert store.read_event_cursor(cursor, "f" * 64)[1] == worst


def test_timestamps_of_real_events_survive_exactly() -> None:
    for ts in (1_700_000_000.125, 1_764_300_000.1234567, 0.1 + 0.2, 1e-7, 0.0, 1000.0):
        assert store.read_event_cursor(store.event_cursor("f-1", ts, "e"), "f-1") == (ts, "e")


def refused(cursor: Any, fence_id: str = "f-1") -> str:
    with pytest.raises(store.BadCursor) as info:
        store.read_event_cursor(cursor, fence_id)
    message = str(info.value)
    assert message.startswith("cursor ") and message.isprintable() and len(message) < 300
    return message


GOOD = store.event_cursor("f-1", 1_700_000_000.125, "0123456789abcdef0123456789abcdef")


def test_every_one_character_change_is_refused() -> None:
    for i, c in enumerate(GOOD):
        for other in {"A", "a", "0", "-", "_"} - {c}:
            assert "malformed or altered" in refused(GOOD[:i] + other + GOOD[i + 1:])


@pytest.mark.parametrize("cut", [1, 2, 3, 4, 8, len(GOOD) - 1])
def test_a_cut_or_extended_cursor_is_refused(cut: int) -> None:
    assert "malformed or altered" in refused(GOOD[:-cut])
    assert "malformed or altered" in refused(GOOD + GOOD[-cut:])


@pytest.mark.parametrize("bad", ["", "a b", GOOD + "=", GOOD + "==", "abc/def", "x" * 3000, "caf\u00e9",
                                 "\x00", None, 5, 1.5, ["x"], {"x": 1}, b"abc"])
def test_what_is_no_base64url_text_is_refused_before_decoding(bad: Any) -> None:
    assert "not a cursor this API gave" in refused(bad)


def checked(payload: bytes) -> str:
    """A cursor of any payload with a right check (what only someone reading the code makes)."""
    return base64.urlsafe_b64encode(store._check(payload) + payload).rstrip(b"=").decode()


@pytest.mark.parametrize("payload", [
    b'[1, "f-1", 1.5, "e"]',  # JSON, but not as the API writes it
    b'[1,"f-1",1.50,"e"]',
    b'[1,"f-1",15e-1,"e"]',
    b'[2,"f-1",1.5,"e"]',  # another version
    b'[true,"f-1",1.5,"e"]',
    b'[1,"f-1",1,"e"]',  # ts not a float
    b'[1,"f-1","1.5","e"]',
    b'[1,"f-1",1.5,""]',
    b'[1,"f-1",1.5,"e","x"]',
    b'{"ts":1.5}',
    b"not json",
    b"",
])
def test_a_well_checked_payload_not_written_by_the_api_is_refused(payload: bytes) -> None:
    assert "malformed or altered" in refused(checked(payload))


def test_the_check_is_what_event_cursor_writes() -> None:
    assert checked(orjson.dumps([1, "f-1", 1.5, "e"])) == store.event_cursor("f-1", 1.5, "e")


def test_another_fences_cursor_is_refused_naming_the_fence() -> None:
    assert "another fence's events, not of 'f-2''s" in refused(GOOD, "f-2")


# --------------------------------------------------------------------------- the service


def rows(n: int, ts: float = 5.0) -> list[dict[str, Any]]:
    return [{"event_id": f"e{k:03d}", "fence_id": "f-1", "object_id": f"o{k}", "event": "leave",
             "reason": "fence_deleted", "ts": ts, "visit_id": None, "inside_s": None} for k in range(n)]


@pytest.fixture
def archive() -> Iterator[list[tuple[Any, ...]]]:
    """f-1 of tenant t1 with 12 events at one ts; the store's calls are recorded."""
    calls: list[tuple[Any, ...]] = []

    async def fence_owner(conn: Any, fence_id: str) -> str | None:
        calls.append(("fence_owner", fence_id))
        return "uid-1" if fence_id == "t1:f-1" else None

    async def memberships(conn: Any, uid: str) -> dict[str, str]:
        return {"t1": "viewer"}

    async def fence_events(conn: Any, fence_id: str, since: float, limit: int,
                           after: tuple[float, str] | None, objects_of: str | None = None
                           ) -> list[dict[str, Any]]:
        assert objects_of == "t1"  # a tenant reads its own objects' events (no presence event)
        calls.append(("fence_events", since, limit, after))
        return [r for r in rows(12)
                if r["ts"] >= since and (after is None or (r["ts"], r["event_id"]) > after)][:limit]

    with mock.patch.object(store, "fence_owner", fence_owner), \
            mock.patch.object(store, "fence_events", fence_events), \
            mock.patch.object(tenants, "memberships", memberships):
        yield calls


def test_the_service_pages_through_events_at_one_ts_each_once(archive: list[tuple[Any, ...]]) -> None:
    svc, seen, cursor, pages = service(), [], None, 0
    while True:
        page = asyncio.run(svc.events(Caller("uid-1", tenant="t1", role="viewer"), "f-1", 0.0, 5, cursor))
        seen += [e["event_id"] for e in page["events"]]
        pages += 1
        cursor = page["next"]
        if cursor is None:
            break
    assert seen == [f"e{k:03d}" for k in range(12)] and pages == 3
    # one more row asked than the page holds: `next` is null on the last page, never an empty page after
    assert [c[2] for c in archive if c[0] == "fence_events"] == [6, 6, 6]
    assert [c[3] for c in archive if c[0] == "fence_events"] == [None, (5.0, "e004"), (5.0, "e009")]


def test_a_full_last_page_has_no_next(archive: list[tuple[Any, ...]]) -> None:
    page = asyncio.run(service().events(Caller("uid-1", tenant="t1", role="viewer"), "f-1", 0.0, 12))
    assert len(page["events"]) == 12 and page["next"] is None


@pytest.mark.parametrize("cursor", ["garbage", GOOD[:-1], "", store.event_cursor("f-2", 1.0, "e")])
def test_a_bad_cursor_is_a_400_before_the_store(archive: list[tuple[Any, ...]], cursor: str) -> None:
    with pytest.raises(ApiError) as info:
        asyncio.run(service().events(Caller("uid-1", tenant="t1", role="viewer"), "f-1", 0.0, 5, cursor))
    assert info.value.status == 400 and info.value.message.startswith("cursor ")
    assert archive == []


# --------------------------------------------------------------------------- AMQP, HTTP, client


def test_the_amqp_op_takes_a_cursor_and_refuses_one_that_is_no_string(archive: list[tuple[Any, ...]]) -> None:
    reply, bad = answer({"op": "events", "token": "good", "fence_id": "f-1", "limit": 5, "cursor": None})
    assert reply["status"] == 200 and len(reply["result"]["events"]) == 5 and bad is None
    reply, _ = answer({"op": "events", "token": "good", "fence_id": "f-1", "cursor": reply["result"]["next"]})
    assert [e["event_id"] for e in reply["result"]["events"]] == [f"e{k:03d}" for k in range(5, 12)]
    assert answer({"op": "events", "token": "good", "fence_id": "f-1", "cursor": 7})[0] == {
        "status": 400, "error": "cursor 7: a string expected"}
    reply, bad = answer({"op": "events", "token": "good", "fence_id": "f-1", "cursor": "x!"})
    assert reply["status"] == 400 and "not a cursor" in reply["error"] and bad is None


def http() -> TestClient:
    return TestClient(create_app(service(), Verifier()), raise_server_exceptions=False)


def test_the_http_route_pages_and_answers_a_bad_cursor_with_400(archive: list[tuple[Any, ...]]) -> None:
    client, auth = http(), {"Authorization": "Bearer good"}
    first = client.get("/fences/f-1/events", params={"limit": 10}, headers=auth).json()
    assert len(first["events"]) == 10 and first["next"]
    rest = client.get("/fences/f-1/events", params={"limit": 10, "cursor": first["next"]},
                      headers=auth).json()
    assert [e["event_id"] for e in rest["events"]] == ["e010", "e011"] and rest["next"] is None
    for bad in ("%%%", first["next"][:-2], "y" * 5000):
        r = client.get("/fences/f-1/events", params={"cursor": bad}, headers=auth)
        assert r.status_code == 400 and r.json()["error"].startswith("cursor "), r.text


def test_the_openapi_document_describes_the_cursor_and_next() -> None:
    op = http().get("/openapi.json").json()["paths"]["/fences/{fence_id}/events"]["get"]
    params = {p["name"]: p for p in op["parameters"]}
    assert "next" in params["cursor"]["description"] and not params["cursor"]["required"]
    assert "since" in params and "limit" in params
    page = op["responses"]["200"]["content"]["application/json"]["schema"]
    assert page["properties"]["next"]["type"] == ["string", "null"]
    assert "cursor" in page["properties"]["next"]["description"]
    assert "400" in op["responses"]


def test_fence_client_follows_next_to_the_end() -> None:
    asked: list[dict[str, Any]] = []
    pages = {None: {"events": [{"event_id": "a"}, {"event_id": "b"}], "next": "c1"},
             "c1": {"events": [{"event_id": "c"}], "next": "c2"},
             "c2": {"events": [], "next": None}}

    class Fake(FenceClient):
        async def call(self, op: str, timeout: float | None = None, **args: Any) -> Reply:
            assert op == "events"
            asked.append(args)
            return Reply(200, {"fence_id": args["fence_id"], "since": args["since"],
                               **pages[cast(Any, args.get("cursor"))]})

    async def collect() -> list[str]:
        return [e["event_id"] async for e in Fake("amqp://unused", "t").all_events("f-1", 3.0, limit=2)]

    assert asyncio.run(collect()) == ["a", "b", "c"]
    assert asked == [{"fence_id": "f-1", "since": 3.0, "limit": 2},
                     {"fence_id": "f-1", "since": 3.0, "limit": 2, "cursor": "c1"},
                     {"fence_id": "f-1", "since": 3.0, "limit": 2, "cursor": "c2"}]
