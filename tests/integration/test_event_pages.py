"""`GET /fences/{id}/events` (and the AMQP `events` op, FenceClient) page the events archive by
cursor: more events at one ts than a page holds (a busy fence's `fence_deleted` LEAVEs, a new
fence's ENTERs) are paged through, each exactly once; `since` still says where to start; a
malformed, altered or another fence's cursor is a 400.

The API is this checkout's, served in this process by uvicorn on a free port (the stack's `api`
process runs the code it started with): a real FenceManager on the stack's RabbitMQ and
PostgreSQL, real ID tokens of the Auth emulator, and the events stored by the stack's real
archiver from fence.event-batches (the events of the session's tenant, whose member asks). The
AMQP op runs through the RPC server's own handler
(`RpcServer.answer`) on the same service; FenceClient's paging over a loopback to it (the
broker's queue fence.api is shared with the stack's API process, which would answer half the
requests with its own code)."""

from __future__ import annotations

import asyncio
import base64
import socket
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, cast

import aio_pika
import asyncpg
import httpx
import orjson
import pytest
import uvicorn
from geofence_client.amqp import FenceClient, Reply

from deploy import firebase_emulator as fe
from deploy.settings import ConnectionSettings, Settings
from exchanges import shell
from exchanges import topology as t
from exchanges.tenancy import qualify
from fence.api import create_app
from fence.auth import EMULATOR_HOST_ENV, FirebaseVerifier
from fence.manager import FenceManager
from fence.rpc import RpcServer
from fence.service import FenceService
from tests.integration.clients import DEADLINE, add_member

pytestmark = pytest.mark.integration

LIMIT = 5
AT_ONCE = 23  # events at one identical ts: more than four pages of LIMIT
T0 = 1_700_000_000.125  # a ts with a fraction: the cursor must carry it exactly


@dataclass(frozen=True)
class Served:
    """This checkout's API served in the test, and the account that asks (uid, token, auth): an
    editor of `tenant`."""

    uid: str
    token: str
    tenant: str
    url: str
    service: FenceService
    rpc: RpcServer

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@pytest.fixture(scope="module")
async def served(stack: ConnectionSettings, tenant: str) -> AsyncIterator[Served]:
    host, port = stack["firebase"]["auth_emulator_host"].rsplit(":", 1)
    project = stack["firebase"]["project"]
    if not fe.running(host, int(port)):
        pytest.fail("the Firebase Auth emulator is not running: `geofence up` starts it", pytrace=False)
    uid, token = fe.sign_up(host, int(port), project, f"{uuid.uuid4().hex[:12]}@example.org",
                            uuid.uuid4().hex)
    add_member(tenant, uid, "editor")
    topology = Settings.from_env().topology
    amqp = stack["users"][t.MANAGER_USER][t.FENCES_VHOST] + f"?name=test-event-pages-{uuid.uuid4().hex[:6]}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(EMULATOR_HOST_ENV, f"{host}:{port}")
        verifier = FirebaseVerifier(project, f"{host}:{port}")
        async with FenceManager(amqp, stack["postgres"]["dsn"], topology.regions,
                                topology.workers) as manager:
            service = FenceService(manager)
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            server = uvicorn.Server(uvicorn.Config(create_app(service, verifier), log_level="warning",
                                                   lifespan="off"))
            task = asyncio.create_task(server.serve(sockets=[sock]))
            try:
                end = time.monotonic() + DEADLINE
                while not server.started:  # polled, with a deadline
                    assert not task.done() and time.monotonic() < end, task
                    await asyncio.sleep(0.05)
                yield Served(uid, token, tenant, f"http://127.0.0.1:{sock.getsockname()[1]}", service,
                             RpcServer(service, verifier, shell.Counters()))
            finally:
                server.should_exit = True
                await task
                sock.close()
                verifier.close()


@pytest.fixture
async def http(served: Served) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=served.url, timeout=DEADLINE) as client:
        yield client


def square(lon: float, lat: float, half: float = 0.001) -> dict[str, Any]:
    return {"type": "Polygon", "coordinates": [[[lon - half, lat - half], [lon + half, lat - half],
                                                [lon + half, lat + half], [lon - half, lat + half],
                                                [lon - half, lat - half]]]}


