"""The attack table's rows against the HTTP API (issue 36): an outsider, a user of no tenant,
another tenant's editor and viewer, a venue counting another tenant's objects. Each row holds
when the attack is refused, its answer reveals none of the victim's data (its drivers' names,
its other objects, its tenant), and the legitimate request beside it still works."""


from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aio_pika
import asyncpg
import httpx
import orjson
import pytest

from exchanges import topology as t
from exchanges.tenancy import qualify
from tests.security.attacks import holds, ids, revealed
from tests.security.conftest import (
    CENTER,
    DEADLINE,
    VANS,
    World,
    depot,
    publish_batch,
    until,
    vans_at,
)
from tests.security.mqtt import Mqtt


async def test_an_outsider_without_a_token_reads_no_position(world: World) -> None:
    bbox = world.bbox()
    got = await world.http.get("/objects/within", params={"bbox": bbox})
    mine = await world.http.get("/objects/within", params={"bbox": bbox}, headers=world.a_admin.headers())
    holds(
        "outsider (no token)",
        "GET /objects/within?bbox=<the victim's area>",
        f"{got.status_code}, leaks {revealed(world, got.text) or 'nothing'}",
        f"victim's member: {mine.status_code}, {len(ids(mine))} objects",
        got.status_code == 401 and not revealed(world, got.text) and ids(mine) >= set(VANS),
    )


async def test_a_signed_in_user_of_no_tenant_reads_nothing(world: World) -> None:
    got = await world.http.get(
        "/objects/within", params={"bbox": world.bbox()}, headers=world.outsider.headers()
    )
    fences = await world.http.get("/fences", headers=world.outsider.headers())
    mine = await world.http.get("/fences", headers=world.a_admin.headers())
    holds(
        "signed in, no tenant",
        "GET /objects/within?bbox=..., GET /fences",
        f"{got.status_code}, {fences.status_code}; "
        f"leaks {revealed(world, got.text + fences.text) or 'nothing'}",
        f"victim's member: GET /fences {mine.status_code}",
        got.status_code == 403
        and fences.status_code == 403
        and not revealed(world, got.text + fences.text)
        and mine.status_code == 200
        and any(f["id"] == "depot" for f in mine.json()["features"]),
    )


async def test_a_wide_fence_of_another_tenant_sees_none_of_the_victims_objects(world: World) -> None:
    wide = depot("wide-net", half=5.0)
    made = await world.http.post("/fences", json=wide, headers=world.b_editor.headers())
    assert made.status_code == 201, made.text
    got = await world.http.get(
        "/objects/within", params={"fence_id": "wide-net"}, headers=world.b_editor.headers()
    )
    where = orjson.dumps([["type", "==", "delivery-van"]]).decode()
    filtered = await world.http.get(
        "/objects/within", params={"fence_id": "wide-net", "where": where}, headers=world.b_editor.headers()
    )
    box = await world.http.get(
        "/objects/within", params={"bbox": world.bbox()}, headers=world.b_editor.headers()
    )
    near = await world.http.get(
        "/objects/nearby",
        params={"lon": CENTER[0], "lat": CENTER[1], "radius_m": 5000},
        headers=world.b_editor.headers(),
    )
    mine = await world.http.get(
        "/objects/within", params={"fence_id": "depot", "where": where}, headers=world.a_admin.headers()
    )
    leaks = revealed(world, got.text + filtered.text + box.text + near.text)
    holds(
        "other tenant's editor",
        "a 10x10 degree fence over the victim, then /objects/within?fence_id=, "
        "where type==delivery-van, bbox, nearby",
        f"{got.status_code}/{filtered.status_code}/{box.status_code}/{near.status_code}, "
        f"victim's objects {len(ids(got) & set(VANS) - {'van-1'})}, leaks {leaks or 'nothing'}",
        f"victim within its depot, same filter: {sorted(ids(mine))}",
        all(r.status_code == 200 for r in (got, filtered, box, near))
        and not leaks
        and ids(mine) >= set(VANS)
        and all("driver" in str(o.get("fields")) for o in mine.json()["objects"]),
    )


@pytest.mark.parametrize(
    "path", ["/fences/depot", "/fences/depot/objects", "/fences/depot/loitering", "/fences/depot/events"]
)
async def test_the_victims_fence_is_not_found_by_another_tenant(world: World, path: str) -> None:
    got = await world.http.get(path, headers=world.b_editor.headers())
    mine = await world.http.get(path, headers=world.a_admin.headers())
    holds(
        "other tenant's editor",
        f"GET {path} (the victim's fence)",
        f"{got.status_code}, leaks {revealed(world, got.text) or 'nothing'}",
        f"victim: {mine.status_code}",
        got.status_code == 404 and not revealed(world, got.text) and mine.status_code == 200,
    )


