"""The fence API against the running stack (`geofence up`): HTTP (uvicorn, the `api` sidecar)
and AMQP request / reply (as the tenant's application user), with real Firebase ID tokens from
the Auth emulator, real positions through the pipeline, the events archive in PostgreSQL and
fences that follow an object.

Callers are members of tenants (tests/integration/conftest.py): alice an editor of the
session's tenant, bob an editor of another tenant, for whom alice's fences do not exist (404)."""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import asyncpg
import httpx
import orjson
import pytest
from geofence_client.amqp import FenceApiError, FenceClient, Reply

from deploy import firebase_emulator as fe
from deploy.settings import ConnectionSettings, Settings
from exchanges import topology as t
from exchanges.tenancy import qualify
from fence.manager import FenceManager
from fence.service import TENANT_HEADER
from tests.integration.clients import (
    DEADLINE,
    POLL,
    Account,
    Firebase,
    Login,
    account,
    add_member,
    api,
    close_connection,
    login_url,
    q,
)
from tests.integration.test_pipeline import Step, publish_positions
from tests.integration.wire_tap import FORGED

pytestmark = pytest.mark.integration

LON, LAT = 9.5209, 47.1410  # Vaduz
D = 0.002  # ~150 m east-west, ~220 m north-south


def square(lon: float, lat: float, half: float = D) -> dict[str, Any]:
    return {"type": "Polygon", "coordinates": [[[lon - half, lat - half], [lon + half, lat - half],
                                                [lon + half, lat + half], [lon - half, lat + half],
                                                [lon - half, lat - half]]]}


def feature(fence_id: str | None, geometry: dict[str, Any], **props: Any) -> dict[str, Any]:
    f: dict[str, Any] = {"type": "Feature", "geometry": geometry,
                         "properties": {"name": "test", "timeout_s": 600, **props}}
    if fence_id is not None:
        f["id"] = fence_id
    return f


@pytest.fixture(scope="module")
def alice(editor: Account) -> Account:
    """An editor of the session's tenant."""
    return editor


@pytest.fixture(scope="module")
def bob(outsider: Account) -> Account:
    """An editor of another tenant."""
    return outsider


@pytest.fixture
async def http(stack: ConnectionSettings) -> AsyncIterator[httpx.AsyncClient]:
    assert stack["api"] is not None
    async with httpx.AsyncClient(base_url=stack["api"], timeout=DEADLINE) as client:
        yield client


@pytest.fixture
async def made(http: httpx.AsyncClient, alice: Account) -> AsyncIterator[list[str]]:
    """Fence ids a test created as alice; deleted afterwards."""
    ids: list[str] = []
    yield ids
    for fid in ids:
        await http.delete(f"/fences/{fid}", headers=alice.auth)


def fid() -> str:
    return f"api-{uuid.uuid4().hex[:10]}"


async def until(check: Any, what: str, deadline: float = DEADLINE) -> Any:
    """Poll an async check until it returns something truthy."""
    end = time.monotonic() + deadline
    while True:
        found = await check()
        if found:
            return found
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(POLL)


# --------------------------------------------------------------------------- CRUD