async def fence(http: httpx.AsyncClient, served: Served) -> str:
    f = f"pages-{uuid.uuid4().hex[:10]}"
    r = await http.post("/fences", headers=served.auth, json={
        "type": "Feature", "id": f, "geometry": square(0.25, 0.25), "properties": {"name": "pages"}})
    assert r.status_code == 201, r.text
    return f


async def archive(stack: ConnectionSettings, events: list[dict[str, Any]]) -> None:
    """Publish events as x-fence does (batches on fence.event-batches: names unqualified, the
    tenant beside them) and wait until the stack's archiver stored every one."""
    async with await aio_pika.connect(stack["amqp"][t.FENCES_VHOST], timeout=DEADLINE) as conn:
        ch = await conn.channel(publisher_confirms=True)
        ex = await ch.get_exchange(t.EVENT_BATCHES_EXCHANGE)
        for start in range(0, len(events), 10):
            await ex.publish(aio_pika.Message(orjson.dumps(events[start:start + 10]),
                                              content_type="application/json",
                                              delivery_mode=aio_pika.DeliveryMode.PERSISTENT), "")
    pg = await asyncpg.connect(stack["postgres"]["dsn"])
    try:
        ids = [e["event_id"] for e in events]
        end = time.monotonic() + DEADLINE
        while await pg.fetchval("SELECT count(*) FROM fence_event WHERE event_id = ANY($1)", ids) < len(ids):
            assert time.monotonic() < end, "the archiver did not store the events"
            await asyncio.sleep(0.1)
    finally:
        await pg.close()


def leave(served: Served, f: str, ts: float, reason: str = "fence_deleted") -> dict[str, Any]:
    """A LEAVE of the served tenant's fence `f`, as x-fence sends it."""
    return {"schema": 1, "event": "leave", "tenant": served.tenant, "fence_id": f,
            "object_id": f"o-{uuid.uuid4().hex[:8]}", "ts": ts, "reason": reason,
            "event_id": uuid.uuid4().hex}


async def stored_order(stack: ConnectionSettings, served: Served, f: str) -> list[str]:
    """The archive's own order of the fence's events (ts, event_id), by PostgreSQL (which names
    the fence as the pipeline does, qualified)."""
    pg = await asyncpg.connect(stack["postgres"]["dsn"])
    try:
        return [r["event_id"] for r in await pg.fetch(
            "SELECT event_id FROM fence_event WHERE fence_id = $1 ORDER BY ts, event_id",
            qualify(served.tenant, f))]
    finally:
        await pg.close()