async def test_a_fence_cannot_follow_another_tenants_object(world: World) -> None:
    made = await world.http.post(
        "/fences",
        json=depot("tail", half=0.001, at=(CENTER[0] + 1, CENTER[1])),
        headers=world.b_editor.headers(),
    )
    assert made.status_code == 201, made.text
    got = await world.http.put(
        "/fences/tail", json={"follow": "van-2", "radius_m": 100}, headers=world.b_editor.headers()
    )
    pg = await asyncpg.connect(world.stack["postgres"]["dsn"])
    try:
        follows = await pg.fetchval("SELECT follow_object FROM fence WHERE id = $1", qualify(world.b, "tail"))
    finally:
        await pg.close()
    await publish_batch(
        world,
        f"{world.a}.gw",
        world.a,
        [{"id": "van-2", "lon": CENTER[0] + 0.003, "lat": CENTER[1], "ts": time.time()}],
    )

    async def a_moved() -> bool:
        r = await world.http.get(
            "/objects/within", params={"bbox": world.bbox()}, headers=world.a_admin.headers()
        )
        return any(
            o["id"] == "van-2" and abs(o["lon"] - CENTER[0] - 0.003) < 1e-9 for o in r.json()["objects"]
        )

    await until(a_moved, "the victim's van-2 at its new place")
    fence = await world.http.get("/fences/tail", headers=world.b_editor.headers())
    x0 = fence.json()["geometry"]["coordinates"][0][0][0]
    holds(
        "other tenant's editor",
        "PUT /fences/<own> {follow: <the victim's van-2>}",
        f"{got.status_code}: follows {follows!r} (its own tenant's name), fence stays at lon {x0:.3f}",
        "the victim's van-2 moved; nobody's fence went with it",
        follows == qualify(world.b, "van-2")
        and abs(x0 - CENTER[0]) > 0.5
        and not revealed(world, fence.text, named=("van-2",)),
    )


async def test_a_subscription_of_another_tenant_never_reports_the_victims_objects(world: World) -> None:
    sub = await world.http.post(
        "/subscriptions",
        json={"id": "spy", "object": "van-1", "radius_m": 5000},
        headers=world.b_editor.headers(),
    )
    assert sub.status_code == 201, sub.text
    seen: list[dict[str, Any]] = []
    try:
        await _spy_near_the_victim(world, seen)
    finally:  # no subscription left behind: every later position of the tenant would pay for it
        gone = await world.http.delete("/subscriptions/spy", headers=world.b_editor.headers())
        assert gone.status_code in (200, 204), gone.text
    objects = {e["object"] for e in seen}
    holds(
        "other tenant's editor",
        "POST /subscriptions {object: van-1 (a name the victim uses), 5 km}, among the victim's vans",
        f"events for {sorted(objects)}; leaks {revealed(world, str(seen)) or 'nothing'}",
        "its own objects nearby: reported (decoy-1, decoy-2)",
        {"decoy-1", "decoy-2"} <= objects
        and not objects & {"van-2", "van-3"}
        and not revealed(world, str(seen))
        and all(e.get("tenant") == world.b for e in seen),
    )


async def _spy_near_the_victim(world: World, seen: list[dict[str, Any]]) -> None:
    async with await aio_pika.connect(world.amqp(f"{world.b}.app", t.FENCES_VHOST), timeout=DEADLINE) as conn:
        ch = await conn.channel()
        q = await ch.declare_queue(f"{t.app_queue_prefix(f'{world.b}.app')}spy", exclusive=True)
        await q.bind(t.EVENTS_EXCHANGE, f"{t.ROAM_EVENTS_TOPIC_PREFIX}.{world.b}.#")
        spy = Mqtt(world.stack, f"{world.b}.van-1", world.secrets[f"{world.b}.van-1"])
        try:
            # the attacker's own van-1 parks among the victim's vans (again until the subscription
            # is applied: x-ingress applies subscriptions once a second, and a tenant's objects
            # count from their first position after its first one); its own decoy comes near
            # until the subscription reports it
            def park() -> None:
                body = orjson.dumps({"lon": CENTER[0], "lat": CENTER[1], "ts": time.time()})
                assert spy.publish(f"positions/{world.b}/van-1", body) == "puback"

            await _reported(world, q, seen, "decoy-1", park)
            # then the victim's vans move around it, and a second decoy comes: its event is
            # after theirs on the worker that holds this place
            await publish_batch(
                world,
                f"{world.a}.gw",
                world.a,
                [
                    {"id": v, "lon": CENTER[0] + 0.0002 * k, "lat": CENTER[1], "ts": time.time()}
                    for k, v in enumerate(VANS)
                ],
            )
            await _reported(world, q, seen, "decoy-2")
        finally:
            spy.close()