async def test_create_read_list_replace_delete(http: httpx.AsyncClient, alice: Account,
                                               made: list[str], tenant: str) -> None:
    f = fid()
    r = await http.post("/fences", json=feature(f, square(LON, LAT), name="Vaduz"), headers=alice.auth)
    assert r.status_code == 201, r.text
    made.append(f)
    body = r.json()
    assert body["id"] == f and body["properties"]["owner"] == alice.uid
    assert body["properties"]["tenant"] == tenant  # the id as the tenant gave it, the tenant beside
    assert body["properties"]["version"] == 1 and body["properties"]["ranges"] > 0
    assert r.headers["etag"] == '"1"' and r.headers["location"] == f"/fences/{f}"

    got = await http.get(f"/fences/{f}", headers=alice.auth)
    assert got.status_code == 200 and got.json()["properties"]["name"] == "Vaduz"
    near = f"{LON - 0.01},{LAT - 0.01},{LON + 0.01},{LAT + 0.01}"
    listed = await http.get("/fences", params={"bbox": near}, headers=alice.auth)
    assert f in [x["id"] for x in listed.json()["features"]]
    elsewhere = await http.get("/fences", params={"bbox": "0,0,1,1"}, headers=alice.auth)
    assert f not in [x["id"] for x in elsewhere.json()["features"]]

    moved = await http.put(f"/fences/{f}", json=feature(None, square(LON + 0.01, LAT)),
                           headers={**alice.auth, "If-Match": '"1"'})
    assert moved.status_code == 200, moved.text
    assert moved.json()["properties"]["version"] == 2
    stale = await http.put(f"/fences/{f}", json=feature(None, square(LON, LAT)),
                           headers={**alice.auth, "If-Match": '"1"'})
    assert stale.status_code == 409 and "version 2" in stale.json()["error"]
    again = await http.post("/fences", json=feature(f, square(LON, LAT)), headers=alice.auth)
    assert again.status_code == 409

    gone = await http.delete(f"/fences/{f}", headers=alice.auth)
    assert gone.status_code == 200 and gone.json()["deleted"] is True
    assert (await http.get(f"/fences/{f}", headers=alice.auth)).status_code == 404
    assert (await http.delete(f"/fences/{f}", headers=alice.auth)).status_code == 404


async def test_concurrent_updates_of_one_fence_one_wins(http: httpx.AsyncClient, alice: Account,
                                                        made: list[str]) -> None:
    f = fid()
    assert (await http.post("/fences", json=feature(f, square(LON, LAT)),
                            headers=alice.auth)).status_code == 201
    made.append(f)
    answers = await asyncio.gather(*(
        http.put(f"/fences/{f}", json=feature(None, square(LON + i * 0.001, LAT)),
                 headers={**alice.auth, "If-Match": '"1"'}) for i in range(1, 6)))
    assert sorted(a.status_code for a in answers) == [200, 409, 409, 409, 409]
    assert (await http.get(f"/fences/{f}", headers=alice.auth)).json()["properties"]["version"] == 2


# --------------------------------------------------------------------------- authentication


async def test_tokens_missing_forged_expired_are_401(http: httpx.AsyncClient, alice: Account,
                                                     firebase: tuple[str, int, str]) -> None:
    assert (await http.get("/fences")).status_code == 401
    assert (await http.get("/fences")).headers["www-authenticate"].startswith("Bearer")
    for header in ("Basic abc", "Bearer", "Bearer not-a-jwt", f"Bearer {fe.expired_token(alice.token)}",
                   f"Bearer {fe.forged_token(alice.token, sub='nobody', user_id='nobody')}",
                   f"Bearer {fe.forged_token(alice.token, aud='another-project')}"):
        r = await http.get("/fences", headers={"Authorization": header})
        assert r.status_code == 401, (header[:40], r.text)
        assert r.json()["error"]
    # health and the docs stay open
    assert (await http.get("/health")).status_code == 200
    assert (await http.get("/openapi.json")).json()["paths"]["/fences/{fence_id}/objects"]
    assert (await http.get("/docs")).status_code == 200
    # and so does the published message contract (exchanges/schemas/)
    listed = (await http.get("/schemas")).json()
    assert listed["schema_version"] == 1 and listed["schemas"]["event"] == "/schemas/event.schema.json"
    served = await http.get(listed["schemas"]["event"])
    assert served.headers["content-type"].startswith("application/schema+json")
    assert served.json()["properties"]["schema"]["const"] == 1
    assert (await http.get(listed["asyncapi"])).json()["asyncapi"] == "3.0.0"
    for bad in ("nothing.schema.json", "..%2Fsettings.py", "%2Fetc%2Fpasswd"):
        assert (await http.get(f"/schemas/{bad}")).status_code == 404, bad


