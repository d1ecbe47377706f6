"""10,000 fuzzed inputs against the live stack (issue 5, "bad input gets a clear error and
loses nothing"): what tests/unit/test_fuzz_decoders.py checks on the decoders, here through
RabbitMQ, the sidecars, the fence API and PostgreSQL.

The inputs come from tests/faults/fuzz_inputs.py with one fixed seed (the same inputs every
run; the run's ids start with a fresh marker):

- MQTT: payloads published QoS 1 by a registered device of the run's tenant on its own topic
  `positions/<tenant>/<id>` (a device may publish nowhere else, so the ids and topics are fuzzed
  over AMQP); and, as the administrator, on the device's topic of the old contract
  `positions/<id>` (no device may publish there any more: dead-lettered, with the reason);
- AMQP amq.topic (gf-ingress): payloads under fuzzed routing keys, mostly
  `positions.<tenant>.<id>`, some of the old contract `positions.<id>`, mandatory (a key no
  binding takes comes back to the publisher: returned, not lost);
- AMQP gateway batches to `ingress.gateway` by the tenant's gateway user under its tenant's
  key, JSON or msgpack (content types fuzzed too); as the administrator, batches under fuzzed
  keys there (a word that is no tenant: dead-lettered; more than one word: returned), and
  batches to the retired fanout `ingress.batches` (the old contract: every one dead-lettered);
- the HTTP fence API: GeoJSON Features broken in one way each, raw bytes, fuzzed paths;
- the AMQP fence API (`fence.api`, direct reply-to): fuzzed requests.

The run is the tenant `faults-fuzz`'s (tests/faults/tenants.py): its device, its gateway, and
the fence API's caller a member of it.

The pure decoders (ingress/positions.py) predict, for each position input, whether it must be
dead-lettered (and, where the contract fixes it whatever the time, with which reason: a
routing key of the old contract or a word that is no tenant, a batch of the retired fanout); a
request of the AMQP API is dead-lettered when it is not a JSON object naming a known op. Every
AMQP message carries the run marker in a header (the sidecars copy the original headers into
the dead letter); MQTT ones are known by their routing key (the device's topic, new or old).
Private queues bound to the `dead-letters` exchanges of gf-ingress and gf-fences see every
dead letter; a sentinel (a malformed message) published last on each stream marks the end:
once the sentinels are dead-lettered, everything published before them on their stream has
been handled (each input queue is handled in order). Then: exactly the predicted dead
letters, each with a reason (the predicted one where there is one), nothing returned but what
no binding takes; every HTTP answer a 2xx or a 4xx with a reason (never a 5xx, the connection
never refused); every AMQP request answered below 500; every sidecar alive; a valid position
still gives its ENTER event. At the end the run's messages are taken out of the shared
`dead-letters` queues (others' are left there), so reruns are independent.

The inputs include those of the bugs this fuzzing found (the unit file names each, fixed).

The run's inputs and predictions: tests/faults/fuzz_run_inputs.py; its dead letters:
tests/faults/fuzz_dead_letters.py; sending the inputs: tests/faults/fuzz_senders.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import quote

import aio_pika
import asyncpg
import httpx
import orjson
import pytest
from aio_pika.abc import AbstractQueue

from deploy import firebase_emulator as fe
from deploy import sidecars
from deploy.settings import ConnectionSettings, Settings, load_secrets
from exchanges import topology as t
from exchanges.tenancy import qualify
from fence import store, tenants
from fence.manager import FenceManager
from tests.faults import report
from tests.faults import tenants as ft
from tests.faults.fuzz_dead_letters import DEADLINE_S, DeadLetters, Marks, Seen, drain_own, sentinel
from tests.faults.fuzz_run_inputs import COUNTS, RETIRED_REASON, Inputs, make_inputs
from tests.faults.fuzz_senders import (
    HttpResults,
    RpcResults,
    http_requests,
    publish_amqp,
    publish_mqtt,
    rpc_requests,
)
from tests.integration.clients import Device, MqttDevice, api, geofence, q

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

VADUZ = (9.5209, 47.1410)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
async def fuzz_tenant(stack: ConnectionSettings) -> str:
    """The run's tenant (created once, kept: tests/faults/tenants.py)."""
    await ft.ensure_tenants(stack["postgres"]["dsn"], [ft.FUZZ_TENANT])
    return ft.FUZZ_TENANT