async def pages(http: httpx.AsyncClient, served: Served, f: str, **params: Any) -> list[dict[str, Any]]:
    """Every page, following `next` until it is null."""
    got, cursor = [], None
    for _ in range(100):
        r = await http.get(f"/fences/{f}/events", headers=served.auth,
                           params={**params, "limit": LIMIT, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        page = r.json()
        assert len(page["events"]) <= LIMIT
        got.append(page)
        cursor = page["next"]
        if cursor is None:
            return got
    raise AssertionError("the pages never end")


async def test_more_events_at_one_ts_than_a_page_holds_are_paged_through_each_once(
        stack: ConnectionSettings, served: Served, http: httpx.AsyncClient) -> None:
    f = await fence(http, served)
    try:
        before = [leave(served, f, T0 - 10.0, "exited") for _ in range(2)]
        burst = [leave(served, f, T0) for _ in range(AT_ONCE)]  # a busy fence deleted: one ts for every LEAVE
        after = [leave(served, f, T0 + 5.5, "exited") for _ in range(2)]
        await archive(stack, [*before, *burst, *after])
        order = await stored_order(stack, served, f)
        assert len(order) == len(before) + AT_ONCE + len(after)

        got = await pages(http, served, f)
        ids = [e["event_id"] for p in got for e in p["events"]]
        assert len(ids) == len(set(ids)), "an event came twice"
        assert ids == order  # every event, once, in the archive's order
        assert [len(p["events"]) for p in got] == [LIMIT] * 5 + [2]
        assert all(p["next"] for p in got[:-1]) and got[-1]["next"] is None
        # the burst alone spans pages: since = its ts would have returned its first page forever
        assert sum(e["ts"] == T0 for e in got[1]["events"]) == LIMIT

        # since is still the starting point; the cursor continues from there
        from_burst = [e["event_id"] for p in await pages(http, served, f, since=T0) for e in p["events"]]
        assert from_burst == order[len(before):]
        # a last page that is exactly full says so at once: no empty page after it
        r = await http.get(f"/fences/{f}/events", headers=served.auth,
                           params={"limit": len(order)})
        assert r.status_code == 200 and r.json()["next"] is None and len(r.json()["events"]) == len(order)
    finally:
        await http.delete(f"/fences/{f}", headers=served.auth)


async def test_a_cursor_the_api_did_not_give_is_a_400(stack: ConnectionSettings, served: Served,
                                                     http: httpx.AsyncClient) -> None:
    f, other = await fence(http, served), await fence(http, served)
    try:
        await archive(stack, [leave(served, f, T0) for _ in range(3)]
                      + [leave(served, other, T0) for _ in range(3)])
        r = await http.get(f"/fences/{f}/events", headers=served.auth, params={"limit": 1})
        good = r.json()["next"]
        assert r.status_code == 200 and good
        # the JSON of a cursor, edited to start elsewhere and encoded again, without its check
        forged = base64.urlsafe_b64encode(bytes(6) + orjson.dumps([1, f, 0.0, "0"])).decode().rstrip("=")
        other_next = (await http.get(f"/fences/{other}/events", headers=served.auth,
                                     params={"limit": 1})).json()["next"]
        for bad, words in [("not a cursor!", "not a cursor"), ("abc", "malformed"),
                           (good[:-3], "malformed"), (good + "A", "malformed"),
                           (good[:10] + ("A" if good[10] != "A" else "B") + good[11:], "malformed"),
                           (forged, "malformed"), ("x" * 5000, "not a cursor"),
                           (base64.urlsafe_b64encode(b"[1]").decode(), "malformed"),
                           (other_next, "another fence")]:
            r = await http.get(f"/fences/{f}/events", headers=served.auth, params={"cursor": bad})
            assert r.status_code == 400, (bad, r.status_code, r.text)
            assert words in r.json()["error"] and "cursor" in r.json()["error"], (bad, r.text)
        # the good one still works
        r = await http.get(f"/fences/{f}/events", headers=served.auth, params={"cursor": good, "limit": 5})
        assert r.status_code == 200 and len(r.json()["events"]) == 2 and r.json()["next"] is None
    finally:
        for x in (f, other):
            await http.delete(f"/fences/{x}", headers=served.auth)


async def test_the_amqp_op_and_fence_client_page_the_same_way(stack: ConnectionSettings, served: Served,
                                                              http: httpx.AsyncClient) -> None:
    f = await fence(http, served)
    try:
        await archive(stack, [leave(served, f, T0) for _ in range(AT_ONCE)])
        order = await stored_order(stack, served, f)

        async def rpc_events(**args: Any) -> dict[str, Any]:
            message = SimpleNamespace(body=orjson.dumps({"op": "events", "token": served.token, **args}))
            reply, bad = await served.rpc.answer(cast(Any, message))
            assert bad is None, bad
            return reply

        ids, cursor = [], None
        while True:
            reply = await rpc_events(fence_id=f, limit=LIMIT, cursor=cursor)
            assert reply["status"] == 200, reply
            ids += [e["event_id"] for e in reply["result"]["events"]]
            cursor = reply["result"]["next"]
            if cursor is None:
                break
        assert ids == order
        assert (await rpc_events(fence_id=f, cursor="garbage"))["status"] == 400
        assert await rpc_events(fence_id=f, cursor=5) == {"status": 400,
                                                          "error": "cursor 5: a string expected"}

        class Loopback(FenceClient):
            """FenceClient with its requests answered by the RPC server's handler in process."""

            async def call(self, op: str, timeout: float | None = None, **args: Any) -> Reply:
                assert op == "events", op
                reply = await rpc_events(**args)
                return Reply(reply["status"], reply.get("result"), reply.get("error"))

        client = Loopback("amqp://unused", served.token)
        assert [e["event_id"] async for e in client.all_events(f, limit=LIMIT)] == order
        assert [e["event_id"] async for e in client.all_events(f, since=T0 + 1)] == []
    finally:
        await http.delete(f"/fences/{f}", headers=served.auth)