async def test_another_tenants_fence_is_404(http: httpx.AsyncClient, alice: Account, bob: Account,
                                            made: list[str], tenant: str, other_tenant: str) -> None:
    """For a member of another tenant, alice's fence does not exist: a 404 that reads as for a
    fence never made; the same name in its own tenant is another fence."""
    f, ghost = fid(), fid()
    assert (await http.post("/fences", json=feature(f, square(LON, LAT)),
                            headers=alice.auth)).status_code == 201
    made.append(f)
    for method, path, body in (("GET", "/fences/{}", None),
                               ("PUT", "/fences/{}", feature(None, square(0.5, 0.5))),
                               ("DELETE", "/fences/{}", None), ("GET", "/fences/{}/objects", None),
                               ("GET", "/fences/{}/events", None)):
        r = await http.request(method, path.format(f), json=body, headers=bob.auth)
        assert r.status_code == 404, (method, path, r.text)
        never = await http.request(method, path.format(ghost), json=body, headers=bob.auth)
        # the same answer, word for word, whether the fence exists in another tenant or nowhere
        same = {k: v.replace(f, ghost) if isinstance(v, str) else v for k, v in r.json().items()}
        assert (never.status_code, never.json()) == (404, same) and same["detail"] == same["error"]
    assert f not in [x["id"] for x in (await http.get("/fences", headers=bob.auth)).json()["features"]]
    # the same name in bob's tenant: his own fence, alice's untouched
    own = await http.post("/fences", json=feature(f, square(0.5, 0.5)), headers=bob.auth)
    assert own.status_code == 201, own.text
    try:
        assert own.json()["properties"]["tenant"] == other_tenant
        listed = (await http.get("/fences", headers=bob.auth)).json()["features"]
        assert [(x["geometry"], x["properties"]["tenant"]) for x in listed if x["id"] == f] == [
            (square(0.5, 0.5), other_tenant)]
        mine = (await http.get(f"/fences/{f}", headers=alice.auth)).json()
        assert (mine["properties"]["version"], mine["properties"]["tenant"]) == (1, tenant)
        assert mine["geometry"] == square(LON, LAT)
    finally:
        assert (await http.delete(f"/fences/{f}", headers=bob.auth)).status_code == 200
    assert (await http.get(f"/fences/{f}", headers=alice.auth)).status_code == 200


async def test_viewers_read_editors_change(http: httpx.AsyncClient, alice: Account, viewer: Account,
                                           made: list[str]) -> None:
    f = fid()
    assert (await http.post("/fences", json=feature(f, square(LON, LAT)),
                            headers=alice.auth)).status_code == 201
    made.append(f)
    for path in (f"/fences/{f}", "/fences", f"/fences/{f}/objects", f"/fences/{f}/events"):
        assert (await http.get(path, headers=viewer.auth)).status_code == 200, path
    for method, path, body in (("POST", "/fences", feature(fid(), square(LON, LAT))),
                               ("PUT", f"/fences/{f}", feature(None, square(LON + 0.01, LAT))),
                               ("DELETE", f"/fences/{f}", None)):
        r = await http.request(method, path, json=body, headers=viewer.auth)
        assert r.status_code == 403 and "editor" in r.json()["error"], (method, path, r.text)
    assert (await http.get(f"/fences/{f}", headers=alice.auth)).json()["properties"]["version"] == 1


async def test_a_member_of_two_tenants_names_one(http: httpx.AsyncClient, firebase: Firebase,
                                                 made: list[str], tenant: str, other_tenant: str) -> None:
    carol = account(firebase)
    add_member(tenant, carol.uid, "editor")
    add_member(other_tenant, carol.uid, "viewer")
    r = await http.get("/fences", headers=carol.auth)
    assert r.status_code == 403 and TENANT_HEADER in r.json()["error"], r.text
    f = fid()
    r = await http.post("/fences", json=feature(f, square(LON, LAT)), headers=carol.acting_in(tenant).auth)
    assert r.status_code == 201 and r.json()["properties"]["tenant"] == tenant, r.text
    made.append(f)
    assert (await http.get(f"/fences/{f}", headers=carol.acting_in(other_tenant).auth)).status_code == 404
    r = await http.post("/fences", json=feature(fid(), square(LON, LAT)),
                        headers=carol.acting_in(other_tenant).auth)
    assert r.status_code == 403  # a viewer there
    stranger = f"it-none-{uuid.uuid4().hex[:8]}"
    r = await http.get("/fences", headers=carol.acting_in(stranger).auth)
    assert r.status_code == 403 and stranger in r.json()["error"]


