"""The attack table's rows against RabbitMQ (AMQP and MQTT) and the hosts' listeners (issue
36): another tenant's application, device and gateway, and an outsider on the network. Each row
holds when the attack is refused, reveals nothing of the victim's, and the legitimate request
beside it still works."""


from __future__ import annotations

import time

import aio_pika
import httpx
import orjson
import pytest

from deploy import exposure
from exchanges import topology as t
from tests.security.attacks import holds, refused, revealed
from tests.security.conftest import (
    CENTER,
    DEADLINE,
    World,
    publish_batch,
    until,
)
from tests.security.mqtt import Mqtt


@pytest.mark.parametrize(
    ("exchange", "key"),
    [
        (t.EVENTS_EXCHANGE, "#"),
        (t.EVENTS_EXCHANGE, "fence-events.{a}.#"),
        (t.EVENTS_EXCHANGE, "fence-events.*.depot.*.*"),
        (t.EVENTS_EXCHANGE, "roam-events.{a}.#"),
        (t.TENANT_BATCHES_EXCHANGE, "{a}"),
        (t.TENANT_BATCHES_EXCHANGE, "#"),
        (t.EVENT_BATCHES_EXCHANGE, ""),
    ],
)
async def test_an_application_binds_its_own_tenants_events_only(
    world: World, exchange: str, key: str
) -> None:
    app = f"{world.b}.app"
    key = key.format(a=world.a)
    async with await aio_pika.connect(world.amqp(app, t.FENCES_VHOST), timeout=DEADLINE) as conn:
        ch = await conn.channel()
        q = await ch.declare_queue(f"{t.app_queue_prefix(app)}listen", exclusive=True)
        answer = await refused(q.bind(exchange, key))
    async with await aio_pika.connect(world.amqp(app, t.FENCES_VHOST), timeout=DEADLINE) as conn:
        ch = await conn.channel()
        q = await ch.declare_queue(f"{t.app_queue_prefix(app)}own", exclusive=True)
        own_key = f"{t.EVENTS_TOPIC_PREFIX}.{world.b}.#" if exchange != t.TENANT_BATCHES_EXCHANGE else world.b
        own = await refused(
            q.bind(
                exchange if exchange != t.EVENT_BATCHES_EXCHANGE else t.TENANT_BATCHES_EXCHANGE,
                own_key if exchange != t.EVENT_BATCHES_EXCHANGE else world.b,
            )
        )
    holds(
        "other tenant's application",
        f"bind {exchange} {key!r}",
        answer,
        f"its own tenant's key: {own}",
        answer.startswith("refused") and own == "accepted",
    )


async def test_an_application_reads_no_other_applications_queue(world: World) -> None:
    victim_q = f"{t.app_queue_prefix(f'{world.a}.app')}inbox"
    async with await aio_pika.connect(world.amqp(f"{world.a}.app", t.FENCES_VHOST), timeout=DEADLINE) as conn:
        ch = await conn.channel()
        q = await ch.declare_queue(victim_q, durable=True)
        await q.bind(t.EVENTS_EXCHANGE, f"{t.EVENTS_TOPIC_PREFIX}.{world.a}.#")
        try:
            async with await aio_pika.connect(
                world.amqp(f"{world.b}.app", t.FENCES_VHOST), timeout=DEADLINE
            ) as bconn:
                get = await refused(_basic_get(bconn, victim_q))
            async with await aio_pika.connect(
                world.amqp(f"{world.b}.app", t.FENCES_VHOST), timeout=DEADLINE
            ) as bconn:
                declare = await refused(_declare(bconn, f"{t.app_queue_prefix(f'{world.a}.app')}mine"))
            own = await refused(q.get(fail=False))
        finally:
            await q.delete(if_unused=False, if_empty=False)
    holds(
        "other tenant's application",
        "basic.get from the victim's app queue; declare a queue in its name",
        f"{get}, {declare}",
        f"the victim's app reads its queue: {own}",
        get.startswith("refused") and declare.startswith("refused") and own == "accepted",
    )