@pytest.fixture
def fuzz_device(stack: ConnectionSettings, fuzz_tenant: str) -> Iterator[Device]:
    """A device user of the run's tenant, removed afterwards."""
    made = Device(f"fuzz-{uuid.uuid4().hex[:10]}", uuid.uuid4().hex, fuzz_tenant)
    done = geofence("device", "add", made.object_id, "--tenant", fuzz_tenant, "--password-stdin",
                    stdin=made.password + "\n")
    assert done.returncode == 0, done.stderr
    try:
        yield made
    finally:
        if api(stack, f"api/users/{q(made.user)}") is not None:
            geofence("device", "remove", made.object_id, "--tenant", fuzz_tenant)


GATEWAY_PREFIX = "fuzz-"  # the run's gateway's name


@pytest.fixture
def fuzz_gateway(stack: ConnectionSettings, fuzz_tenant: str) -> Iterator[ft.TenantGateway]:
    """A gateway user of the run's tenant, removed afterwards (and any an earlier run left)."""
    settings = Settings.from_env()
    pw = load_secrets(settings)
    ft.remove_leftover_gateways(settings, pw, [(fuzz_tenant, GATEWAY_PREFIX)])
    made = ft.add_gateway(settings, pw, fuzz_tenant, f"{GATEWAY_PREFIX}{uuid.uuid4().hex[:10]}")
    try:
        yield made
    finally:
        ft.remove_gateway(settings, pw, made)


@pytest.fixture
async def token(stack: ConnectionSettings, fuzz_tenant: str) -> AsyncIterator[str]:
    """A Firebase ID token of a fresh user (the Auth emulator of the stack), an editor of the
    run's tenant (its only one: the fence API places it there) until the run ends."""
    host, port = stack["firebase"]["auth_emulator_host"].rsplit(":", 1)
    if not fe.running(host, int(port)):
        pytest.fail("the Firebase Auth emulator is not running: `geofence up` starts it", pytrace=False)
    email = f"fuzz-{uuid.uuid4().hex[:12]}@example.org"
    uid, tok = fe.sign_up(host, int(port), stack["firebase"]["project"], email, uuid.uuid4().hex)
    conn = await asyncpg.connect(stack["postgres"]["dsn"])
    try:
        await tenants.put_member(conn, fuzz_tenant, uid, "editor")
        yield tok
    finally:
        with contextlib.suppress(tenants.TenantError, asyncpg.PostgresError):
            await tenants.remove_member(conn, fuzz_tenant, uid, keep_admin=False)
        await conn.close()


# --------------------------------------------------------------------------- the stack


@contextlib.asynccontextmanager
async def events_of(stack: ConnectionSettings, fence_id: str) -> AsyncIterator[AbstractQueue]:
    async with await aio_pika.connect(stack["amqp"][t.FENCES_VHOST], timeout=30) as conn:
        ch = await conn.channel()
        queue = await ch.declare_queue("", exclusive=True)
        await queue.bind(t.EVENTS_EXCHANGE, t.event_binding_key(fence_id))
        yield queue


async def consumed(stack: ConnectionSettings, deadline: float = 120.0) -> None:
    """Every input queue the run feeds has its consumer (the stack may be coming back from a
    restart, e.g. by another fault test)."""
    queues = [*((t.INGRESS_VHOST, q) for q in (*t.PARTITION_QUEUES, t.POSITIONS_QUEUE, t.BATCHES_QUEUE)),
              (t.FENCES_VHOST, t.API_QUEUE)]
    end = time.monotonic() + deadline
    for vhost, name in queues:
        while True:
            async with await aio_pika.connect(stack["amqp"][vhost], timeout=30) as conn:
                ch = await conn.channel()
                declared = await ch.declare_queue(name, passive=True)
                if declared.declaration_result.consumer_count:
                    break
            if time.monotonic() > end:
                raise AssertionError(f"{vhost} {name} has no consumer: is the stack up (`geofence up`)?")
            await asyncio.sleep(0.5)