# --------------------------------------------------------------------------- bad input


async def test_bad_input_is_422_with_what_is_wrong(http: httpx.AsyncClient, alice: Account) -> None:
    def post(body: Any) -> Any:
        return http.post("/fences", json=body, headers=alice.auth)

    bow_tie = {"type": "Polygon", "coordinates": [[[0, 0], [1, 1], [1, 0], [0, 1], [0, 0]]]}
    ring = [[LON + 0.01 * math.cos(a / 1000), LAT + 0.01 * math.sin(a / 1000)] for a in range(10_500)]
    huge = {"type": "Polygon", "coordinates": [[*ring, ring[0]]]}
    cases = [
        (feature(fid(), bow_tie), "self-intersection"),
        (feature(fid(), huge), "vertices"),
        (feature(fid(), {"type": "Point", "coordinates": [LON, LAT]}), "Point"),
        (feature(fid(), square(LON, LAT, half=8)), "spans"),
        (feature(fid(), square(200, 0, half=0.1)), "lon"),
        (feature("bad id!", square(LON, LAT)), "fence id"),
        (feature(fid(), square(LON, LAT), timeout_s=-1), "timeout_s"),
        ({"type": "FeatureCollection", "features": []}, "Feature"),
        ({"type": "Feature"}, "geometry"),
    ]
    for body, words in cases:
        r = await post(body)
        assert r.status_code == 422, (words, r.text)
        assert words in r.json()["error"], (words, r.json())
    bad_json = await http.post("/fences", content=b'{"type": "Feature", ', headers={
        **alice.auth, "Content-Type": "application/json"})
    assert bad_json.status_code == 422 and "JSON" in bad_json.json()["error"]
    r = await http.get("/fences", params={"bbox": "1,2,3"}, headers=alice.auth)
    assert r.status_code == 422 and "bbox" in r.json()["error"]
    r = await http.put(f"/fences/{fid()}", json={"follow": "car 1", "radius_m": 10}, headers=alice.auth)
    assert r.status_code == 422 and "object id" in r.json()["error"]
    r = await http.put(f"/fences/{fid()}", json=feature(None, square(LON, LAT)), headers=alice.auth)
    assert r.status_code == 404


# --------------------------------------------------------------------------- live state and events


async def archived(http: httpx.AsyncClient, who: Account, f: str,
                   since: float = 0.0) -> list[dict[str, Any]]:
    r = await http.get(f"/fences/{f}/events", params={"since": since}, headers=who.auth)
    assert r.status_code == 200, r.text
    events: list[dict[str, Any]] = r.json()["events"]
    return events


