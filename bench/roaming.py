"""Proximity subscriptions (issue 20): 10,000 moving subscribers and 10,000 moving publishers on
the Liechtenstein road network, side by side with Tile38's ROAM on the same stream, in one run.

    python -m bench.roaming [--subscribers 10000] [--publishers 10000] [--updates 200000]
        [--workers 2] [--batch 2000] [--half-rate-s 10] [--skip-reference] [--tile38 PATH]

Workload: two fleets of the demo's traffic generator (deploy/demo/traffic.py: round trips on
the OSM extract's roads, 5 m GPS noise), one of subscribers (`r<radius>-car-NNNN`, radius 200,
300, 400 or 500 m by car number), one of publishers (`p-car-NNNN`); every vehicle reports once a
second of simulated time, the reports of a second shuffled together. Each subscriber carries one
subscription matching `p-*`. The fleets' routes take a while to compute (~5 ms a vehicle), so
the positions are kept in ~/.cache/geofence-bench/ for the next run.

Ours: the routing cores in one process, as the sidecars run them: x-geo's router
(exchanges/roam_routing.py) cuts each batch into the workers' shares, each worker's
matcher (fence/x_fence/roaming.py) reports the events; the events of all workers together are
compared with the brute-force reference (fence/reference.py `roam_events`: every subscription
against every object, row by row). Two figures:
- throughput: the stream in batches of --batch, as fast as it goes (one core);
- latency at half that rate: the first --half-rate-s seconds of the stream fed at half the
  measured rate, a batch cut every 5 ms or at --batch rows; a row's latency is from the moment it
  is due to the moment its batch's events are out.
No broker here: the figure is the matching path's own cost, what the sidecars add around it is
measured by bench/e2e.py for the fence path.

With --live, the same stream through the running stack (`geofence up`), all of it the benchmarks'
tenant's (bench/tenant.py): the subscriptions stored as the API stores them (ids and objects
qualified, `bench:<run>-...`), positions as gateway batches of a gateway user made for the run
(ingress.gateway, routing key the tenant) with their due time as ts, the events read from
fence.events (`roam-events.bench.#`); the first second at full speed (its events awaited),
then --live-s seconds paced at --live-rate, each event's latency being its receipt minus its
position's time.

Tile38 (../shared/anchors/tile38/tile38-server): the subscribers in key `subs`, the publishers in
`pubs`; per radius two hooks, `SETCHAN ... NEARBY subs MATCH r<R>-* FENCE NODWELL ROAM pubs * R`
(a subscriber moved) and `SETCHAN ... NEARBY pubs FENCE NODWELL ROAM subs r<R>-* R` (a
publisher moved); the SETs pipelined in batches of --pipeline while a subscriber collects the
notifications, which are compared with the reference too (as (subscriber, publisher, kind)
counts: Tile38 does not carry our timestamps). Its rate is updates over the time from the first
SET to the last notification.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: again as a module of bench
    import cli  # type: ignore[import-not-found]  # bench/cli.py, in this file's own folder

    cli.run_as_module(__file__)

import argparse
import asyncio
import contextlib
import os
import threading
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import msgpack
import numpy as np
import numpy.typing as npt

from bench import report
from bench import tenant as tn
from bench.versus_tile38 import TILE38, Resp, Subscriber, encode, tile38_server
from deploy.demo.traffic import Fleet, road_network
from deploy.inspect_cmd import ask, ring_in_force
from deploy.settings import Settings, load_connection_settings
from exchanges import routing_store, topology
from exchanges.hash_ring import HashRing
from exchanges.roam_cells import BlockOwners, RoamGrid
from exchanges.roam_routing import RoamRouter
from exchanges.subscriptions import Subscription
from fence import store
from fence.reference import roam_events
from fence.x_fence.roaming import RoamEvent, RoamMatcher

RADII = (200.0, 300.0, 400.0, 500.0)
GATEWAY_TICK_S = 0.005  # the live run's publisher sends what is due every 5 ms (a gateway's batching)
CACHE = Path.home() / ".cache" / "geofence-bench"
START_S = 120.0  # simulated time of the first report: every vehicle is on its way
F64 = npt.NDArray[np.float64]


# --------------------------------------------------------------------------- workload


def _fleet_track(n: int, seed: int, ticks: int) -> tuple[F64, F64]:
    """(ticks, n) lon and lat of a fleet reporting once a second from START_S."""
    fleet = Fleet(road_network(), n, seed)
    lon, lat = np.empty((ticks, n)), np.empty((ticks, n))
    for t in range(ticks):
        _, lon[t], lat[t] = fleet.positions(START_S + t)
    return lon, lat


@dataclass(frozen=True, eq=False)
class Stream:
    ids: list[str]
    lon: F64
    lat: F64
    ts: F64
    subscriptions: list[Subscription]

    def __len__(self) -> int:
        return len(self.ids)


def make_stream(n_sub: int, n_pub: int, updates: int, seed: int) -> Stream:
    ticks = -(-updates // (n_sub + n_pub))
    path = CACHE / f"roaming-{n_sub}-{n_pub}-{ticks}-{seed}.npz"
    if path.is_file():
        data = np.load(path)
        slon, slat, plon, plat = data["slon"], data["slat"], data["plon"], data["plat"]
    else:
        report.warn(f"computing the fleets' routes ({n_sub + n_pub:,} vehicles, ~5 ms each, two processes); "
                    f"kept in {path}")
        with ProcessPoolExecutor(2) as pool:
            fs = pool.submit(_fleet_track, n_sub, seed, ticks)
            fp = pool.submit(_fleet_track, n_pub, seed + 1, ticks)
            (slon, slat), (plon, plat) = fs.result(), fp.result()
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, slon=slon, slat=slat, plon=plon, plat=plat)
        tmp.replace(path)
    sub_ids = [f"r{int(RADII[i % len(RADII)])}-car-{i + 1:05d}" for i in range(n_sub)]
    pub_ids = [f"p-car-{i + 1:05d}" for i in range(n_pub)]
    names = sub_ids + pub_ids
    rng = np.random.default_rng(seed)
    ids: list[str] = []
    lon, lat, ts = [], [], []
    for t in range(ticks):
        order = rng.permutation(n_sub + n_pub)
        lo = np.concatenate([slon[t], plon[t]])[order]
        la = np.concatenate([slat[t], plat[t]])[order]
        ids += [names[i] for i in order.tolist()]
        lon.append(lo)
        lat.append(la)
        ts.append(np.full(order.size, 1_790_000_000.0 + START_S + t))
    subs = [Subscription(f"near-{s}", s, RADII[i % len(RADII)], match="p-*") for i, s in enumerate(sub_ids)]
    return Stream(ids[:updates], np.concatenate(lon)[:updates], np.concatenate(lat)[:updates],
                  np.concatenate(ts)[:updates], subs)


# --------------------------------------------------------------------------- ours


@dataclass
class Pipeline:
    router: RoamRouter
    workers: list[RoamMatcher]
    routed_rows: int = 0
    route_s: float = 0.0
    match_s: list[float] = field(default_factory=list)

    @staticmethod
    def make(subs: list[Subscription], n_workers: int) -> Pipeline:
        grid = RoamGrid.for_radius(max(s.radius_m for s in subs))
        names = [f"w{i}" for i in range(n_workers)]
        ring = HashRing(names)
        router = RoamRouter(grid, BlockOwners(grid, names, ring.nodes_for_many))
        workers = [RoamMatcher(grid, BlockOwners(grid, names, ring.nodes_for_many), i)
                   for i in range(n_workers)]
        for s in subs:
            router.set_radius(s.object, max(router.radius(s.object), s.radius_m))
            for w in workers:
                w.add(s)
        return Pipeline(router, workers, match_s=[0.0] * n_workers)

    def batch(self, ids: list[str], lon: F64, lat: F64, ts: F64) -> list[RoamEvent]:
        t = time.perf_counter()
        shares = self.router.route(ids, lon, lat, ts)
        self.route_s += time.perf_counter() - t
        out: list[RoamEvent] = []
        for w, rows in shares.items():
            t = time.perf_counter()
            r = rows.rows
            out += self.workers[w].apply([ids[i] for i in r.tolist()], lon[r], lat[r], ts[r],
                                         rows.prev_lon, rows.prev_lat)
            self.match_s[w] += time.perf_counter() - t
            self.routed_rows += len(rows)
        return out


@dataclass
class OursRun:
    first_s: float  # the first second of reports (every object appears)
    steady_per_s: float  # the rest, updates per second
    events: list[RoamEvent]
    pipeline: Pipeline


def run_ours(s: Stream, n_workers: int, batch: int, first: int) -> OursRun:
    """The stream in batches, as fast as it goes: the first `first` rows (every object's first
    report: all the pairs near at the start) timed apart from the rest."""
    p = Pipeline.make(s.subscriptions, n_workers)
    events: list[RoamEvent] = []
    progress = report.Progress("ours, full speed", len(s))
    marks = [time.perf_counter()]
    for part in ((0, first), (first, len(s))):
        for lo in range(part[0], part[1], batch):
            hi = min(lo + batch, part[1])
            events += p.batch(s.ids[lo:hi], s.lon[lo:hi], s.lat[lo:hi], s.ts[lo:hi])
            progress.update(hi)
        marks.append(time.perf_counter())
    progress.close()
    return OursRun(marks[1] - marks[0], (len(s) - first) / (marks[2] - marks[1]), events, p)


def run_paced(s: Stream, n_workers: int, batch: int, rate: float, seconds: float, first: int) -> F64:
    """After the first `first` rows (untimed), rows due at `rate` per second; a batch is cut
    every 5 ms (or at `batch` rows) from the rows due by then; each row's latency is from its
    due time to its batch's end."""
    p = Pipeline.make(s.subscriptions, n_workers)
    for lo in range(0, first, batch):
        hi = min(lo + batch, first)
        p.batch(s.ids[lo:hi], s.lon[lo:hi], s.lat[lo:hi], s.ts[lo:hi])
    n = min(len(s) - first, int(rate * seconds))
    due = np.arange(n) / rate
    lat = np.empty(n)
    progress = report.Progress(f"ours, paced at {rate:,.0f}/s", n)
    t0 = time.perf_counter()
    lo = 0
    while lo < n:
        now = time.perf_counter() - t0
        hi = min(int(np.searchsorted(due, now, "right")), lo + batch, n)
        if hi <= lo:
            time.sleep(max(0.0, min(0.005, due[lo] - now)))  # waiting for the next row to be due: pacing
            continue
        a, b = first + lo, first + hi
        p.batch(s.ids[a:b], s.lon[a:b], s.lat[a:b], s.ts[a:b])
        lat[lo:hi] = (time.perf_counter() - t0) - due[lo:hi]
        lo = hi
        progress.update(hi)
    progress.close()
    return lat


