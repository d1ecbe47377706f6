"""Soak (issue 18): a long run at a steady rate, memory of every process sampled, events
checked against the reference at the end. Memory must stay flat; nothing may be lost.

    python -m bench.soak [--minutes 30] [--rate 37000] [--fences 1000] [--objects 10000]
        [--moving 100] [--sample-s 60] [--seed 1]

Against the running stack (`geofence up`), at the same time:
- the fleet: --objects objects random-walking over --fences static fences (bench/workload.py's
  box and fences, ids unique to the run), one round (every object moves once) after another,
  as gateway batches of 1,000 paced to --rate updates/s. The default rate is half of the
  largest amqp rate measured at F=1,000 in this issue (bench.versus_tile38: 74,000/s), in segments
  of a minute; the stream is generated segment by segment (the run never holds it whole) and
  the shapely reference follows it segment by segment, carrying who is inside what;
- --moving fences following cars (bench/moving_fleet.py, moving_fences's fleet: each car
  publishes a position a second, the follower moves its fence): a rebind of each fence every
  second;
- every --sample-s, the memory (Pss, see `memory_kib`) of every sidecar, RabbitMQ,
  PostgreSQL (the postmaster and its backends), memcached and this process.

Everything is the benchmarks' tenant's (bench/tenant.py): the fleet's fences `bench:s<run>-f...`,
its objects `s<run>-o...` published by a gateway user made for the run (removed at the end),
the cars and moving fences moving_fleet's.

At the end (publishing stopped): every fleet event must have arrived once (the events of
fence.event-batches, their ids qualified again by their tenant, kept as 64-bit digests of
(kind, fence, object, ts, reason): a run of millions of events fits in memory), none more,
none missing; every moving fence must stand on
its car's last position. The figures: per process, memory at the first sample after warm-up and
at the end, and the growth per hour (a least-squares slope over the samples after the first
--warmup-min minutes). Exit 1 if events differ or a moving fence did not settle; memory figures
never fail it (they are read, and quoted).
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: again as a module of bench
    import cli  # type: ignore[import-not-found]  # bench/cli.py, in this file's own folder

    cli.run_as_module(__file__)

import argparse
import array
import asyncio
import contextlib
import dataclasses
import functools
import math
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import aio_pika
import numpy as np
import orjson

from bench import broker_modes as bm
from bench import moving_fleet as mf
from bench import report
from bench import tenant as tn
from bench import workload as wl
from deploy.settings import ConnectionSettings, Settings, load_connection_settings
from exchanges import routing_store
from exchanges import topology as t
from fence import reference

RATE = 37_000.0  # half of the largest amqp rate at F=1,000 in this issue (74,000/s, bench.versus_tile38)
SEGMENT_S = 60.0
SETTLE_DEADLINE_S = 300.0  # after the last publish: every expected event, at most this late
BATCH = 1_000
LEFTOVER = f"^{tn.TENANT}:s[0-9a-f]{{6}}-f"  # the fleet fences of a run (bench:s<run id>-f...)


# --------------------------------------------------------------------------- the fleet


def digest(e: wl.EventTuple) -> int:
    return hash(e)  # this process's hash of the tuple: both sides are hashed here


class Reference:
    """The shapely reference over the segments, carrying who is inside what between them; its
    events named as the pipeline names them (fences qualified already, objects qualified here)."""

    def __init__(self, fences: list[wl.Fence], n_objects: int) -> None:
        self.names = [f.fence_id for f in fences]
        self.geoms = [f.geometry for f in fences]
        self.inside: list[frozenset[int]] = [frozenset()] * n_objects
        self.digests = array.array("q")

    def feed(self, st: wl.Stream) -> int:
        ids = [tn.qualified(o) for o in st.object_ids]
        got = reference.reference_events(self.names, self.geoms, ids, st.obj, st.lon, st.lat,
                                         st.ts, inside=self.inside)
        self.digests.extend(digest(e) for e in got)
        return len(got)


class BatchSink:
    """fence.event-batches -> digests of the run's events (the tenant's, by the run's prefix),
    their ids qualified again (bench/tenant.py)."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url, self.prefix = url, prefix
        self.digests = array.array("q")
        self.conn: aio_pika.abc.AbstractConnection | None = None

    async def start(self) -> None:
        self.conn = await aio_pika.connect(self.url)
        ch = await self.conn.channel()
        await ch.set_qos(prefetch_count=200)
        q = await ch.declare_queue("", exclusive=True)
        await q.bind(t.EVENT_BATCHES_EXCHANGE, "")
        await q.consume(self._on, no_ack=True)

    async def _on(self, m: aio_pika.abc.AbstractIncomingMessage) -> None:
        self.digests.extend(digest(e) for e in tn.run_events(orjson.loads(m.body), self.prefix))

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()