async def test_occupants_events_fence_changed_and_deleted(stack: ConnectionSettings,
                                                          http: httpx.AsyncClient, alice: Account,
                                                          bob: Account, made: list[str], tenant: str) -> None:
    f, obj = fid(), f"o-{uuid.uuid4().hex[:10]}"
    assert (await http.post("/fences", json=feature(f, square(LON, LAT)),
                            headers=alice.auth)).status_code == 201
    made.append(f)
    # the object reports from inside until x-geo has the new binding (the API returns once the
    # change is stored and sent, not once every region applied it)
    first: list[float] = []

    async def inside() -> bool:
        first.append(time.time())
        await publish_positions(stack, qualify(tenant, obj), [Step(LON, LAT, first[-1])])
        r = await http.get(f"/fences/{f}/objects", headers=alice.auth)
        return obj in [o["object_id"] for o in r.json()["objects"]]

    await until(inside, f"{obj} inside {f}")
    mine = (await http.get(f"/objects/{obj}/fences", headers=alice.auth)).json()
    assert mine["fences"] == [f]
    # bob's tenant's obj is another object, in none of its fences
    assert (await http.get(f"/objects/{obj}/fences", headers=bob.auth)).json()["fences"] == []
    enter = await until(lambda: _find(http, alice, f, obj, "enter", "entered"), "the archived ENTER")
    assert enter["ts"] in first

    # moved away from the object: LEAVE fence_changed; moved back: ENTER fence_changed; deleted
    assert (await http.put(f"/fences/{f}", json=feature(None, square(LON + 0.05, LAT)),
                           headers=alice.auth)).status_code == 200
    await until(lambda: _find(http, alice, f, obj, "leave", "fence_changed"), "LEAVE fence_changed")
    assert (await http.put(f"/fences/{f}", json=feature(None, square(LON, LAT)),
                           headers=alice.auth)).status_code == 200
    await until(lambda: _find(http, alice, f, obj, "enter", "fence_changed"), "ENTER fence_changed")
    assert (await http.delete(f"/fences/{f}", headers=alice.auth)).status_code == 200
    made.remove(f)
    await until(lambda: _find(http, alice, f, obj, "leave", "fence_deleted"), "LEAVE fence_deleted")
    # (objects of earlier runs parked at the same spot get their own events: only ours here)
    events = [e for e in await archived(http, alice, f) if e["object_id"] == obj]
    assert [(e["event"], e["reason"]) for e in events] == [
        ("enter", "entered"), ("leave", "fence_changed"), ("enter", "fence_changed"),
        ("leave", "fence_deleted")]
    assert {(e["tenant"], e["fence_id"]) for e in events} == {(tenant, f)}
    assert len({e["event_id"] for e in events}) == 4
    later = [e for e in await archived(http, alice, f, since=events[1]["ts"]) if e["object_id"] == obj]
    assert [e["event_id"] for e in later] == [e["event_id"] for e in events[1:]]


async def _find(http: httpx.AsyncClient, who: Account, f: str, obj: str, kind: str, reason: str
                ) -> dict[str, Any] | None:
    return next((e for e in await archived(http, who, f)
                 if e["object_id"] == obj and e["event"] == kind and e["reason"] == reason), None)


async def test_the_archive_stores_a_redelivered_event_once(stack: ConnectionSettings,
                                                          http: httpx.AsyncClient, alice: Account,
                                                          made: list[str], tenant: str) -> None:
    f = fid()
    assert (await http.post("/fences", json=feature(f, square(0.5, 0.5)),
                            headers=alice.auth)).status_code == 201
    made.append(f)
    twice = {"schema": 1, "event": "enter", "tenant": tenant, "fence_id": f, "object_id": "o-dup",
             "ts": 1000.0, "reason": "entered", "event_id": uuid.uuid4().hex}
    marker = {**twice, "object_id": "o-marker", "ts": 1001.0, "event_id": uuid.uuid4().hex}
    async with await aio_pika.connect(stack["amqp"][t.FENCES_VHOST], timeout=DEADLINE) as conn:
        ch = await conn.channel(publisher_confirms=True)
        ex = await ch.get_exchange(t.EVENT_BATCHES_EXCHANGE)
        # as one event, again in a batch (as x-fence sends them), a bad one, then the marker
        for body in (twice, [twice], {"not": "an event"}, [marker]):
            off_contract = not isinstance(body, list)  # the two the archiver must cope with
            await ex.publish(aio_pika.Message(json.dumps(body).encode(), content_type="application/json",
                                              delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                                              headers={FORGED: "off the contract on purpose"} if off_contract
                                              else None), "")
    # one consumer, one queue: once the marker is stored, both copies were handled
    await until(lambda: _find(http, alice, f, "o-marker", "enter", "entered"), "the marker event")
    events = await archived(http, alice, f)
    assert [e["object_id"] for e in events] == ["o-dup", "o-marker"]
    assert {e["tenant"] for e in events} == {tenant}
    # the archive holds the pipeline's names: qualified by the event's tenant
    pg = await asyncpg.connect(stack["postgres"]["dsn"])
    try:
        rows = await pg.fetch("SELECT fence_id, object_id FROM fence_event WHERE event_id = ANY($1::text[])",
                              [twice["event_id"], marker["event_id"]])
    finally:
        await pg.close()
    assert sorted(tuple(r) for r in rows) == [(qualify(tenant, f), qualify(tenant, "o-dup")),
                                              (qualify(tenant, f), qualify(tenant, "o-marker"))]


