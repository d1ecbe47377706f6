"""`geofence demo`: the live fleet demo the README's first command runs.

Real data ((c) OpenStreetMap contributors, ODbL 1.0), two tenants sharing the platform:
- `fleet` (a fleet company): the 11 municipalities of Liechtenstein are its fences, half of the
  moving objects are its vehicles;
- `venue-app` (the venue-occupancy app): points of interest as 150 m circles are its fences
  (the venues among them its hives, each with a simulated door sensor), the other half of the
  moving objects are its users' phones.
Every object drives round trips on the extract's road network (deploy/demo/traffic.py: fastest
paths, speed by road class, Gaussian GPS noise) and publishes its positions over MQTT in real
time (`positions/<tenant>/<object_id>`, QoS 1), through its tenant's gateway credential, which
may publish that tenant's positions only. The demo prints the ENTER / LEAVE events the
pipeline emits as they arrive (AMQP, exchange fence.events), a progress line, and a summary:
objects, updates/s, events by fence, latency from a position to its event (p50 / p99), whether
the events are exactly those shapely computes from the very positions published, tenant by
tenant (a fence sees its own tenant's objects only), and how many events crossed a tenant
(none may). The stack stays up afterwards.

Each run's vehicles have ids of their own (`d<run>-car-0001`...), so earlier runs' vehicles
(still inside fences until their timeout) never mix into this run's comparison; events of
fences that are not the demo's (other users' fences in the area) are left out of it too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import math
import re
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import asyncpg
import numpy as np
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from deploy import sidecars
from deploy.demo import venues
from deploy.demo.osm_extract import OSM_CREDIT, municipalities, points_of_interest, road_network
from deploy.demo.traffic import Fleet
from deploy.rabbitmq import devices
from deploy.settings import Settings, load_connection_settings, load_secrets
from exchanges import topology as t
from exchanges.login_guard import client_id_for
from exchanges.tenancy import qualify, tenant_of
from fence import reference, store, tenants
from fence.follow import circle
from fence.manager import FenceManager
from fence.spec import FenceSpec

OWNER = "demo"
FLEET, VENUES = "fleet", "venue-app"  # the demo's two tenants
TENANT_NAMES = {FLEET: "A fleet company (demo)", VENUES: "The venue-occupancy app (demo)"}
GATEWAY = "demo-gateway"  # each tenant's MQTT gateway user, made again each run (its password)
POI_RADIUS_M = 150.0
TIMEOUT_S = 120.0  # a vehicle silent this long leaves its fences (timeout)
BORDER_BAND_M = 25.0  # municipalities: 5 m of GPS noise at a border gives no ENTER / LEAVE pairs (hysteresis)
PUBLISHERS = 4  # MQTT connections the fleet's positions are spread over
DRAIN_S = 60.0  # after the last position: how long to wait for the last events
LAST_FRAMES_S = 30.0  # after the last position: the longest wait for a door report still due


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--vehicles", type=int, default=50, help="vehicles in the fleet (default 50)")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of driving (default 60)")
    parser.add_argument("--rate", type=float, default=1.0,
                        help="position reports per vehicle per second (default 1)")
    parser.add_argument("--pois", type=int, default=12, help="points of interest made 150 m fences")
    parser.add_argument("--noise", type=float, default=5.0, help="GPS noise, metres (sigma)")
    parser.add_argument("--seed", type=int, default=2013)
    parser.add_argument("--quiet", action="store_true", help="no live event lines")


def slug(name: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", name.lower().encode("ascii", "ignore").decode()).strip("-")
    return s[:40] or "x"


def demo_pois(pois: int) -> list[tuple[str, str, float, float, str]]:
    """(fence id poi-<name>, name, lon, lat, kind) of `pois` points of interest, spread over
    the list of named POIs."""
    found = points_of_interest()
    chosen: dict[str, tuple[str, str, float, float, str]] = {}
    if pois > 0 and found:
        step = max(1, len(found) // pois)
        for name, lon, lat, kind in found[::step]:
            fid = f"poi-{slug(name)}"
            if fid not in chosen and len(chosen) < pois:
                chosen[fid] = (fid, name, lon, lat, kind)
    return list(chosen.values())


def demo_fences(pois: int) -> list[Any]:
    """FenceSpecs: the fleet's municipalities (fleet:li-<name>) and the venue app's `pois`
    points of interest (venue-app:poi-<name>), their ids qualified by their tenant."""
    specs = [FenceSpec(fence_id=qualify(FLEET, f"li-{slug(name)}"), geometry=geom, name=name,
                       timeout_s=TIMEOUT_S, owner=OWNER, hysteresis_m=BORDER_BAND_M)
             for name, geom in municipalities().items()]
    for fid, name, lon, lat, kind in demo_pois(pois):
        specs.append(FenceSpec(fence_id=qualify(VENUES, fid), geometry=circle(lon, lat, POI_RADIUS_M),
                               name=f"{name} ({kind})", timeout_s=TIMEOUT_S, owner=OWNER))
    return specs


def object_tenant(i: int) -> str:
    """The tenant of the demo's i-th moving object: every other one is a phone of the venue app."""
    return FLEET if i % 2 == 0 else VENUES


