"""PostgreSQL stopped for a minute under load (issue 38), with the verdict of every fault row
(tests/faults/run.py): events identical to the ground truth after dedupe by id, nothing
lost, the raw duplicates counted, the archive (fence_event) holding exactly the distinct
events once it caught up.

While PostgreSQL is away, positions keep flowing through x-ingress, x-geo and x-fence (they
read PostgreSQL only when they start), events keep coming out, the archiver's writes wait
(its input stays unacked, retried with backoff); a fence change tried through the API meanwhile
gets a clear refusal (503, Retry-After, saying the store is unreachable) and is not made;
afterwards the archive catches up and the same change goes through.

The row's recovery is counted from PostgreSQL's start: until the archiver writes again. The
note says when the first event after the stop came out (the pipeline did not wait).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import asyncpg
import httpx
import pytest

from deploy import firebase_emulator as fe
from deploy import services
from deploy.processes import ServiceRecord, identify, load_state, save_state
from fence import tenants
from tests.faults import tenants as ft
from tests.faults.run import FaultRun, Workload, execute
from tests.faults.stack import Stack
from tests.faults.timing import poll_until, say
from tests.faults.verdict import failure_message

pytestmark = pytest.mark.timeout(600)
OUTAGE_S = 60.0
RATE = 800.0  # updates/s: the stream (50,000 updates, 62 s) outlasts the outage begun at 3-4%


@pytest.fixture(scope="module", autouse=True)
def healthy_afterwards(fault_stack: Stack) -> Iterator[None]:
    """PostgreSQL is started again by the run itself (whatever happens); a sidecar a broken
    run left dead is started for the next module."""
    yield
    if fault_stack.dead():
        fault_stack.restore()


@pytest.fixture
async def editor(fault_stack: Stack) -> AsyncIterator[tuple[str, str]]:
    """(tenant, Firebase ID token) of a fresh user, an editor of the first fault tenant."""
    conn_settings = fault_stack.conn
    host, port = conn_settings["firebase"]["auth_emulator_host"].rsplit(":", 1)
    email = f"outage-{uuid.uuid4().hex[:12]}@example.org"
    uid, token = fe.sign_up(host, int(port), conn_settings["firebase"]["project"], email, uuid.uuid4().hex)
    tenant = ft.TENANTS[0]
    await ft.ensure_tenants(conn_settings["postgres"]["dsn"])
    conn = await asyncpg.connect(conn_settings["postgres"]["dsn"])
    try:
        await tenants.put_member(conn, tenant, uid, "editor")
    finally:
        await conn.close()
    yield tenant, token
    conn = await asyncpg.connect(conn_settings["postgres"]["dsn"])  # (the server was restarted)
    try:
        with contextlib.suppress(tenants.TenantError):
            await tenants.remove_member(conn, tenant, uid, keep_admin=False)
    finally:
        await conn.close()


def square(lon: float, lat: float, d: float = 0.001) -> dict[str, object]:
    ring = [[lon, lat], [lon + d, lat], [lon + d, lat + d], [lon, lat + d], [lon, lat]]
    return {"type": "Feature", "properties": {}, "geometry": {"type": "Polygon", "coordinates": [ring]}}


def stop_postgres(stack: Stack) -> None:
    proc = identify(int((stack.settings.pg_data / "postmaster.pid").read_text().splitlines()[0]))
    services.pg_stop(stack.settings, proc)


def start_postgres(stack: Stack) -> None:
    services.pg_launch(stack.settings)
    proc = services.pg_await(stack.settings)
    state = load_state(stack.settings.state_file)
    state["postgres"] = ServiceRecord(True, proc)  # ours now: `geofence down` stops it
    save_state(stack.settings.state_file, state)


async def test_postgres_stopped_for_a_minute(fault_stack: Stack, workload: Workload, fault_seed: int,
                                             editor: tuple[str, str]) -> None:
    tenant, token = editor
    api = str(fault_stack.conn["api"])
    headers = {"Authorization": f"Bearer {token}", "X-Geofence-Tenant": tenant}
    fence_id = f"outage-{uuid.uuid4().hex[:8]}"
    run = FaultRun(fault_stack, workload, f"PostgreSQL stopped {OUTAGE_S:g}s", fault_seed + 20, rate=RATE)
    refusals: list[httpx.Response] = []

    async def inject(run: FaultRun) -> None:
        (at,) = run.moments(1, 0.03, 0.04)
        await run.reach(at)
        f = run._begin(f"PostgreSQL stopped {OUTAGE_S:g}s", "database")
        await asyncio.to_thread(stop_postgres, fault_stack)
        try:
            stopped = time.monotonic()
            flowed = run._event_after(run.publisher.sent_updates, "any")
            async with httpx.AsyncClient(timeout=30) as http:
                r = await http.post(f"{api}/fences", headers=headers,
                                    json={**square(9.6, 47.2), "id": fence_id})
                refusals.append(r)
                said = f"a fence created meanwhile: {r.status_code} {r.text[:120]}"
            during = await poll_until(flowed, OUTAGE_S - (time.monotonic() - stopped))
            events_note = (f"events flowed {time.monotonic() - stopped:.1f}s into the outage" if during
                           else "NO event came out during the outage")
            left = OUTAGE_S - (time.monotonic() - stopped)
            if left > 0:
                await asyncio.sleep(left)  # the fault itself: PostgreSQL stays away this long
        finally:
            await asyncio.to_thread(start_postgres, fault_stack)
        f.note = f"{events_note}; {said}; recovery counted from PostgreSQL's start"
        f.started, f.started_wall = time.monotonic(), time.time()  # the archive catches up from here
        run._measure(f, [], "archive")
        await run.recovered()

    out = await execute(run, inject)
    assert not out.problems, failure_message(out)
    assert refusals, "no fence change was tried during the outage"
    r = refusals[0]
    assert r.status_code == 503 and "unreachable" in r.json()["error"] and r.headers.get("Retry-After"), (
        f"a fence change while PostgreSQL was away: {r.status_code} {r.text[:300]}")
    async with httpx.AsyncClient(timeout=30) as http:  # the same change once the store is back
        made = await http.post(f"{api}/fences", headers=headers, json={**square(9.6, 47.2), "id": fence_id})
        assert made.status_code == 201, f"after the outage: {made.status_code} {made.text[:300]}"
        gone = await http.delete(f"{api}/fences/{fence_id}", headers=headers)
        assert gone.status_code == 200, gone.text
    say(f"{run.title}: the refused change went through after the outage ({made.status_code})")