# --------------------------------------------------------------------------- moving fences


async def test_a_fence_follows_its_object(stack: ConnectionSettings, http: httpx.AsyncClient,
                                          alice: Account, made: list[str], tenant: str) -> None:
    f, car, parked = fid(), f"car-{uuid.uuid4().hex[:8]}", f"p-{uuid.uuid4().hex[:8]}"
    assert (await http.post("/fences", json=feature(f, square(LON, LAT, 0.0005)),
                            headers=alice.auth)).status_code == 201
    made.append(f)
    r = await http.put(f"/fences/{f}", json={"follow": car, "radius_m": 200}, headers=alice.auth)
    assert r.status_code == 200, r.text
    assert r.json()["properties"]["follow"]["object_id"] == car

    async def stands_on(ts: float, lon: float) -> bool:
        """True once the fence stands on the car's position of time ts; until then the car
        repeats it (x-ingress learns who is followed within its 2 s store poll)."""
        got = (await http.get(f"/fences/{f}", headers=alice.auth)).json()
        if got["properties"]["follow"]["ts"] == ts:
            xs = [p[0] for p in got["geometry"]["coordinates"][0]]
            assert abs((min(xs) + max(xs)) / 2 - lon) < 1e-6
            return True
        await publish_positions(stack, qualify(tenant, car), [Step(lon, LAT, ts)])
        return False

    # The car drives west in 300 m steps over a parked object that reports after each move;
    # the fence (200 m around the car) covers it at exactly one step.
    for i in range(11):
        lon, ts = LON + 0.02 - 0.004 * i, time.time()
        await until(lambda lon=lon, ts=ts: stands_on(ts, lon), f"the fence to move to step {i}")
        await publish_positions(stack, qualify(tenant, parked), [Step(LON, LAT, time.time())])
    kinds = await until(lambda: _kinds(http, alice, f, parked), "ENTER and LEAVE of the parked object")
    assert kinds == ["enter", "leave"]
    assert (await http.get(f"/fences/{f}", headers=alice.auth)).json()["properties"]["version"] >= 12
    occupants = (await http.get(f"/fences/{f}/objects", headers=alice.auth)).json()["objects"]
    assert parked not in [o["object_id"] for o in occupants]


async def _kinds(http: httpx.AsyncClient, who: Account, f: str, obj: str) -> list[str] | None:
    kinds = [e["event"] for e in await archived(http, who, f) if e["object_id"] == obj]
    return kinds if len(kinds) >= 2 and kinds[-1] == "leave" else None


# --------------------------------------------------------------------------- AMQP request / reply


async def test_the_amqp_api_with_the_callback_client(stack: ConnectionSettings, alice: Account,
                                                     bob: Account, app_user: Login, tenant: str) -> None:
    url = login_url(stack, app_user, t.FENCES_VHOST)  # the tenant's application user
    f = fid()
    async with FenceClient(url, alice.token) as client:
        created = await client.create(feature(f, square(LON, LAT)))
        assert created["id"] == f and created["properties"]["owner"] == alice.uid
        assert created["properties"]["tenant"] == tenant
        replies: list[Reply] = []
        done = asyncio.Event()

        def on_reply(reply: Reply) -> None:
            replies.append(reply)
            done.set()

        await client.request("get", {"fence_id": f}, on_reply)
        await asyncio.wait_for(done.wait(), DEADLINE)
        assert replies[0].status == 200 and replies[0].result["properties"]["version"] == 1
        moved = await client.replace(f, feature(None, square(LON + 0.01, LAT)), if_match=1)
        assert moved["properties"]["version"] == 2
        with pytest.raises(FenceApiError) as conflict:
            await client.replace(f, feature(None, square(LON, LAT)), if_match=1)
        assert conflict.value.reply.status == 409
        degenerate = {"type": "Polygon", "coordinates": [[[0, 0]]]}
        bad = await client.call("create", feature=feature(fid(), degenerate))
        assert bad.status == 422 and bad.error
        unknown = await client.call("teleport")
        assert unknown.status == 400 and "unknown op" in (unknown.error or "")
        assert (await client.delete(f))["deleted"] is True
    async with FenceClient(url, "not-a-token") as anonymous:
        assert (await anonymous.call("list")).status == 401
    async with FenceClient(url, bob.token) as other:  # another tenant's member: no such fence
        assert (await other.call("get", fence_id=f)).status == 404
        # nor by naming alice's tenant (bob is not a member of it)
        named = await other.call("get", fence_id=f, tenant=tenant)
        assert named.status == 403 and tenant in (named.error or "")