# --------------------------------------------------------------------------- ours, live


@dataclass
class LiveRun:
    storm_s: float  # the first reports (every object appears) until their events stopped coming
    storm_events: int
    rate: float  # updates/s published in the timed part
    updates: int
    events: int
    latency_ms: F64  # per event of the timed part: received minus its position's time


def _listen(url: str, run: str, ready: Any, stop: Any, last: Any, count: Any, out: Any) -> None:
    """A process of its own: the run's proximity events from fence.events, (received, position
    ts) each, sent to `out` once `stop` is set. In the benchmark's own process the consumer
    shared one core with the publisher and was the bottleneck (the process at 100% CPU, the
    sidecars at 10%), so latencies measured its backlog, not the stack's."""
    import aiormq

    async def main() -> None:
        conn = await aiormq.connect(url)
        ch = await conn.channel()
        await ch.basic_qos(prefetch_count=10_000)
        declared = await ch.queue_declare("", exclusive=True, auto_delete=True)
        queue = str(declared.queue)
        key = f"{topology.ROAM_EVENTS_TOPIC_PREFIX}.{tn.TENANT}.#"  # the tenant's proximity events
        await ch.queue_bind(queue, topology.EVENTS_EXCHANGE, key)
        recv: list[float] = []
        ts: list[float] = []
        marker = b'"subscription":"' + run.encode()

        async def on(m: Any) -> None:
            body = m.body
            if marker in body:
                recv.append(time.time())
                at = body.index(b'"ts":') + 5  # its one field named ts (json.loads: 3x the cost)
                end = at
                while body[end] not in b",}":
                    end += 1
                ts.append(float(body[at:end]))
                last.value = time.monotonic()
                count.value += 1

        await ch.basic_consume(queue, on, no_ack=True)
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.05)
        await conn.close()
        out.send((np.array(recv), np.array(ts)))

    asyncio.run(main())