async def _basic_get(conn: aio_pika.abc.AbstractConnection, queue: str) -> None:
    ch = await conn.channel()
    q = await ch.get_queue(queue, ensure=False)
    await q.get(fail=False)


async def _declare(conn: aio_pika.abc.AbstractConnection, queue: str) -> None:
    ch = await conn.channel()
    await ch.declare_queue(queue, exclusive=True)


async def test_an_application_cannot_reach_the_pipelines_control(world: World) -> None:
    async with await aio_pika.connect(world.amqp(f"{world.b}.app", t.FENCES_VHOST), timeout=DEADLINE) as conn:
        ch = await conn.channel(publisher_confirms=True)
        x = await ch.get_exchange(t.FENCE_CONTROL_EXCHANGE, ensure=False)
        control = await refused(
            x.publish(aio_pika.Message(b'{"inspect": {}}'), routing_key="w0", timeout=DEADLINE)
        )
    region = await refused(
        aio_pika.connect(world.amqp(f"{world.b}.app", t.region_vhost("a")), timeout=DEADLINE)
    )
    async with await aio_pika.connect(world.amqp(f"{world.b}.app", t.FENCES_VHOST), timeout=DEADLINE) as conn:
        ch = await conn.channel(publisher_confirms=True)
        x = await ch.get_exchange(t.API_EXCHANGE, ensure=False)
        api = await refused(x.publish(aio_pika.Message(b"{}"), routing_key="", timeout=DEADLINE))
    holds(
        "other tenant's application",
        "publish to x-fence.control (inspect), connect to a region's vhost",
        f"{control}, {region}",
        f"a request to the fence API: {api}",
        control.startswith("refused") and region.startswith("refused") and api == "accepted",
    )


async def test_the_amqp_api_keeps_a_caller_in_its_tenant(world: World) -> None:
    from geofence_client.amqp import FenceClient

    url = world.amqp(f"{world.b}.app", t.FENCES_VHOST)
    async with FenceClient(url, world.b_editor.token) as client:
        theirs = await client.call("get", fence_id="depot", tenant=world.a)
        ours = await client.call("list")
    holds(
        "other tenant's application",
        "AMQP fence API: get the victim's depot, naming its tenant",
        f"{theirs.status}: {str(theirs.error)[:40]}",
        f"its own list: {ours.status}",
        theirs.status == 403 and not revealed(world, str(theirs.result)) and ours.status == 200,
    )


async def test_tenant_credentials_cannot_use_the_management_api(world: World) -> None:
    url = world.stack["management"]["url"] + "api/queues"
    async with httpx.AsyncClient(timeout=DEADLINE) as http:
        answers = [
            (await http.get(url, auth=(user, world.secrets[user]))).status_code
            for user in (f"{world.b}.app", f"{world.b}.gw", f"{world.b}.van-1")
        ]
    holds(
        "other tenant's credentials",
        "GET the management API's queue list (queue names, device ids)",
        f"{answers}",
        "only the administrator has a management tag",
        all(a == 401 for a in answers),
    )


# --------------------------------------------------------------------------- devices and gateways


