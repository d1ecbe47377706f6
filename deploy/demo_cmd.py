"""`geofence demo`: the live fleet demo the README's first command runs.

Real data ((c) OpenStreetMap contributors, ODbL 1.0): the 11 municipalities of
Liechtenstein are fences, plus points of interest as 150 m circles. A fleet of vehicles drives
round trips on the extract's road network (deploy/demo/traffic.py: fastest paths, speed by road
class, Gaussian GPS noise) and publishes its positions over MQTT in real time, as devices do
(`positions/<object_id>`, QoS 1). The demo prints the ENTER / LEAVE events the pipeline emits
as they arrive (AMQP, exchange fence.events), a progress line, and a summary: vehicles,
updates/s, events by fence, latency from a position to its event (p50 / p99), and whether the
events are exactly those shapely computes from the very positions published. The stack stays
up afterwards.

Each run's vehicles have ids of their own (`d<run>-car-0001`...), so earlier runs' vehicles
(still inside fences until their timeout) never mix into this run's comparison; events of
fences that are not the demo's (other users' fences in the area) are left out of it too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from deploy.settings import Settings, load_connection_settings
from exchanges import topology as t
from fence import reference, store
from fence.follow import circle
from fence.manager import FenceManager
from fence.spec import FenceSpec

OWNER = "demo"
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
    """FenceSpecs: municipalities (li-<name>) and `pois` points of interest (poi-<name>)."""
    specs = [FenceSpec(fence_id=f"li-{slug(name)}", geometry=geom, name=name, timeout_s=TIMEOUT_S,
                       owner=OWNER, hysteresis_m=BORDER_BAND_M)
             for name, geom in municipalities().items()]
    for fid, name, lon, lat, kind in demo_pois(pois):
        specs.append(FenceSpec(fence_id=fid, geometry=circle(lon, lat, POI_RADIUS_M),
                               name=f"{name} ({kind})", timeout_s=TIMEOUT_S, owner=OWNER))
    return specs


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
    """A few paho MQTT connections (as the administrator, vhost gf-ingress), QoS 1."""

    def __init__(self, mqtt_cfg: dict[str, Any], run: str, n: int, tally: Tally) -> None:
        self.clients = []
        self.tally = tally
        connected = threading.Semaphore(0)
        for k in range(n):
            c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"demo-{run}-{k}", protocol=mqtt.MQTTv311)
            c.username_pw_set(f"{mqtt_cfg['ingress_vhost']}:{mqtt_cfg['username'].split(':', 1)[1]}",
                              mqtt_cfg["password"])
            c.max_inflight_messages_set(1000)
            c.on_connect = lambda cl, u, f, reason, p: connected.release()
            c.on_publish = lambda cl, u, mid, reason, p: tally.ack()
            c.connect(mqtt_cfg["host"], mqtt_cfg["port"], keepalive=30)
            c.loop_start()
            self.clients.append(c)
        for _ in range(n):
            if not connected.acquire(timeout=20):
                raise RuntimeError("MQTT connection not accepted within 20 s: is the stack up?")

    def publish(self, i: int, object_id: str, lon: float, lat: float, ts: float) -> None:
        body = json.dumps({"lon": lon, "lat": lat, "ts": ts})
        self.clients[i % len(self.clients)].publish(f"positions/{object_id}", body, qos=1)
        self.tally.sent += 1

    def publish_raw(self, topic: str, payload: bytes) -> None:
        self.clients[0].publish(topic, payload, qos=1)
        self.tally.sent += 1

    def close(self) -> None:
        for c in self.clients:
            c.disconnect()
            c.loop_stop()


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
    names = {s.fence_id: s.name for s in specs}
    amqp = conn["users"][t.MANAGER_USER][t.region_vhost(settings.regions[0])]
    async with FenceManager(amqp, conn["postgres"]["dsn"], settings.regions, settings.workers) as manager:
        async with manager.pool.acquire() as pg:  # the demo's fences are exactly this run's
            stale = [r.fence.fence_id for r in await store.find_fences(pg, OWNER, limit=100_000)
                     if r.fence.fence_id not in names]
        for fid in stale:
            await manager.remove(fid, owner=OWNER)
        ranges = 0
        for s in specs:
            ranges += (await manager.put(s, owner=OWNER)).ranges
        await manager.applied(timeout=60)
    n_li = sum(1 for s in specs if s.fence_id.startswith("li-"))
    print(f"Fences: {n_li} municipalities and {len(specs) - n_li} points of interest ({POI_RADIUS_M:g} m), "
          f"{ranges:,} Hilbert ranges bound in the x-geo regions {', '.join(settings.regions)}")

    network = road_network()
    fleet = Fleet(network, args.vehicles, args.seed, args.noise, departure_spread_s=0.0)
    fleet.true_positions(0.0)  # the first legs planned (~0.2 s) before the clock starts
    ids = [f"d{run}-{v}" for v in fleet.ids]
    print(f"Fleet: {args.vehicles} vehicles on {network.n_nodes:,} road nodes, reporting every "
          f"{1 / args.rate:g} s over MQTT for {args.duration:g} s (GPS noise {args.noise:g} m)")
    print(f"Watch it live: {conn['api']}/map (the fleet moving, fences coloured by who is inside, "
          f"ENTER / LEAVE as they happen); {conn['api']}/ops (the pipeline's figures)\n")

    screen = Screen()
    received: list[reference.EventTuple] = []
    latency_ms: list[float] = []
    by_fence: Counter[tuple[str, str]] = Counter()
    prefix = f"d{run}-"

    async def on_event(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        async with message.process():
            e = json.loads(message.body)
            # this run's vehicles in the demo's fences (other users' fences may be around too)
            if not str(e.get("object_id", "")).startswith(prefix) or e.get("fence_id") not in names:
                return
            now = time.time()
            received.append((e["event"], e["fence_id"], e["object_id"], float(e["ts"]), e["reason"]))
            latency_ms.append((now - float(e["ts"])) * 1e3)
            by_fence[(e["fence_id"], e["event"])] += 1
            if not args.quiet:
                clock = time.strftime("%H:%M:%S", time.localtime(float(e["ts"])))
                verb = "ENTER" if e["event"] == "enter" else "LEAVE"
                stay = f"after {e['inside_s']:.0f} s" if e.get("inside_s") is not None else ""
                screen.line(f"{clock}  {verb}  {e['object_id'][len(prefix):]:<9} "
                            f"{names.get(e['fence_id'], e['fence_id'])[:32]:<32} {stay:<8} "
                            f"{latency_ms[-1]:6.0f} ms")

    tally = Tally()
    sensor_tally = Tally()
    positions: list[tuple[int, float, float, float]] = []
    pg = await asyncpg.connect(conn["postgres"]["dsn"])
    demo_venues = await venues.prepare(pg, demo_pois(args.pois), OWNER, run, time.time() + 1.0, args.duration)
    print(f"Venues: {len(demo_venues.venues)} of the points of interest are hives (restaurants, bars, cafés, "
          f"shops) with a simulated door sensor each, {len(demo_venues.pending):,} frames over the run; "
          f"{venues.DEMO_USER} is told when one has {venues.BUSY} people or more\n")
    async with await aio_pika.connect(conn["amqp"][t.FENCES_VHOST], timeout=20) as amqp_conn:
        ch = await amqp_conn.channel()
        await ch.set_qos(prefetch_count=1000)
        q = await ch.declare_queue(f"demo-events-{run}", exclusive=True, auto_delete=True)
        await q.bind(t.EVENTS_EXCHANGE, "#")
        await q.consume(on_event)
        pubs = Publishers(dict(conn["mqtt"]), run, min(PUBLISHERS, args.vehicles), tally)
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
                # leg planned) is not the pipeline's, nor part of the latency shown
                now = time.time()
                for i, oid in enumerate(ids):
                    pubs.publish(i, oid, float(lon[i]), float(lat[i]), now)
                    positions.append((i, now, float(lon[i]), float(lat[i])))
                for sensor_id, topic, frame in demo_venues.due(now):  # the doors' reports due by now
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
            obj = np.array([p[0] for p in positions], np.int64)
            want = reference.reference_events(
                [s.fence_id for s in specs], [s.geometry for s in specs], ids, obj,
                np.array([p[2] for p in positions]), np.array([p[3] for p in positions]),
                np.array([p[1] for p in positions]), fences=specs)
            while reference.compare(received, want) and time.monotonic() < deadline:
                screen.status(f"waiting for the last events: {len(received):,} of {len(want):,}")
                await asyncio.sleep(0.2)  # poll for events still on their way
            want_reports = venues.distinct_frames(demo_venues)
            while await venues.stored(pg, demo_venues) < want_reports and time.monotonic() < deadline:
                screen.status("waiting for the sensors' last reports to be stored")
                await asyncio.sleep(0.2)  # poll for reports still on their way
            screen.done()
        finally:
            pubs.close()
            sensor_pubs.close()

    diff = reference.compare(received, want)
    enters = sum(1 for e in received if e[0] == "enter")
    print(f"\n{'fence':<44}{'ENTER':>7}{'LEAVE':>7}")
    for fid in sorted({f for f, _ in by_fence}, key=lambda f: -by_fence[(f, "enter")]):
        print(f"{names.get(fid, fid)[:43]:<44}{by_fence[(fid, 'enter')]:>7}{by_fence[(fid, 'leave')]:>7}")
    print(f"\nVehicles {args.vehicles}, {tally.sent:,} position updates in {sent_s:.0f} s "
          f"({tally.sent / sent_s:,.1f}/s, {tally.acked:,} confirmed by the broker)")
    p50, p99 = percentile(latency_ms, 50), percentile(latency_ms, 99)
    print(f"Events {len(received):,} (ENTER {enters:,}, LEAVE {len(received) - enters:,}); latency from "
          f"position to event p50 {p50:.0f} ms, p99 {p99:.0f} ms")
    print(f"Reference (shapely on every published position): {len(want):,} events; identical: {not diff}")
    for line in diff:
        print("  " + line)
    venue_lines, venues_exact, notified = await venues.report(pg, demo_venues)
    reports = await venues.stored(pg, demo_venues)
    await pg.close()
    print("\nVenues: this run's door counts as stored, against the simulator (truth in/out); today: the "
          "hive's occupancy since its reset (earlier runs today included); phones: vehicles inside its fence")
    for line in venue_lines:
        print("  " + line)
    print(f"Sensor reports stored {reports:,} (of {sensor_tally.sent:,} frames sent); counts identical to "
          f"the simulator: {venues_exact}; notifications to {venues.DEMO_USER}: {notified} (logged; the "
          "local stack has no FCM credentials)")
    ok = (not diff and tally.acked == tally.sent and len(received) > 0 and venues_exact
          and sensor_tally.acked == sensor_tally.sent)
    print(f"\nSUMMARY {'OK' if ok else 'MISMATCH'}: {args.vehicles} vehicles, {tally.sent:,} updates "
          f"({tally.sent / sent_s:,.1f}/s) over MQTT, {len(received):,} events in "
          f"{len({f for f, _ in by_fence})} fences, latency p50 {p50:.0f} ms / p99 {p99:.0f} ms, "
          f"events identical to the shapely reference: {not diff}; {len(demo_venues.venues)} venues, "
          f"{reports:,} sensor reports, counts identical to the simulator: {venues_exact}, "
          f"{notified} notifications")
    api = conn["api"]
    example = ids[0]
    print(f"""
The stack stays up (`geofence down` stops it). Look at it:
  geofence status
  geofence inspect fence li-vaduz          who is in Vaduz now
  geofence inspect object {example}    the fences a vehicle is in
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