async def ensure_tenants(pg: asyncpg.Connection) -> None:
    for tenant, name in TENANT_NAMES.items():
        with contextlib.suppress(tenants.TenantExists):
            await tenants.add_tenant(pg, tenant, name)


def gateway_logins(settings: Settings) -> dict[str, tuple[str, str]]:
    """Each tenant's MQTT gateway user for this run, made again (a new password, shown to
    nobody): {tenant: (user, password)}."""
    pw = load_secrets(settings)
    out = {}
    for tenant in TENANT_NAMES:
        user = devices.user_of(tenant, GATEWAY)
        with contextlib.suppress(devices.DeviceError):  # not there yet
            devices.remove_gateway(settings, pw, tenant, GATEWAY, lambda _: None)
        out[tenant] = (user, devices.add_gateway(settings, pw, tenant, GATEWAY, None, lambda _: None))
    return out


@dataclass
class Tally:
    """What the run saw, shared between the MQTT threads and the event loop."""

    sent: int = 0
    acked: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ack(self) -> None:
        with self.lock:
            self.acked += 1


class Publishers:
    """A few paho MQTT connections (vhost gf-ingress), QoS 1: as `login` (user, password), a
    tenant's gateway, else as the administrator. With a cluster of RabbitMQ nodes (`nodes` of
    the MQTT settings) the connections are spread over them, and one whose node goes away
    reconnects to the next (paho resends what was not acknowledged), as a device would."""

    def __init__(self, mqtt_cfg: dict[str, Any], run: str, n: int, tally: Tally,
                 login: tuple[str, str] | None = None) -> None:
        self.clients = []
        self.tally = tally
        # one per client, set by its first accepted CONNACK: a refused one (a gateway user made
        # again a moment ago, not yet read by the login guard) is retried by paho's loop, and
        # nothing is published before every client is in
        connected = [threading.Event() for _ in range(n)]
        user, password = login or (mqtt_cfg["username"].split(":", 1)[1], mqtt_cfg["password"])
        for k in range(n):
            c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id_for(user, f"demo-{run}-{k}"),
                            protocol=mqtt.MQTTv311)
            c.username_pw_set(f"{mqtt_cfg['ingress_vhost']}:{user}", password)
            c.max_inflight_messages_set(1000)
            c.reconnect_delay_set(1, 2)
            c.on_connect = functools.partial(_accepted, connected[k])
            c.on_publish = lambda cl, u, mid, reason, p: tally.ack()
            listed = mqtt_cfg.get("nodes") or [(mqtt_cfg["host"], mqtt_cfg["port"])]
            nodes = [(str(h), int(p)) for h, p in listed]
            if len(nodes) > 1:
                c.on_disconnect = functools.partial(_next_node, nodes)
            host, port = nodes[k % len(nodes)]
            c.connect(host, port, keepalive=30)
            c.loop_start()
            self.clients.append(c)
        deadline = time.monotonic() + 20
        for event in connected:
            if not event.wait(max(deadline - time.monotonic(), 0.0)):
                raise RuntimeError("MQTT connection not accepted within 20 s: is the stack up?")

    def publish(self, i: int, tenant: str, object_id: str, lon: float, lat: float, ts: float) -> None:
        body = json.dumps({"lon": lon, "lat": lat, "ts": ts})
        self.clients[i % len(self.clients)].publish(f"{t.POSITIONS_TOPIC_PREFIX}/{tenant}/{object_id}", body,
                                                    qos=1)
        self.tally.sent += 1

    def publish_raw(self, topic: str, payload: bytes) -> None:
        self.clients[0].publish(topic, payload, qos=1)
        self.tally.sent += 1

    def close(self) -> None:
        for c in self.clients:
            c.disconnect()
            c.loop_stop()