def leftover(tenant: str) -> str:
    """Fence ids of the runs, qualified (fz / fh / fr + the run's marker)."""
    return rf"^{tenant}:f[zhr][0-9a-f]{{8}}"


async def remove_leftovers(stack: ConnectionSettings, settings: Settings, tenant: str) -> int:
    """Fences an earlier run made and could not delete (it stopped half-way): removed."""
    conn = await asyncpg.connect(stack["postgres"]["dsn"])
    try:
        ids = [r["id"] for r in await conn.fetch(
            "SELECT id FROM fence WHERE deleted_at IS NULL AND id ~ $1", leftover(tenant))]
    finally:
        await conn.close()
    if ids:
        url = stack["users"][t.MANAGER_USER][t.region_vhost(settings.regions[0])]
        async with FenceManager(url, stack["postgres"]["dsn"], settings.regions, settings.workers) as manager:
            for fid in ids:
                with contextlib.suppress(store.UnknownFence):
                    await manager.remove(fid)
    return len(ids)


async def until(check: Any, what: str, deadline: float) -> None:
    end = time.monotonic() + deadline
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline:g}s waiting for {what}")
        await asyncio.sleep(0.1)


# --------------------------------------------------------------------------- the test


async def test_ten_thousand_fuzzed_inputs(stack: ConnectionSettings, fuzz_tenant: str, fuzz_device: Device,
                                          fuzz_gateway: ft.TenantGateway, token: str) -> None:
    run = uuid.uuid4().hex[:8]
    settings = Settings.from_env()
    dead = [n for n, ok in sidecars.running(settings).items() if not ok]
    assert not dead, f"sidecars not running before the run: {dead} (`geofence up` starts them)"
    tenant, device_id = fuzz_tenant, fuzz_device.object_id
    marks = Marks(run, device_id, tenant)
    inputs = make_inputs(run, token, device_id, tenant)
    assert inputs.total == sum(COUNTS.values()) >= 10_000
    await consumed(stack)
    await remove_leftovers(stack, settings, tenant)
    seen_ingress, seen_fences, seen_regions = Seen(), Seen(), Seen()
    http, rpc = HttpResults(), RpcResults()
    fences_made: list[str] = []
    ok = False
    try:
        async with contextlib.AsyncExitStack() as watches:
            for vhost, seen in ((t.INGRESS_VHOST, seen_ingress), (t.FENCES_VHOST, seen_fences),
                                *((t.region_vhost(r), seen_regions) for r in settings.regions)):
                await watches.enter_async_context(DeadLetters(stack["amqp"][vhost], marks, seen))
            device = MqttDevice(stack, fuzz_device)
            admin = MqttDevice(stack, fuzz_device, admin=True)
            try:
                await asyncio.to_thread(publish_mqtt, device, fuzz_device.topic, inputs.mqtt)
                # the device's topic before tenants: only the administrator may still publish there
                await asyncio.to_thread(publish_mqtt, admin, f"{t.POSITIONS_TOPIC_PREFIX}/{device_id}",
                                        inputs.mqtt_old)
                returned: Counter[str] = Counter()
                async with await aio_pika.connect(stack["amqp"][t.INGRESS_VHOST], timeout=30) as conn:
                    ch = await conn.channel(publisher_confirms=True, on_return_raises=True)
                    topic = [(k, b, None) for k, b in inputs.topic]
                    returned["topic"] = await publish_amqp(ch, t.MQTT_TOPIC_EXCHANGE, topic, run, "topic")
                    returned["gateway-key"] = await publish_amqp(ch, t.GATEWAY_EXCHANGE, inputs.gateway_key,
                                                                 run, "gateway-key")
                    returned["retired"] = await publish_amqp(ch, t.RETIRED_BATCHES_EXCHANGE, inputs.retired,
                                                             run, "retired")
                    async with await aio_pika.connect(fuzz_gateway.amqp_url, timeout=30) as gw_conn:
                        gw = await gw_conn.channel(publisher_confirms=True, on_return_raises=True)
                        batches = [(tenant, b, ct) for b, ct in inputs.gateway]
                        returned["gateway"] = await publish_amqp(gw, t.GATEWAY_EXCHANGE, batches, run,
                                                                 "gateway")
                        # sentinels: malformed, published after everything of their stream (and of
                        # the streams sharing its queue) was confirmed
                        await publish_amqp(gw, t.GATEWAY_EXCHANGE, [(tenant, sentinel(run, "gateway"), None)],
                                           run, "sentinel-gateway")
                    await publish_amqp(ch, t.MQTT_TOPIC_EXCHANGE,
                                       [(f"positions.{tenant}.{device_id}", sentinel(run, "topic"), None)],
                                       run, "sentinel-topic")
                await asyncio.to_thread(publish_mqtt, device, fuzz_device.topic, [sentinel(run, "mqtt")])
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(http_requests(stack["api"] or "", token, inputs.http, http))
                    tg.create_task(rpc_requests(stack["amqp"][t.FENCES_VHOST], run, inputs.rpc, rpc))

                ingress_sentinels = {"sentinel-mqtt", "sentinel-topic", "sentinel-gateway"}
                await until(lambda: ingress_sentinels <= seen_ingress.sentinels
                            and "sentinel-rpc" in seen_fences.sentinels, "the sentinels in dead-letters",
                            DEADLINE_S)

                # what the contract predicts, exactly
                assert +returned == +inputs.unroutable, (dict(returned), dict(inputs.unroutable))
                got = seen_ingress.by_stream + seen_fences.by_stream + seen_regions.by_stream
                want = +inputs.dead
                downstream = seen_regions.downstream + seen_fences.downstream + seen_ingress.downstream
                assert got == want, \
                    f"dead letters per stream {dict(got)}, predicted {dict(want)}; downstream: " + \
                    "\n".join(downstream)
                assert not seen_ingress.no_reason and not seen_fences.no_reason, \
                    (seen_ingress.no_reason + seen_fences.no_reason)[:5]
                wrong = wrong_reasons(inputs, seen_ingress)
                assert not wrong, f"{len(wrong)} dead letters without the reason the contract gives: " + \
                    "\n".join(wrong[:8])
                assert not http.problems, \
                    f"{len(http.problems)} HTTP answers wrong: " + "\n".join(http.problems[:10])
                bad_rpc = {i: a for i, a in rpc.replies.items() if not isinstance(a.get("status"), int)
                           or a["status"] >= 500 or (a["status"] >= 400 and not a.get("error"))}
                assert not bad_rpc, f"{len(bad_rpc)} AMQP API answers wrong: " + "; ".join(
                    f"{inputs.rpc[int(i)][:120]!r} -> {a}" for i, a in list(bad_rpc.items())[:8])

                # nothing died, the API still serves, a valid position still gives its event
                dead = [n for n, alive in sidecars.running(settings).items() if not alive]
                assert not dead, f"sidecars dead after the fuzzed inputs: {dead}"
                async with httpx.AsyncClient(base_url=stack["api"] or "", timeout=30) as client:
                    assert (await client.get("/health")).status_code == 200
                fid = await still_routes(stack, settings, token, run, fuzz_gateway)
                fences_made.append(fid)
            finally:
                device.close()
                admin.close()
        ok = True
    finally:
        with contextlib.suppress(Exception):
            await delete_fences(stack, token, http.created + rpc.created + fences_made)
        drained = 0
        for vhost in settings.topology.vhosts:
            with contextlib.suppress(Exception):
                drained += await drain_own(stack["amqp"][vhost], marks)
        dlq = sum(sum(s.by_stream.values()) for s in (seen_ingress, seen_fences, seen_regions))
        report.record(report.Row(fault="10,000 fuzzed inputs", injected=inputs.total, updates=inputs.updates,
                                 expected=0, received=0, duplicates=0, dlq=dlq, ok=ok))
    # the shared queues held the same dead letters (and the 4 sentinels): all taken out again
    assert drained == dlq + 4, \
        f"{drained} of the run's messages taken out of dead-letters, {dlq + 4} expected"