async def run_live(s: Stream, rate: float, seconds: float, first: int, batch: int) -> LiveRun:
    """The stream through the running stack (`geofence up`): the subscriptions stored as the
    API stores them, every position a gateway batch's with its due time as ts, the events read
    from fence.events (roam-events.#) by a process of its own (`_listen`). The first `first`
    reports (every object appearing with all the pairs near at the start) go at full speed and
    their events are awaited; then `seconds` of the stream paced at `rate`, each event's latency
    being its receipt minus its position's ts (the time it was due, so the gateway's batching
    wait of up to GATEWAY_TICK_S counts). The publisher keeps its confirms in flight (a gateway
    that waited for each confirm before the next batch would add its round trip to every
    position)."""
    import multiprocessing as mp

    conn = load_connection_settings()
    workers = list((await ring_in_force(Settings.from_env())).nodes)
    run = f"rb{os.getpid() % 10_000:04d}{int(time.time()) % 100_000:05d}"
    ids = [f"{run}-{o}" for o in s.ids]  # as published: x-ingress qualifies them by the gateway's tenant
    # qualified as stored; the glob matches the names within the subscription's tenant
    subs = [Subscription(tn.qualified(f"{run}-{x.id}"), tn.qualified(f"{run}-{x.object}"), x.radius_m,
                         match=f"{run}-p-*")
            for x in s.subscriptions]
    pg = await routing_store.connect(conn["postgres"]["dsn"])
    await tn.ensure_tenant(pg)
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    last, count = ctx.Value("d", time.monotonic()), ctx.Value("q", 0)
    mine, theirs = ctx.Pipe(duplex=False)
    listener = ctx.Process(target=_listen, args=(conn["amqp"][topology.FENCES_VHOST], run, ready, stop, last,
                                                 count, theirs), daemon=True)
    listener.start()

    async def quiet(after: float) -> None:  # until no event came for `after` seconds
        while time.monotonic() - last.value < after:
            await asyncio.sleep(0.2)

    stack = contextlib.AsyncExitStack()  # the run's gateway user, removed at the end
    try:
        if not await asyncio.to_thread(ready.wait, 60):
            raise RuntimeError("the event listener did not start")
        progress = report.Progress("live: subscriptions stored", len(subs))
        for i, x in enumerate(subs):
            await store.put_subscription(pg, "bench", x.to_wire())
            if i % 200 == 0:
                progress.update(i + 1)
        progress.close()
        end = time.monotonic() + 300
        while True:  # every worker has them (x-ingress reads and applies the changes in order)
            answers = [await ask(conn["amqp"][topology.FENCES_VHOST], topology.FENCE_CONTROL_EXCHANGE, w, {})
                       for w in workers]
            counts = [(a.get("proximity") or {}).get("subscriptions", 0) for a in answers]
            if counts and min(counts) >= len(subs):
                break
            if time.monotonic() > end:
                raise RuntimeError(f"the subscriptions did not reach every worker: {counts}")
            await asyncio.sleep(0.5)
        gateway = await stack.enter_async_context(tn.run_gateway())
        gw = await aio_pika.connect(gateway.amqp_url)
        try:
            gch = await gw.channel(publisher_confirms=True)
            ex = await gch.get_exchange(topology.GATEWAY_EXCHANGE, ensure=False)
            confirms: set[asyncio.Future[Any]] = set()

            async def send(lo: int, hi: int, ts: F64) -> None:
                body = msgpack.packb({"positions": [
                    {"id": ids[i], "lon": float(s.lon[i]), "lat": float(s.lat[i]), "ts": float(ts[i - lo])}
                    for i in range(lo, hi)]})
                while len(confirms) >= 64:  # a bounded window of unconfirmed batches
                    _, pending = await asyncio.wait(confirms, return_when=asyncio.FIRST_COMPLETED)
                    for f in confirms - pending:
                        f.result()  # a refusal fails the run
                    confirms.intersection_update(pending)
                message = aio_pika.Message(body, content_type="application/msgpack",
                                           delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
                confirms.add(asyncio.ensure_future(ex.publish(message, gateway.routing_key)))
                await asyncio.sleep(0)  # written in order

            t0 = last.value = time.monotonic()
            for lo in range(0, first, batch):
                hi = min(lo + batch, first)
                await send(lo, hi, np.full(hi - lo, time.time()))
            await asyncio.gather(*confirms)
            await quiet(3.0)  # the storm's events: until quiet
            storm_s, storm_events = last.value - t0, count.value
            n = min(len(s) - first, int(rate * seconds))
            progress = report.Progress(f"live, paced at {rate:,.0f}/s", n)
            start = time.time()
            sent = 0
            while sent < n:  # a gateway's batching: every GATEWAY_TICK_S, what is due by then
                await asyncio.sleep(max(0.0, start + (sent + 1) / rate - time.time(), GATEWAY_TICK_S))
                hi = min(n, sent + batch, max(sent + 1, int((time.time() - start) * rate)))
                ts = start + np.arange(sent, hi) / rate
                await send(first + sent, first + hi, ts)
                sent = hi
                progress.update(sent)
            await asyncio.gather(*confirms)
            progress.close()
            published_s = time.time() - start
            await quiet(3.0)
        finally:
            await gw.close()
        stop.set()
        recv, ts_all = await asyncio.to_thread(mine.recv)
        paced = ts_all >= start
        lat = (recv[paced] - ts_all[paced]) * 1e3
        return LiveRun(storm_s, storm_events, n / published_s, n, int(paced.sum()), lat)
    finally:
        stop.set()
        listener.join(10)
        if listener.is_alive():
            listener.kill()
        for x in subs:
            with contextlib.suppress(Exception):
                await store.delete_subscription(pg, x.id)
        await pg.close()
        await stack.aclose()


# --------------------------------------------------------------------------- Tile38


@dataclass
class RoamSubscriber(Subscriber):
    """Tile38's notifications as (subscriber, publisher, kind) of every roam match."""

    got: Counter[tuple[str, str, str]] = field(default_factory=Counter)

    def note(self, notification: dict[str, Any]) -> None:
        for kind in ("nearby", "faraway"):
            if kind in notification:
                a, b = notification["id"], notification[kind]["id"]
                sub, pub = (a, b) if notification.get("key") == "subs" else (b, a)
                self.got[(sub, pub, kind)] += 1


@dataclass
class TileRun:
    first_s: float
    steady_per_s: float
    notifications: int
    got: Counter[tuple[str, str, str]]


def run_tile38(binary: Path, s: Stream, pipeline: int, first: int) -> TileRun:
    with tile38_server(binary) as port:
        c = Resp(port)
        try:
            hooks = []
            for r in RADII:
                m = f"r{int(r)}-*"
                hooks += [encode("SETCHAN", f"s{int(r)}", "NEARBY", "subs", "MATCH", m, "FENCE", "NODWELL",
                                 "ROAM", "pubs", "*", str(r)),
                          encode("SETCHAN", f"p{int(r)}", "NEARBY", "pubs", "FENCE", "NODWELL",
                                 "ROAM", "subs", m, str(r))]
            c.pipeline(hooks)
            sub = RoamSubscriber(port)
            thread = threading.Thread(target=sub.run, name="tile38-roam-subscriber", daemon=True)
            thread.start()
            if not sub.ready.wait(10) or sub.error:
                raise RuntimeError(f"tile38 subscriber did not start: {sub.error}")
            keys = ["pubs" if i.startswith("p-") else "subs" for i in s.ids]
            lat, lon = s.lat.tolist(), s.lon.tolist()
            progress = report.Progress("tile38", len(s))
            spans = []
            for part in ((0, first), (first, len(s))):
                t0 = time.perf_counter()
                for lo in range(part[0], part[1], pipeline):
                    hi = min(lo + pipeline, part[1])
                    c.pipeline([encode("SET", keys[i], s.ids[i], "POINT", repr(lat[i]), repr(lon[i]))
                                for i in range(lo, hi)])
                    progress.update(hi)
                sets_done = time.perf_counter()
                sub.wait_quiet()
                spans.append(max(sets_done, sub.last) - t0)
            progress.close()
            sub.stop.set()
            thread.join(5)
            if sub.error:
                raise RuntimeError(f"tile38 subscriber: {sub.error}")
            return TileRun(spans[0], (len(s) - first) / spans[1], sub.count, sub.got)
        finally:
            c.close()


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.roaming", description=__doc__.split("\n\n")[0])
    p.add_argument("--subscribers", type=int, default=10_000)
    p.add_argument("--publishers", type=int, default=10_000)
    p.add_argument("--updates", type=int, default=200_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=2_000)
    p.add_argument("--half-rate-s", type=float, default=10.0, help="seconds of stream fed at half the rate")
    p.add_argument("--pipeline", type=int, default=500)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--skip-reference", action="store_true", help="no brute-force check (faster)")
    p.add_argument("--tile38", type=Path, default=TILE38)
    p.add_argument("--only", choices=("tile38", "ours"))
    p.add_argument("--live", action="store_true",
                   help="also through the running stack (`geofence up`): latency at --live-rate")
    p.add_argument("--live-rate", type=float, default=4_000.0,
                   help="updates/s of the live run (half of 8,000)")
    p.add_argument("--live-s", type=float, default=20.0, help="seconds of the live run's paced part")
    a = p.parse_args(argv)
    for name in ("subscribers", "publishers", "updates", "workers", "batch", "pipeline"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be positive")

    s = make_stream(a.subscribers, a.publishers, a.updates, a.seed)
    print(f"workload: {a.subscribers:,} subscribers (radius {', '.join(f'{r:.0f}' for r in RADII)} m), "
          f"{a.publishers:,} publishers, {len(s):,} updates on the Liechtenstein roads", flush=True)
    want: Counter[tuple[str, str, str, float]] | None = None  # (subscription, object, kind, ts)
    if not a.skip_reference:
        t = time.perf_counter()
        want = Counter(roam_events(s.subscriptions, s.ids, s.lon, s.lat, s.ts))
        print(f"reference (brute force): {sum(want.values()):,} events in {time.perf_counter() - t:.1f} s",
              flush=True)
    first = min(len(s), a.subscribers + a.publishers)
    rate = None
    rows = []
    verdict_ok = True
    if a.only != "tile38":
        ours = run_ours(s, a.workers, a.batch, first)
        rate, events, pipe = ours.steady_per_s, ours.events, ours.pipeline
        got = Counter(e.key() for e in events)
        dup = len(events) - len({e.id for e in events})
        same = "-" if want is None else ("yes" if got == want else "NO")
        if want is not None and same == "NO":
            verdict_ok = False
            miss, extra = want - got, got - want
            print(f"ours differ: {sum(miss.values())} missing, e.g. {list(miss)[:3]}; "
                  f"{sum(extra.values())} extra, e.g. {list(extra)[:3]}", flush=True)
        held = [len(w.held()) for w in pipe.workers]
        print(f"ours: {len(events):,} events ({dup} duplicate ids), rows routed {pipe.routed_rows:,} "
              f"({pipe.routed_rows / len(s):.2f} per update), held per worker {held}; cpu: route "
              f"{pipe.route_s:.2f} s, match {', '.join(f'{x:.2f}' for x in pipe.match_s)} s", flush=True)
        lat = run_paced(s, a.workers, a.batch, rate / 2, a.half_rate_s, first)
        rows.append(["ours (cores, 1 process)", f"{ours.first_s:.1f}", f"{rate:,.0f}", f"{len(events):,}",
                     same, f"{np.mean(lat) * 1e3:.1f}", f"{report.pct(lat * 1e3, 99):.1f}"])
    tile = None
    have = a.tile38.is_file() and os.access(a.tile38, os.X_OK)
    if a.only != "ours":
        if not have:
            report.warn(f"no Tile38 binary at {a.tile38}: ours alone")
        else:
            tile = run_tile38(a.tile38, s, a.pipeline, first)
            same_t = "-"
            if want is not None:
                w3: Counter[tuple[str, str, str]] = Counter()
                for (sub_id, obj, kind, _), v in want.items():
                    w3[(sub_id.removeprefix("near-"), obj, kind)] += v
                same_t = "yes" if w3 == tile.got else f"NO ({sum((w3 - tile.got).values())} missing, " \
                                                      f"{sum((tile.got - w3).values())} extra)"
            rows.append(["Tile38 ROAM NODWELL", f"{tile.first_s:.1f}", f"{tile.steady_per_s:,.0f}",
                         f"{tile.notifications:,}", same_t, "-", "-"])
    live = None
    if a.live and a.only != "tile38":
        live = asyncio.run(run_live(s, a.live_rate, a.live_s, first, 500))
        lat_ms = live.latency_ms
        print(f"live: the first {first:,} reports' {live.storm_events:,} events in {live.storm_s:.1f} s; "
              f"then {live.updates:,} updates at {live.rate:,.0f}/s gave {live.events:,} events, latency "
              f"avg {np.mean(lat_ms):.1f} ms, p50 {report.pct(lat_ms, 50):.1f}, "
              f"p99 {report.pct(lat_ms, 99):.1f}", flush=True)
        rows.append(["ours, live stack", f"{live.storm_s:.1f}", f"({live.rate:,.0f} paced)",
                     f"{live.events:,}", "-", f"{np.mean(lat_ms):.1f}", f"{report.pct(lat_ms, 99):.1f}"])
    print()
    header = ["system", "first second (s)", "then updates/s", "events", "= reference", "avg ms @ half",
              "p99 ms @ half"]
    print(report.table(header, rows))
    print(f"(first second: the {first:,} first reports, every object appearing with all the pairs near at "
          f"the start; then: the other {len(s) - first:,} updates)")
    r = report.ratio(rate, tile.steady_per_s if tile else None)
    parts = [f"ours {rate:,.0f} updates/s" if rate else "ours -",
             f"Tile38 {tile.steady_per_s:,.0f}/s" if tile else "Tile38 -",
             f"ratio {report.ratio_cell(r)}x", f"target 8,000/s: {report.times(report.ratio(rate, 8000.0))}"]
    if rows and rows[0][0].startswith("ours"):
        parts.append(f"avg latency at half rate {rows[0][5]} ms in process (target <= 50)")
    if live is not None:
        parts.append(f"live stack at {live.rate:,.0f}/s: avg {np.mean(live.latency_ms):.1f} ms")
    print(report.summary(parts, verdict="" if verdict_ok else "MISMATCH"))
    return 0 if verdict_ok else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