# --------------------------------------------------------------------------- memory


def memory_kib(pids: list[int]) -> int:
    """The processes' proportional set size (Pss: a shared page counted once across its
    sharers, so PostgreSQL's backends do not each count the shared buffers), or their resident
    set where smaps_rollup is missing."""
    total = 0
    for pid in pids:
        for path, label in ((f"/proc/{pid}/smaps_rollup", "Pss:"), (f"/proc/{pid}/status", "VmRSS:")):
            try:
                lines = Path(path).read_text().splitlines()
            except OSError:
                continue
            found = [int(line.split()[1]) for line in lines if line.startswith(label)]
            if found:
                total += found[0]
                break
    return total


@dataclass
class Samples:
    at_s: list[float] = field(default_factory=list)
    memory: dict[str, list[tuple[float, int]]] = field(default_factory=dict)  # name -> (s, KiB)

    def take(self, stack: mf.Stack, t0: float) -> None:
        now = time.perf_counter() - t0
        self.at_s.append(now)
        procs = {**stack.alive(), "this benchmark": [os.getpid()]}
        for name, pids in procs.items():
            self.memory.setdefault(name, []).append((now, memory_kib(pids)))


def growth_per_hour(points: list[tuple[float, int]], after_s: float) -> float:
    """KiB per hour: the least-squares slope of the samples taken after `after_s`."""
    pts = [(s, k) for s, k in points if s >= after_s]
    if len(pts) < 2:
        return math.nan
    x, y = np.array([p[0] for p in pts]), np.array([p[1] for p in pts], float)
    return float(np.polyfit(x, y, 1)[0] * 3600.0)


# --------------------------------------------------------------------------- the run


@dataclass
class Outcome:
    published: int = 0
    expected: int = 0
    got: int = 0
    duplicates: int = 0
    missing: int = 0
    unexpected: int = 0
    settled: int = 0
    not_settled: list[str] = field(default_factory=list)
    moving_positions: int = 0
    wall_s: float = 0.0
    late_s: float = 0.0  # publishing behind its pace at the end


async def publish_segments(args: argparse.Namespace, conn: ConnectionSettings, gw: tn.Gateway, walk: wl.Walk,
                           ref: Reference, out: Outcome, status: list[str], t0: float,
                           stop: asyncio.Event) -> None:
    round_s = args.objects / args.rate
    rounds_per_segment = max(1, int(SEGMENT_S / round_s))
    end = t0 + args.minutes * 60.0
    r = 0
    checking: asyncio.Task[int] | None = None
    next_ts = 0.0  # a segment's rounds come after the previous one's: an object's ts only grow
    while time.perf_counter() < end and not stop.is_set():
        count = min(rounds_per_segment, max(1, int((end - time.perf_counter()) / round_s)))
        started = time.perf_counter()
        base = max(time.time(), next_ts)
        st = walk.rounds(base + np.arange(count) * round_s)
        next_ts = base + count * round_s
        if checking is not None:
            out.expected += await checking
        checking = asyncio.create_task(asyncio.to_thread(ref.feed, st))
        bodies = bm.gateway_bodies(st, BATCH)
        done = [0]
        status[0] = f"segment of {len(st):,} updates"
        await bm.publish_gateway(conn, bodies, np.zeros(len(st)), args.rate, confirmed=done, gateway=gw)
        out.published += done[0]
        # publish_gateway paces the start of each message: the segment's last message's share
        # of the rate is waited here, else short segments (the end of a run, small runs) go
        # out at full speed, ahead of their timestamps
        left = len(st) / args.rate - (time.perf_counter() - started)
        with contextlib.suppress(TimeoutError):  # pacing the load, not synchronising
            await asyncio.wait_for(stop.wait(), max(0.0, left))
        r += count
        el = time.perf_counter() - t0
        status[0] = (f"{el / 60:.1f}/{args.minutes:g} min, {out.published:,} updates "
                     f"({out.published / el:,.0f}/s)")
    if checking is not None:
        out.expected += await checking