async def _reported(
    world: World, q: aio_pika.abc.AbstractQueue, seen: list[dict[str, Any]], decoy: str,
    first: Callable[[], None] | None = None,
) -> None:
    """Publish the attacker's `decoy` near its van-1 (after `first`, each time) until a
    proximity event names it."""
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        if first is not None:
            first()
        await publish_batch(
            world,
            f"{world.b}.gw",
            world.b,
            [{"id": decoy, "lon": CENTER[0] + 0.0001, "lat": CENTER[1], "ts": time.time()}],
        )
        try:
            async with asyncio.timeout(2.0), q.iterator() as messages:
                async for m in messages:
                    await m.ack()
                    seen.append(orjson.loads(m.body))
                    if seen[-1]["object"] == decoy:
                        return
        except TimeoutError:
            continue  # not applied yet: publish again
    raise AssertionError(f"no proximity event for {decoy} within {DEADLINE:g}s")


async def test_a_viewer_cannot_write(world: World) -> None:
    tried = {
        "POST /fences": await world.http.post(
            "/fences", json=depot("viewer-fence"), headers=world.b_viewer.headers()
        ),
        "PUT /fences/wide-net": await world.http.put(
            "/fences/wide-net", json=depot("wide-net"), headers=world.b_viewer.headers()
        ),
        "DELETE /fences/wide-net": await world.http.delete(
            "/fences/wide-net", headers=world.b_viewer.headers()
        ),
        "POST /subscriptions": await world.http.post(
            "/subscriptions", json={"object": "van-1", "radius_m": 10}, headers=world.b_viewer.headers()
        ),
    }
    read = await world.http.get("/fences", headers=world.b_viewer.headers())
    holds(
        "viewer",
        "POST, PUT, DELETE /fences; POST /subscriptions",
        ", ".join(f"{k.split()[0]} {r.status_code}" for k, r in tried.items()),
        f"the viewer reads its tenant's fences: {read.status_code}",
        all(r.status_code == 403 for r in tried.values()) and read.status_code == 200,
    )


async def test_members_and_tenants_of_another_tenant_are_hidden(world: World) -> None:
    listing = await world.http.get(f"/tenants/{world.a}/members", headers=world.b_editor.headers())
    change = await world.http.put(
        f"/tenants/{world.a}/members/{world.b_editor.uid}",
        json={"role": "admin"},
        headers=world.b_editor.headers(),
    )
    header = await world.http.get("/fences", headers=world.b_editor.headers(world.a))
    mine = await world.http.get(f"/tenants/{world.a}/members", headers=world.a_admin.headers())
    answered = listing.text + change.text + header.text  # the victim's tenant id is the attacker's input
    holds(
        "other tenant's editor",
        "GET/PUT /tenants/<victim>/members, X-Geofence-Tenant: <victim>",
        f"{listing.status_code}, {change.status_code}, {header.status_code}; "
        f"leaks {revealed(world, answered.replace(world.a, '<named>')) or 'nothing'}",
        f"victim's admin lists its members: {mine.status_code}",
        listing.status_code == 404
        and change.status_code == 404
        and header.status_code == 403
        and "depot" not in header.text
        and mine.status_code == 200,
    )


# --------------------------------------------------------------------------- RabbitMQ: applications



async def test_a_qualified_id_in_a_body_is_refused_not_obeyed(world: World) -> None:
    """The tenant of a position is its credential's: an id naming another tenant (`<victim>:van-1`,
    as the pipeline names objects inside) is not an object id, so the position is dead-lettered
    with the reason and the victim's van-1 stays where it was."""
    before = await world.http.get(
        "/objects/within", params={"bbox": world.bbox()}, headers=world.a_admin.headers()
    )
    where_was = {o["id"]: (o["lon"], o["lat"]) for o in before.json()["objects"]}
    forged = [
        {"id": f"{world.a}:van-1", "lon": CENTER[0] + 3, "lat": CENTER[1], "ts": time.time()},
        {"id": "honest", "lon": CENTER[0] + 3, "lat": CENTER[1], "ts": time.time()},
    ]
    await publish_batch(world, f"{world.b}.gw", world.b, forged)

    async def honest_landed() -> bool:
        r = await world.http.get(
            "/objects/nearby",
            params={"lon": CENTER[0] + 3, "lat": CENTER[1], "radius_m": 100},
            headers=world.b_editor.headers(),
        )
        return r.status_code == 200 and any(o["id"] == "honest" for o in r.json()["objects"])

    await until(honest_landed, "the batch's valid position in the attacker's tenant")
    after = await world.http.get(
        "/objects/within", params={"bbox": world.bbox()}, headers=world.a_admin.headers()
    )
    now_at = {o["id"]: (o["lon"], o["lat"]) for o in after.json()["objects"]}
    letters = await _dead_letter_reasons(world)
    refused = any(f"{world.a}:van-1" in r and "not an object id" in r for r in letters)
    holds(
        "other tenant's gateway",
        "a batch under its own key naming <victim>:van-1 in the body",
        f"dead-lettered with the reason: {refused}; the victim's van-1 unmoved: "
        f"{now_at.get('van-1') == where_was.get('van-1')}",
        "the batch's other position, its own: stored",
        refused and now_at.get("van-1") == where_was.get("van-1"),
    )