async def test_a_device_publishes_under_its_own_tenant_only(world: World) -> None:
    dev = f"{world.b}.van-1"
    theirs = Mqtt(world.stack, dev, world.secrets[dev])
    try:
        answer = theirs.publish(
            f"positions/{world.a}/van-1",
            orjson.dumps({"lon": CENTER[0] + 2, "lat": CENTER[1], "ts": time.time()}),
        )
    finally:
        theirs.close()
    mine = Mqtt(world.stack, dev, world.secrets[dev])
    try:
        own = mine.publish(
            f"positions/{world.b}/van-1",
            orjson.dumps({"lon": CENTER[0] + 2, "lat": CENTER[1] + 0.5, "ts": time.time()}),
        )
    finally:
        mine.close()

    async def landed() -> bool:
        r = await world.http.get(
            "/objects/nearby",
            params={"lon": CENTER[0] + 2, "lat": CENTER[1] + 0.5, "radius_m": 100},
            headers=world.b_editor.headers(),
        )
        return r.status_code == 200 and any(o["id"] == "van-1" for o in r.json()["objects"])

    await until(landed, "the attacker's own position in its own tenant")
    victim = await world.http.get(
        "/objects/nearby",
        params={"lon": CENTER[0] + 2, "lat": CENTER[1], "radius_m": 1000},
        headers=world.a_admin.headers(),
    )
    holds(
        "other tenant's device",
        "MQTT publish positions/<victim>/van-1",
        f"{answer} (the broker closed the connection: no PUBACK)",
        f"positions/<own>/van-1: {own}, stored as its own",
        answer != "puback" and own == "puback" and victim.json()["objects"] == [],
    )


async def test_a_device_reads_no_other_tenants_events(world: World) -> None:
    dev = f"{world.b}.van-1"
    verdicts = []
    for topic in (f"fence-events/{world.a}/#", f"fence-events/{world.a}/+/+/van-1", "fence-events/#", "#"):
        c = Mqtt(world.stack, dev, world.secrets[dev])
        try:
            verdicts.append(c.subscribe(topic))
        finally:
            c.close()
    c = Mqtt(world.stack, dev, world.secrets[dev])
    try:
        own = c.subscribe(f"fence-events/{world.b}/+/+/van-1")
    finally:
        c.close()
    holds(
        "other tenant's device",
        "MQTT subscribe fence-events/<victim>/#, .../van-1, fence-events/#, #",
        ", ".join(verdicts),
        f"its own events: {own}",
        all(v != "granted" for v in verdicts) and own == "granted",
    )


async def test_a_gateway_publishes_under_its_own_tenant_only(world: World) -> None:
    body = [{"id": "van-9", "lon": CENTER[0], "lat": CENTER[1], "ts": time.time()}]
    answer = await refused(publish_batch(world, f"{world.b}.gw", world.a, body))
    own = await refused(publish_batch(world, f"{world.b}.gw", world.b, body))
    mqtt_answer = "n/a"
    c = Mqtt(world.stack, f"{world.b}.gw", world.secrets[f"{world.b}.gw"], client_id=f"{world.b}.gw:1")
    try:
        mqtt_answer = c.publish(
            f"positions/{world.a}/van-9",
            orjson.dumps({"lon": CENTER[0], "lat": CENTER[1], "ts": time.time()}),
        )
    finally:
        c.close()
    holds(
        "other tenant's gateway",
        "AMQP batch on ingress.gateway under the victim's key; MQTT positions/<victim>/van-9",
        f"{answer}; {mqtt_answer}",
        f"under its own key: {own}",
        answer.startswith("refused") and mqtt_answer != "puback" and own == "accepted",
    )



def _listening(port: int) -> list[str]:
    """The addresses a TCP port listens on here (deploy/exposure.py)."""
    return [x.address for x in exposure.listeners() if x.port == port]


async def test_the_metrics_listen_on_the_loopback_address_only(world: World) -> None:
    """Every process's /metrics (queue names, counts per role: the operators') is bound to
    127.0.0.1, whatever address the API is served on."""
    ports = {name: int(url.rsplit(":", 1)[1].split("/")[0]) for name, url in world.stack["metrics"].items()}
    bound = {name: _listening(port) for name, port in ports.items()}
    async with httpx.AsyncClient(timeout=DEADLINE) as http:
        local = [(await http.get(url)).status_code for url in world.stack["metrics"].values()]
    holds(
        "outsider (another host)",
        "GET http://<this host's address>:<port>/metrics of every process",
        f"listening on {sorted({a for addrs in bound.values() for a in addrs})} only",
        f"on the host itself: {sorted(set(local))}",
        all(addrs and set(addrs) <= {"127.0.0.1"} for addrs in bound.values()) and set(local) == {200},
    )