def _accepted(event: threading.Event, client: mqtt.Client, userdata: Any, flags: Any, reason: Any,
              *_: Any) -> None:
    """on_connect: the CONNACK accepted the login (a refusal is retried by paho's loop)."""
    if not reason.is_failure:
        event.set()


def _next_node(nodes: list[tuple[str, int]], client: mqtt.Client, *_: Any) -> None:
    """on_disconnect: paho's loop reconnects, to the node after the one that went away."""
    k = nodes.index((client.host, client.port)) if (client.host, client.port) in nodes else -1
    client.host, client.port = nodes[(k + 1) % len(nodes)]


class Screen:
    """Live lines above a progress line (rewritten in place on a terminal)."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.progress = ""
        self.last_plain = 0.0

    def line(self, text: str) -> None:
        if self.tty:
            sys.stdout.write("\r\033[K" + text + "\n" + self.progress)
        else:
            sys.stdout.write(text + "\n")
        sys.stdout.flush()

    def status(self, text: str) -> None:
        self.progress = text
        if self.tty:
            sys.stdout.write("\r\033[K" + text)
            sys.stdout.flush()
        elif time.monotonic() - self.last_plain >= 5:
            self.last_plain = time.monotonic()
            print(text, flush=True)

    def done(self) -> None:
        if self.tty:
            sys.stdout.write("\n")


def tenant_reference(specs: list[Any], ids: list[str], owner_of: list[str],
                     positions: list[tuple[int, float, float, float]]) -> list[reference.EventTuple]:
    """The events shapely computes, tenant by tenant: each tenant's objects against its own
    fences (a fence sees its tenant's objects only), as qualified names."""
    want: list[reference.EventTuple] = []
    for tenant in TENANT_NAMES:
        mine = [s for s in specs if tenant_of(s.fence_id) == tenant]
        rows = [p for p in positions if owner_of[p[0]] == tenant]
        if not mine or not rows:
            continue
        want += reference.reference_events(
            [s.fence_id for s in mine], [s.geometry for s in mine], [qualify(tenant, i) for i in ids],
            np.array([p[0] for p in rows], np.int64), np.array([p[2] for p in rows]),
            np.array([p[3] for p in rows]), np.array([p[1] for p in rows]), fences=mine)
    return sorted(want, key=lambda e: (e[3], e[2], e[1], e[0]))


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


async def run_demo(args: argparse.Namespace) -> int:
    if not 1 / TIMEOUT_S < args.rate <= 20 or args.vehicles < 1 or args.duration <= 0:
        print(f"geofence demo: --rate in ({1 / TIMEOUT_S:.3f}, 20], --vehicles >= 1, --duration > 0",
              file=sys.stderr)
        return 2
    settings = Settings.from_env()
    conn = load_connection_settings(settings)
    dead = [n for n, ok in sidecars.running(settings).items() if not ok]
    if dead:
        print(f"geofence demo: sidecar(s) {', '.join(dead)} not running: run `geofence up`", file=sys.stderr)
        return 2
    run = uuid.uuid4().hex[:6]
    print(f"Liechtenstein, {OSM_CREDIT}")

    specs = demo_fences(args.pois)
    names = {s.fence_id: s.name for s in specs}  # by qualified id
    amqp = conn["users"][t.MANAGER_USER][t.region_vhost(settings.regions[0])]
    async with FenceManager(amqp, conn["postgres"]["dsn"], settings.regions, settings.workers) as manager:
        async with manager.pool.acquire() as pg:  # the demo's fences are exactly this run's
            await ensure_tenants(pg)
            stale = [r.fence.fence_id for tenant in TENANT_NAMES
                     for r in await store.find_fences(pg, tenant, limit=100_000)
                     if r.fence.fence_id not in names and r.owner == OWNER]
        for fid in stale:
            await manager.remove(fid)
        ranges = 0
        for s in specs:
            ranges += (await manager.put(s)).ranges
        await manager.applied(timeout=60)
    logins = gateway_logins(settings)
    n_li = sum(1 for s in specs if tenant_of(s.fence_id) == FLEET)
    print(f"Tenants: {FLEET} ({TENANT_NAMES[FLEET]}: {n_li} municipalities as fences) and {VENUES} "
          f"({TENANT_NAMES[VENUES]}: {len(specs) - n_li} points of interest, {POI_RADIUS_M:g} m, as fences); "
          f"{ranges:,} Hilbert ranges bound in the x-geo regions {', '.join(settings.regions)}")

    network = road_network()
    fleet = Fleet(network, args.vehicles, args.seed, args.noise, departure_spread_s=0.0)
    fleet.true_positions(0.0)  # the first legs planned (~0.2 s) before the clock starts
    ids = [f"d{run}-{v}" if object_tenant(i) == FLEET else f"d{run}-phone-{i:04d}"
           for i, v in enumerate(fleet.ids)]
    owner_of = [object_tenant(i) for i in range(len(ids))]
    n_fleet = owner_of.count(FLEET)
    print(f"Moving: {n_fleet} vehicles of {FLEET} and {len(ids) - n_fleet} phones of {VENUES} (ids "
          f"d{run}-...) on {network.n_nodes:,} road nodes, reporting every {1 / args.rate:g} s over MQTT "
          f"for {args.duration:g} s (GPS noise {args.noise:g} m), each through its tenant's gateway user")
    print(f"Watch it live: {conn['api']}/map (the fleet moving, fences coloured by who is inside, "
          f"ENTER / LEAVE as they happen); {conn['api']}/ops (the pipeline's figures)\n", flush=True)

    screen = Screen()
    received: list[reference.EventTuple] = []
    latency_ms: list[float] = []
    by_fence: Counter[tuple[str, str]] = Counter()
    prefix = f"d{run}-"

    crossed: list[str] = []  # events pairing a fence with another tenant's object: none may come
    tenant_of_object = dict(zip(ids, owner_of, strict=True))

    async def on_event(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        async with message.process():
            e = json.loads(message.body)
            fence = qualify(str(e.get("tenant", "")), str(e.get("fence_id", "")))
            # this run's objects in the demo's fences (other tenants' fences may be around too)
            if not str(e.get("object_id", "")).startswith(prefix) or fence not in names:
                return
            if tenant_of_object.get(e["object_id"]) != e.get("tenant"):
                crossed.append(f"{e['event']} {fence} {e['object_id']}")
            now = time.time()
            received.append((e["event"], fence, qualify(e["tenant"], e["object_id"]), float(e["ts"]),
                             e["reason"]))
            latency_ms.append((now - float(e["ts"])) * 1e3)
            by_fence[(fence, e["event"])] += 1
            if not args.quiet:
                clock = time.strftime("%H:%M:%S", time.localtime(float(e["ts"])))
                verb = "ENTER" if e["event"] == "enter" else "LEAVE"
                stay = f"after {e['inside_s']:.0f} s" if e.get("inside_s") is not None else ""
                screen.line(f"{clock}  {verb}  {e['tenant']:<9} {e['object_id'][len(prefix):]:<10} "
                            f"{names.get(fence, fence)[:32]:<32} {stay:<8} {latency_ms[-1]:6.0f} ms")

    tally = Tally()
    sensor_tally = Tally()
    positions: list[tuple[int, float, float, float]] = []
    pg = await asyncpg.connect(conn["postgres"]["dsn"])
    venue_pois = [(qualify(VENUES, fid), name, lon, lat, kind)
                  for fid, name, lon, lat, kind in demo_pois(args.pois)]
    demo_venues = await venues.prepare(pg, venue_pois, OWNER, run, time.time() + 1.0, args.duration)
    print(f"Venues: {len(demo_venues.venues)} of the points of interest are hives (restaurants, bars, cafés, "
          f"shops) with a simulated door sensor each, {len(demo_venues.pending):,} frames over the run; "
          f"{venues.DEMO_USER} is told when one has {venues.BUSY} people or more\n")
    async with await aio_pika.connect(conn["amqp"][t.FENCES_VHOST], timeout=20) as amqp_conn:
        ch = await amqp_conn.channel()
        await ch.set_qos(prefetch_count=1000)
        q = await ch.declare_queue(f"demo-events-{run}", exclusive=True, auto_delete=True)
        await q.bind(t.EVENTS_EXCHANGE, "#")
        await q.consume(on_event)
        pubs = {tenant: Publishers(dict(conn["mqtt"]), run, min(PUBLISHERS, args.vehicles), tally, login)
                for tenant, login in logins.items()}
        sensor_pubs = Publishers(dict(conn["mqtt"]), f"{run}-sensors", 1, sensor_tally)
        try:
            started = time.time()
            period = 1 / args.rate
            k = 0
            while k * period < args.duration:
                due = started + k * period
                await asyncio.sleep(max(0.0, due - time.time()))  # real time: one report per period
                _, lon, lat = fleet.positions(time.time() - started)
                # a device stamps its report when it sends it: the simulation's own time (a new
                # leg planned) is not the pipeline's, nor part of the latency shown, and neither
                # is the time this one thread takes to send the devices before it (paho spends
                # ~0.3 ms a publish: the last of 50 reports of a second left ~15 ms after the first)
                for i, oid in enumerate(ids):
                    now = time.time()
                    pubs[owner_of[i]].publish(i, owner_of[i], oid, float(lon[i]), float(lat[i]), now)
                    positions.append((i, now, float(lon[i]), float(lat[i])))
                for sensor_id, topic, frame in demo_venues.due(time.time()):  # the doors' reports due by now
                    sensor_pubs.publish_raw(f"sensors/{sensor_id}/{topic}", frame)
                k += 1
                screen.status(f"[{now - started:5.0f}/{args.duration:g} s] {tally.sent:,} positions sent "
                              f"({tally.sent / max(now - started, 1e-9):,.0f}/s), {len(received):,} events, "
                              f"latency p50 {percentile(latency_ms, 50):.0f} ms")
            sent_s = time.time() - started
            # the doors' last reports: each when its time comes (the simulator counted them all in
            # its truth; a network delay can date one after the run's end), at most LAST_FRAMES_S on
            last = demo_venues.pending[-1][0] if demo_venues.pending else 0.0
            await asyncio.sleep(max(0.0, min(last - time.time(), LAST_FRAMES_S)))  # real time: its due time
            for sensor_id, topic, frame in demo_venues.due(math.inf):
                sensor_pubs.publish_raw(f"sensors/{sensor_id}/{topic}", frame)
            deadline = time.monotonic() + DRAIN_S
            while ((tally.acked < tally.sent or sensor_tally.acked < sensor_tally.sent)
                   and time.monotonic() < deadline):
                await asyncio.sleep(0.05)  # poll: paho confirms (PUBACK) arrive on its threads
            want = tenant_reference(specs, ids, owner_of, positions)
            while reference.compare(received, want) and time.monotonic() < deadline:
                screen.status(f"waiting for the last events: {len(received):,} of {len(want):,}")
                await asyncio.sleep(0.2)  # poll for events still on their way
            want_reports = venues.distinct_frames(demo_venues)
            while await venues.stored(pg, demo_venues) < want_reports and time.monotonic() < deadline:
                screen.status("waiting for the sensors' last reports to be stored")
                await asyncio.sleep(0.2)  # poll for reports still on their way
            screen.done()
        finally:
            for p in pubs.values():
                p.close()
            sensor_pubs.close()

    diff = reference.compare(received, want)
    enters = sum(1 for e in received if e[0] == "enter")
    print(f"\n{'fence':<44}{'ENTER':>7}{'LEAVE':>7}")
    for fid in sorted({f for f, _ in by_fence}, key=lambda f: -by_fence[(f, "enter")]):
        print(f"{tenant_of(fid) + ' / ' + names.get(fid, fid)[:30]:<44}{by_fence[(fid, 'enter')]:>7}"
              f"{by_fence[(fid, 'leave')]:>7}")
    print(f"\nObjects {args.vehicles} ({n_fleet} of {FLEET}, {len(ids) - n_fleet} of {VENUES}), "
          f"{tally.sent:,} position updates in {sent_s:.0f} s ({tally.sent / sent_s:,.1f}/s, {tally.acked:,} "
          "confirmed by the broker)")
    p50, p99 = percentile(latency_ms, 50), percentile(latency_ms, 99)
    print(f"Events {len(received):,} (ENTER {enters:,}, LEAVE {len(received) - enters:,}); latency from "
          f"position to event p50 {p50:.0f} ms, p99 {p99:.0f} ms")
    print(f"Reference (shapely on every published position, each tenant's objects against its own "
          f"fences): {len(want):,} events; identical: {not diff}")
    for line in diff:
        print("  " + line)
    print(f"Tenant wall: {len(crossed)} event(s) paired a fence with another tenant's object (none may)")
    for line in crossed[:10]:
        print("  crossed: " + line)
    venue_lines, venues_exact, notified = await venues.report(pg, demo_venues)
    reports = await venues.stored(pg, demo_venues)
    await pg.close()
    print("\nVenues: this run's door counts as stored, against the simulator (truth in/out); today: the "
          f"hive's occupancy since its reset (earlier runs today included); phones: {VENUES}'s phones inside "
          "its fence")
    for line in venue_lines:
        print("  " + line)
    print(f"Sensor reports stored {reports:,} (of {sensor_tally.sent:,} frames sent); counts identical to "
          f"the simulator: {venues_exact}; notifications to {venues.DEMO_USER}: {notified} (logged; the "
          "local stack has no FCM credentials)")
    ok = (not diff and not crossed and tally.acked == tally.sent and len(received) > 0 and venues_exact
          and sensor_tally.acked == sensor_tally.sent)
    print(f"\nSUMMARY {'OK' if ok else 'MISMATCH'}: 2 tenants ({FLEET}, {VENUES}), {len(crossed)} events "
          f"across them; {args.vehicles} objects, {tally.sent:,} updates "
          f"({tally.sent / sent_s:,.1f}/s) over MQTT, {len(received):,} events in "
          f"{len({f for f, _ in by_fence})} fences, latency p50 {p50:.0f} ms / p99 {p99:.0f} ms, "
          f"events identical to the shapely reference: {not diff}; {len(demo_venues.venues)} venues, "
          f"{reports:,} sensor reports, counts identical to the simulator: {venues_exact}, "
          f"{notified} notifications")
    api = conn["api"]
    example = ids[0]  # a vehicle of the fleet
    print(f"""
The stack stays up (`geofence down` stops it). Look at it:
  geofence status
  geofence inspect fence li-vaduz --tenant {FLEET}          who of the fleet is in Vaduz now
  geofence inspect object {example} --tenant {FLEET}    the fences a vehicle is in
  geofence tenant list                     the tenants, their members and fences
  geofence inspect geo {settings.regions[0]}                  an x-geo region's bindings
  geofence inspect ring / worldmap / topology
  curl {api}/hives?q=       the venues and how busy they are (no token)
  {api}/map          the live map: vehicles, fences by occupancy, events, search
  {api}/ops          the pipeline's figures: rates, latency, queues, dead letters, alerts
  {conn['prometheus']}         Prometheus (every process's /metrics, the alert rules)
  API docs: {api}/docs  (Bearer token: a Firebase ID token; locally from the Auth emulator at
            http://{conn['firebase']['auth_emulator_host']}, project {conn['firebase']['project']})
Vehicles stay in their fences until their {TIMEOUT_S:g} s timeout, then LEAVE with reason timeout.""")
    return 0 if ok else 1


def run(args: argparse.Namespace) -> int:
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(run_demo(args))
    return 130