async def _dead_letter_reasons(world: World) -> list[str]:
    """The reasons of gf-ingress's dead letters now (peeked through the management API, requeued)."""
    url = world.stack["management"]["url"] + f"api/queues/{t.INGRESS_VHOST}/{t.DEAD_LETTER_QUEUE}/get"
    body = {"count": 10_000, "ackmode": "ack_requeue_true", "encoding": "auto", "truncate": 2000}

    async def fetch() -> list[str]:
        async with httpx.AsyncClient(timeout=DEADLINE) as http:
            r = await http.post(url, json=body, auth=(t.ADMIN_USER, world.stack["mqtt"]["password"]))
        return [
            str((m.get("properties") or {}).get("headers", {}).get(t.REASON_HEADER, "")) for m in r.json()
        ]

    async def found() -> list[str]:
        got = await fetch()
        return got if any(f"{world.a}:van-1" in r for r in got) else []

    return list(await until(found, "the forged position's dead letter"))



async def test_cross_tenant_presence_is_opt_in_on_both_sides_and_counts_only(world: World) -> None:
    """The venue case: the attacker's tenant plays the venue (a fence counting another tenant's
    objects), the victim the app whose users' objects are counted. Without the victim's share
    the fence is refused; with it, the venue reads how many are inside, never who; a share
    withdrawn takes the victim off the fence, and its objects leave."""
    hive = {**depot("hive", half=0.01), "properties": {"name": "hive", "counts_from": [world.a]}}
    unshared = await world.http.post("/fences", json=hive, headers=world.b_editor.headers())
    shared = await world.http.put(f"/tenants/{world.a}/shares/{world.b}", headers=world.a_admin.headers())
    hijack = await world.http.put(f"/tenants/{world.a}/shares/{world.b}", headers=world.b_editor.headers())
    made = await world.http.post("/fences", json=hive, headers=world.b_editor.headers())
    assert made.status_code == 201, made.text
    await publish_batch(world, f"{world.a}.gw", world.a, vans_at(time.time()))

    async def counted() -> dict[str, Any] | None:
        r = await world.http.get("/fences/hive/objects", headers=world.b_editor.headers())
        return r.json() if r.status_code == 200 and r.json().get("shared_inside", 0) >= len(VANS) else None

    inside = await until(counted, "the victim's vans counted in the venue's fence")
    events = await world.http.get("/fences/hive/events", headers=world.b_editor.headers())
    withdrawn = await world.http.delete(
        f"/tenants/{world.a}/shares/{world.b}", headers=world.a_admin.headers()
    )

    async def gone() -> dict[str, Any] | None:
        r = await world.http.get("/fences/hive/objects", headers=world.b_editor.headers())
        return r.json() if r.status_code == 200 and r.json().get("shared_inside") == 0 else None

    after = await until(gone, "the victim's vans gone from the venue's fence once the share is withdrawn")
    fence = await world.http.get("/fences/hive", headers=world.b_editor.headers())
    leaks = revealed(world, str(inside) + events.text + str(after), named=())
    leaks = [x for x in leaks if x != world.a]  # the venue named the victim's tenant itself
    holds(
        "other tenant's editor (a venue)",
        "a fence with counts_from: [<victim>]; its occupants and events once the victim shared",
        f"unshared {unshared.status_code}; shared: {len(inside['objects'])} names, "
        f"{inside['shared_inside']} counted, {len(events.json()['events'])} events; "
        f"leaks {leaks or 'nothing'}; "
        f"a share by the venue itself {hijack.status_code}",
        f"the victim's admin shared ({shared.status_code}) then withdrew ({withdrawn.status_code}): "
        f"counts_from {fence.json()['properties'].get('counts_from', [])}, {after['shared_inside']} counted",
        unshared.status_code == 422
        and shared.status_code == 204
        and hijack.status_code == 404
        # the venue's own objects around (the other rows park some there) are its to name; the
        # victim's are counted, never named: none of its vans but the one name the venue also uses
        and {o["object_id"] for o in inside["objects"]}.isdisjoint({"van-2", "van-3"})
        and inside["shared_inside"] >= len(VANS)
        and all(e["object_id"] not in ("van-2", "van-3") for e in events.json()["events"])
        and not leaks
        and withdrawn.status_code == 200
        and not fence.json()["properties"].get("counts_from"),
    )