async def test_a_malformed_amqp_request_is_answered_and_dead_lettered(stack: ConnectionSettings) -> None:
    admin = stack["amqp"][t.FENCES_VHOST]
    async with await aio_pika.connect(admin, timeout=DEADLINE) as conn:
        ch = await conn.channel(publisher_confirms=True)
        replies = await ch.declare_queue("", exclusive=True)
        dl = await ch.declare_queue(t.DEAD_LETTER_QUEUE, passive=True)
        dl_before = dl.declaration_result.message_count or 0
        ex = await ch.get_exchange(t.API_EXCHANGE)
        await ex.publish(aio_pika.Message(b"{not json", reply_to=replies.name, correlation_id="c1"),
                         "")
        message = await _next(replies)
        assert message.correlation_id == "c1"
        answer = orjson.loads(message.body)
        assert answer["status"] == 400 and "malformed" in answer["error"]

        async def dead_lettered() -> bool:
            q = await ch.declare_queue(t.DEAD_LETTER_QUEUE, passive=True)
            return (q.declaration_result.message_count or 0) > dl_before

        await until(dead_lettered, "the request in dead-letters")


async def _next(queue: aio_pika.abc.AbstractQueue) -> aio_pika.abc.AbstractIncomingMessage:
    async with queue.iterator(timeout=DEADLINE) as it:
        async for message in it:
            await message.ack()
            return message
    raise AssertionError("no reply")


async def test_the_manager_asks_workers_again_after_the_broker_closed_its_connection(
        stack: ConnectionSettings, topology: t.Topology) -> None:
    """A broker-side close (what a broker restart does; here the management API closes this
    test's own connection): the FenceManager's robust connection comes back with its direct
    reply-to consumer, so inspect requests (GET /fences/{id}/objects) are answered again
    instead of refused by the broker ("fast reply consumer does not exist", a 500) until the
    process restarts."""
    name = f"test-manager-{uuid.uuid4().hex[:10]}"
    amqp = stack["users"][t.MANAGER_USER][t.FENCES_VHOST] + f"?name={name}"  # one per vhost, same name
    worker = topology.workers[0]
    async with FenceManager(amqp, stack["postgres"]["dsn"], topology.regions, topology.workers) as manager:
        assert "fence" in await manager.ask_worker(worker, {"fence_id": "no-such-fence"})

        async def listed() -> list[str]:  # the management API lists a connection within seconds
            return [c["name"] for c in api(stack, f"api/vhosts/{q(t.FENCES_VHOST)}/connections")
                    if c["client_properties"].get("connection_name") == name]

        ours = await until(listed, f"connection {name} in the management API")
        assert len(ours) == 1, ours
        close_connection(stack, ours[0])

        async def answered() -> bool:
            try:
                return "fence" in await manager.ask_worker(worker, {"fence_id": "no-such-fence"}, timeout=2)
            except Exception:  # reconnecting: the channel is closed, the worker's answer lost
                return False

        await until(answered, f"{worker}'s answer after the reconnect", deadline=2 * DEADLINE)


def test_the_api_is_a_sidecar_of_the_stack() -> None:
    from deploy import sidecars

    assert sidecars.running(Settings.from_env())["api"]
