"""A hot fence on the live stack (issue 21, seed 001's "N masters"): a fence made hot with
`geofence worker hot F --masters 2` is judged by two workers, each for its own objects; the
API's occupants and `geofence inspect fence` gather both shares, each master holds only the
objects the ring gives it, and ENTER / LEAVE come once per object. Back to one master, the
objects inside are gathered on one worker again, and each stay keeps its visit (the LEAVE's
visit_id is its ENTER's, whichever worker emitted each).
"""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from deploy import worker_ops
from deploy.inspect_cmd import ask
from deploy.settings import ConnectionSettings, Settings, load_secrets
from exchanges import topology as t
from exchanges.tenancy import qualify
from tests.integration.clients import DEADLINE, Account, Firebase, Login, member
from tests.integration.test_fence_api import feature
from tests.integration.test_fence_changes_live import P_AT, PACIFIC, Events, Gateway, defined, inspect, square
from tests.integration.test_pipeline import pipeline  # noqa: F401 (fixture)

OBJECTS = 24


@pytest.fixture(scope="module")
def bob(firebase: Firebase, tenant: str) -> Account:
    """An editor of the session's tenant (the fence's and the objects')."""
    return member(firebase, tenant, "editor")


async def shares(url: str, fence_id: str, workers: list[str], mine: set[str]) -> dict[str, set[str]]:
    """Each worker's occupants of the fence (qualified ids) among `mine` (other tests' objects
    and the demo's cars may be in the fence's square too), asked directly (not gathered)."""
    out = {}
    for w in workers:
        answer = await ask(url, t.FENCE_CONTROL_EXCHANGE, w, {"fence_id": fence_id}, timeout=DEADLINE)
        fence = answer.get("fence")
        out[w] = set() if fence is None else {o["object_id"] for o in fence["occupants"]} & mine
    return out


async def test_a_hot_fence_is_judged_by_its_masters_each_for_its_objects(
        pipeline: ConnectionSettings, bob: Account, tenant: str, gateway: Login) -> None:  # noqa: F811
    settings = Settings.from_env()
    pw = load_secrets(settings)
    _, ring, _ = await worker_ops.current_ring(settings, pw)
    assert len(ring.nodes) >= 2, f"the stack has one worker ({ring.nodes}): nothing to spread over"
    f = f"hot-{uuid.uuid4().hex[:10]}"
    key = qualify(tenant, f)  # the ring, the workers and `geofence worker hot` name it so
    objects = [f"h{i:02d}-{uuid.uuid4().hex[:6]}" for i in range(OBJECTS)]
    keys = {qualify(tenant, o) for o in objects}
    url = pipeline["amqp"][t.FENCES_VHOST]
    said: list[str] = []
    assert pipeline["api"] is not None
    async with httpx.AsyncClient(base_url=pipeline["api"], timeout=DEADLINE) as http, \
            Gateway(pipeline, gateway) as gw, Events(pipeline, tenant) as ev:
        await ev.watch(f)
        created = await http.post("/fences", json=feature(f, square(*P_AT), timeout_s=3600), headers=bob.auth)
        assert created.status_code == 201, created.text
        try:
            await defined(key, 1)
            heated = await worker_ops.hot(settings, pw, [key], 2, said.append)
            masters = heated.masters[1]
            _, hot_ring, _ = await worker_ops.current_ring(settings, pw)
            assert hot_ring.masters(key) == ring.nodes_for(key, 2) and masters.startswith("2 (")
            t0 = time.time()
            await gw.send(*((o, P_AT[0] + 0.0001 * i, P_AT[1], t0) for i, o in enumerate(objects)))
            for o in objects:
                await ev.until((f, o, "enter", "entered"))

            held = await shares(url, key, hot_ring.masters(key), keys)
            assert all(held.values()), held  # both masters have objects of it
            assert sorted(o for s in held.values() for o in s) == sorted(keys)  # each on one master
            assert all(hot_ring.owner(key, o) == w for w, s in held.items() for o in s)
            got = (await http.get(f"/fences/{f}/objects", headers=bob.auth)).json()
            listed = [o["object_id"] for o in got["objects"]]  # as the tenant names them
            assert sorted(o for o in listed if o in objects) == sorted(objects)
            assert got["workers"] == hot_ring.masters(key) and got["worker_version"] == 1
            shown = inspect("fence", f, "--tenant", tenant)
            assert shown["workers"] == hot_ring.masters(key)
            assert {o["object_id"] for o in shown["occupants"]} >= keys

            cooled = await worker_ops.hot(settings, pw, [key], 1, said.append)
            assert cooled.pairs_moved >= len(held[hot_ring.masters(key)[1]])  # the second master's share
            one = ring.node_for(key)
            assert (await shares(url, key, [one], keys))[one] == keys
            await gw.send(*((o, *PACIFIC, t0 + 2) for o in objects))
            for o in objects:
                await ev.until((f, o, "leave", "exited"))
            await ev.drain()
        finally:
            _, now, _ = await worker_ops.current_ring(settings, pw)
            if key in now.hot:
                await worker_ops.hot(settings, pw, [key], 1, said.append)
            await http.delete(f"/fences/{f}", headers=bob.auth)
    for o in objects:
        assert ev.of(o) == [(f, "enter", "entered"), (f, "leave", "exited")], said
        enter, leave = (e for e in ev.got if e["object_id"] == o)
        # one visit, begun on a master and ended on the one worker after the handover
        assert enter["visit_id"] == leave["visit_id"] and leave["inside_s"] == leave["ts"] - enter["ts"]
    assert len({e["event_id"] for e in ev.got}) == len(ev.got)