def wrong_reasons(inputs: Inputs, seen: Seen) -> list[str]:
    """The dead letters whose reason is not the one the contract gives (where it fixes one):
    each AMQP input by its number, the MQTT ones of the old topic as a whole (MQTT carries no
    headers), every batch of the retired fanout by the start of its reason."""
    wrong = []
    for (stream, i), reason in sorted(inputs.reasons.items()):
        if stream == "mqtt-old":
            continue
        found = seen.reasons.get((stream, i))
        if found != reason:
            wrong.append(f"{stream} #{i}: {found!r}, the contract says {reason!r}")
    old = Counter(r for (stream, _), r in inputs.reasons.items() if stream == "mqtt-old")
    if seen.reasons_of.get("mqtt-old", Counter()) != old:
        wrong.append(f"mqtt-old: {dict(seen.reasons_of.get('mqtt-old', {}))}, the contract says {dict(old)}")
    retired = seen.reasons_of.get("retired", Counter())
    wrong += [f"retired: {n} x {r!r}, the contract says {RETIRED_REASON!r}..." for r, n in retired.items()
              if not r.startswith(RETIRED_REASON)]
    return wrong


async def still_routes(stack: ConnectionSettings, settings: Settings, token: str, run: str,
                       gateway: ft.TenantGateway) -> str:
    """A fence made over HTTP, applied by every x-geo, then a position inside it of an object
    new to the pipeline (the fuzzed device's own positions reach 2100: x-fence takes an object's
    positions in time order, so a position of now from it is rightly too old), sent by the
    tenant's gateway: its ENTER event comes out of fence.events, with the tenant."""
    fid, object_id = f"fz{run}-check", f"fz{run}-check"
    lon, lat = VADUZ
    d = 0.002
    feature = {"type": "Feature", "id": fid, "properties": {"name": "fuzz check", "timeout_s": 600},
               "geometry": {"type": "Polygon", "coordinates": [[[lon - d, lat - d], [lon + d, lat - d],
                                                                 [lon + d, lat + d], [lon - d, lat + d],
                                                                 [lon - d, lat - d]]]}}
    async with httpx.AsyncClient(base_url=stack["api"] or "", timeout=30) as client:
        r = await client.post("/fences", json=feature, headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 201, r.text
    manager_url = stack["users"][t.MANAGER_USER][t.region_vhost(settings.regions[0])]
    dsn = stack["postgres"]["dsn"]
    async with FenceManager(manager_url, dsn, settings.regions, settings.workers) as manager:
        await manager.applied()  # every x-geo has the fence: a position from now on is routed by it
    async with events_of(stack, qualify(gateway.tenant, fid)) as queue:
        ts = time.time()
        async with await aio_pika.connect(gateway.amqp_url, timeout=30) as conn:
            ch = await conn.channel(publisher_confirms=True, on_return_raises=True)
            ex = await ch.get_exchange(t.GATEWAY_EXCHANGE, ensure=False)
            body = orjson.dumps({"positions": [{"id": object_id, "lon": lon, "lat": lat, "ts": ts}]})
            await ex.publish(aio_pika.Message(body, content_type="application/json"), gateway.routing_key,
                             mandatory=True, timeout=30)
        async with queue.iterator(timeout=60) as it:
            async for m in it:
                await m.ack()
                e = orjson.loads(m.body)
                if e["object_id"] == object_id:
                    assert (e["event"], e["reason"], e["ts"], e.get("tenant")) == \
                        ("enter", "entered", ts, gateway.tenant), e
                    return fid
    raise AssertionError("no ENTER event for a valid position after the fuzzed inputs")


async def delete_fences(stack: ConnectionSettings, token: str, fence_ids: list[str]) -> None:
    async with httpx.AsyncClient(base_url=stack["api"] or "", timeout=30) as client:
        for fid in dict.fromkeys(fence_ids):
            await client.delete(f"/fences/{quote(fid, safe='')}",
                                headers={"Authorization": f"Bearer {token}"})