async def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    conn = load_connection_settings(settings)
    stack = mf.Stack(settings, conn)
    run_id = uuid.uuid4().hex[:6]
    prefix = f"s{run_id}-"
    fences = [dataclasses.replace(f, fence_id=tn.qualified(f"{prefix}{f.fence_id}"))
              for f in wl.make_fences(args.fences, args.seed)]
    walk = wl.Walk(args.objects, args.seed, [f"{prefix}o{i:06d}" for i in range(args.objects)])
    ref = Reference(fences, args.objects)
    rng = np.random.default_rng(args.seed)
    fleet = mf.Fleet.make(args.moving, rng)
    out = Outcome()
    samples = Samples()
    status = ["fences in"]
    progress = report.Progress(f"soak {args.minutes:g} min", clock=True)
    ticker = asyncio.create_task(report.every(1.0, lambda: progress.show(status[0])))
    sink = BatchSink(conn["amqp"][t.FENCES_VHOST], prefix)
    pg = await routing_store.connect(stack.dsn)
    cars: mf.Cars | None = None
    stop = asyncio.Event()  # SIGINT / SIGTERM: publishing ends early, the check and clean-up run
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    try:
        await tn.ensure_tenant(pg)
        async with tn.run_gateway(settings=settings) as gw, stack.manager() as m:
            await mf.remove_leftovers(pg, m)
            left = [r["id"] for r in await pg.fetch(
                "SELECT id FROM fence WHERE deleted_at IS NULL AND coalesce(owner, '') = '' AND id ~ $1",
                LEFTOVER)]
            await bm.remove_stored(m, left)  # an earlier soak's, killed before its clean-up
            await bm.put_fences(conn, fences)
            await mf.bounded(8, [functools.partial(m.put, fleet.spec(i)) for i in range(args.moving)])
            await m.applied(timeout=mf.APPLIED_TIMEOUT_S)
            await sink.start()
            status[0] = "waiting for the pipeline to be idle"
            await bm.wait_idle()
            cars = mf.Cars(stack, fleet, rng) if args.moving else None
            car_task = asyncio.create_task(cars.run()) if cars else None
            t0 = time.perf_counter()

            async def sampler() -> None:
                while True:
                    samples.take(stack, t0)
                    await asyncio.sleep(args.sample_s)  # a sampling period, not synchronising

            sampling = asyncio.create_task(sampler())
            try:
                await publish_segments(args, conn, gw, walk, ref, out, status, t0, stop)
            finally:
                out.wall_s = time.perf_counter() - t0
                if cars is not None and car_task is not None:
                    cars.stop.set()
                    await car_task
                    out.moving_positions = cars.confirmed
            # the events: every expected one, within the deadline
            want = np.unique(np.frombuffer(ref.digests.tobytes(), np.int64))
            deadline = time.perf_counter() + SETTLE_DEADLINE_S
            while time.perf_counter() < deadline:
                got = np.unique(np.frombuffer(sink.digests.tobytes(), np.int64))  # a copy: it grows
                status[0] = f"events: {got.size:,} of {want.size:,}"
                if got.size >= want.size:
                    break
                await asyncio.sleep(1.0)  # polling the sink with a deadline
            out.late_s = time.perf_counter() - t0 - out.wall_s
            sampling.cancel()
            samples.take(stack, t0)
            all_got = np.frombuffer(sink.digests.tobytes(), np.int64)
            got = np.unique(all_got)
            out.expected, out.got = int(want.size), int(got.size)
            out.duplicates = int(all_got.size - got.size)
            out.missing = int(np.setdiff1d(want, got).size)
            out.unexpected = int(np.setdiff1d(got, want).size)
            if cars is not None:
                rows = await mf.live_rows(pg, fleet.ids)
                for i, fid in enumerate(fleet.ids):
                    r = rows.get(fid)
                    if r is not None and r["follow_ts"] is not None and r["follow_ts"] >= cars.last_ts[i]:
                        out.settled += 1
                    else:
                        out.not_settled.append(fid)
            # leave nothing behind: the objects parked outside the box, the fences removed
            status[0] = "cleanup"
            with contextlib.suppress(Exception):  # every position of the run is older than now
                await bm.park(conn, wl.Stream(walk.ids, np.arange(args.objects, dtype=np.int32),
                                              np.zeros(args.objects), np.zeros(args.objects),
                                              np.full(args.objects, time.time())), BATCH, gw)
            await bm.remove_stored(m, [f.fence_id for f in fences])
            await bm.remove_stored(m, fleet.ids, owner=mf.OWNER)
    finally:
        ticker.cancel()
        progress.close()
        await sink.close()
        await pg.close()
    return figures(args, out, samples)


def figures(args: argparse.Namespace, out: Outcome, samples: Samples) -> int:
    warm = args.warmup_min * 60.0
    rows = []
    for name in sorted(samples.memory):
        pts = samples.memory[name]
        after = [k for s, k in pts if s >= warm] or [pts[-1][1]]
        g = growth_per_hour(pts, warm)
        rows.append([name, f"{after[0] / 1024:,.1f}", f"{pts[-1][1] / 1024:,.1f}",
                     f"{g / 1024:+,.1f}" if not math.isnan(g) else "-", f"{len(pts)}"])
    print()
    print(report.table(["process", "memory after warm-up (MiB)", "at the end (MiB)", "growth (MiB/h)",
                        "samples"], rows))
    rate = out.published / out.wall_s if out.wall_s else 0.0
    print(f"\nfleet: {out.published:,} updates in {out.wall_s / 60:.1f} min ({rate:,.0f}/s, asked "
          f"{args.rate:,.0f}/s); moving fences: {args.moving} following cars, {out.moving_positions:,} "
          f"car positions")
    print(f"events: {out.expected:,} expected, {out.got:,} received ({out.duplicates:,} duplicates "
          f"dropped), {out.missing:,} missing, {out.unexpected:,} unexpected; the last arrived "
          f"{out.late_s:.1f} s after the last publish")
    if args.moving:
        print(f"moving fences on their car's last position: {out.settled}/{args.moving}")
    ok = out.missing == 0 and out.unexpected == 0 and not out.not_settled
    worst = max(((growth_per_hour(p, warm), n) for n, p in samples.memory.items()
                 if not math.isnan(growth_per_hour(p, warm))), default=(math.nan, "-"))
    print(report.summary([f"{out.wall_s / 60:.1f} min at {rate:,.0f} updates/s",
                          f"events {'match' if out.missing == 0 and out.unexpected == 0 else 'DIFFER'}",
                          f"largest growth {worst[0] / 1024:+,.1f} MiB/h ({worst[1]})"],
                         "OK" if ok else "FAILED", "soak"))
    return 0 if ok else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--rate", type=float, default=RATE, help=f"fleet updates/s ({RATE:,.0f})")
    p.add_argument("--fences", type=int, default=1_000)
    p.add_argument("--objects", type=int, default=10_000)
    p.add_argument("--moving", type=int, default=100, help="fences following cars (100)")
    p.add_argument("--sample-s", type=float, default=60.0, help="memory sampling period (60 s)")
    p.add_argument("--warmup-min", type=float, default=2.0,
                   help="minutes before the memory growth is measured (2)")
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
