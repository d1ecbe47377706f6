"""Scaling out and in (issue 21): the pipeline with 1, 2 and 3 regions and workers, and the
live operations that get it there.

    python -m bench.scale [--shapes 1,2,3] [--fences 1000] [--objects 10000] [--updates 100000]
        [--rate 2000] [--ops-fences 1000,10000] [--ops-rate 1500] [--skip-shapes] [--skip-ops]

1. Shapes: the stack is brought to k regions and k workers with the live commands themselves
   (`region add / remove`, `worker add / remove`), then the amqp benchmark runs at its max
   rate (updates/s) and paced at --rate (latency p50 / p99, device to event), events checked
   against shapely each time.
2. Operations: with F fences bound (each of --ops-fences) and a stream paced at --ops-rate,
   a region is added and removed, a worker added and removed, and the ten busiest fences
   made hot (two masters each, `geofence worker hot`) and back while it flows; per
   operation its duration, what moved, how long x-ingress was paused (workers), and the
   events that arrived during it; at the end, the run's events against shapely.

The stack ends as it began: the regions and workers it had, the first two regions' boundary
where it was (a region that was removed comes back at its old interval start).

Trade-off: this machine has two cores shared by every process, so more regions and workers
are more processes on the same cores: the point is the shape (what a hop and a process cost),
not linear growth. On machines of their own, each region and each worker adds its core.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: again as a module of bench
    import cli  # type: ignore[import-not-found]  # bench/cli.py, in this file's own folder

    cli.run_as_module(__file__)

import argparse
import asyncio
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bench import broker_modes as bm
from bench import e2e, report
from bench import tenant as tn
from bench import workload as wl
from deploy import region_ops, worker_ops
from deploy.settings import Secrets, Settings, load_secrets, postgres_dsn
from exchanges import routing_store
from exchanges.worldmap import Worldmap

HOT = 10  # fences made hot during the operations
REGIONS = ("a", "b", "c")
WORKERS = ("w0", "w1", "w2")


def say(text: str) -> None:
    print(f"  {text}", flush=True)


def quiet(text: str) -> None:
    """The operations' step-by-step lines (rabbitmqctl plans): kept out of the report."""


# --------------------------------------------------------------------------- the stack's shape


@dataclass
class Shape:
    settings: Settings
    pw: Secrets
    first: Worldmap  # the map at the start (its first boundary is put back)

    async def regions(self) -> tuple[str, ...]:
        wm = await routing_store.read_worldmap(postgres_dsn(self.settings, self.pw.postgres_password))
        assert wm is not None
        return wm.regions

    async def to(self, k: int) -> None:
        """k regions (a, b, c) and k workers (w0, w1, w2), live."""
        for name in reversed(REGIONS[k:]):
            if name in await self.regions():
                line = (await region_ops.remove(self.settings, self.pw, name, "a", quiet)).line()
                say(line)
        for name in REGIONS[1:k]:
            if name not in await self.regions():
                at = self._start_of(name)
                line = (await region_ops.add(self.settings, self.pw, name, "a", at, quiet)).line()
                say(line)
        _, ring, _ = await worker_ops.current_ring(region_ops.live(self.settings), self.pw)
        for name in reversed(WORKERS[k:]):
            if name in ring.nodes:
                say((await worker_ops.remove(self.settings, self.pw, name, quiet)).line())
        for name in WORKERS[:k]:
            if name not in ring.nodes:
                say((await worker_ops.add(self.settings, self.pw, name, 1, quiet)).line())

    def _start_of(self, region: str) -> int | None:
        """Where `region` began in the first map (None: not there, a balanced split)."""
        if region not in self.first.regions:
            return None
        spans = self.first.intervals(region)
        return int(spans[0][0]) if len(spans) and int(spans[0][0]) > 0 else None


# --------------------------------------------------------------------------- 1. shapes


@dataclass
class ShapeRun:
    k: int
    max_rate: e2e.Outcome
    paced: e2e.Outcome


def run_shape(args: argparse.Namespace, w: e2e.Workloads, k: int) -> ShapeRun:
    z = e2e.Sizes(args.fences, args.objects, args.updates, 1_000)
    ns = argparse.Namespace(clients=1, no_idle_wait=False, no_park=False)
    fast = e2e.run_broker(ns, w, z, "amqp", f"{k} regions, {k} workers, max")
    paced = e2e.run_broker(ns, w, e2e.Sizes(args.fences, args.objects, args.updates // 4, 1_000), "amqp",
                           f"{k} regions, {k} workers, at {args.rate:,.0f}/s", rate=args.rate)
    return ShapeRun(k, fast, paced)


# --------------------------------------------------------------------------- 2. operations


@dataclass
class Op:
    name: str
    started: float  # time.time()
    ended: float
    line: str
    paused_s: float | None = None
    events_during: int = 0
    worst_ms: float = 0.0


@dataclass
class OpsRun:
    fences: int
    ops: list[Op] = field(default_factory=list)
    ok: bool = False
    events: int = 0
    error: str = ""


async def run_ops(args: argparse.Namespace, w: e2e.Workloads, f: int, settings: Settings, pw: Secrets
                  ) -> OpsRun:
    out = OpsRun(f)
    fences, stream = w.fence_set(f), w.stream(args.objects, args.ops_updates)
    reference, _ = w.reference(f, args.objects, args.ops_updates)
    publishing = asyncio.Event()

    def progress(phase: str, done: int, total: int) -> None:
        if phase == "publish":
            publishing.set()

    run_id = uuid.uuid4().hex[:6]
    run = asyncio.create_task(bm.run("amqp", fences, stream, reference, 500, args.ops_rate, say=quiet,
                                     progress=progress, run_id=run_id))
    try:
        await asyncio.wait_for(publishing.wait(), 900)
        await asyncio.sleep(2.0)  # the stream under way (a pause in the benchmark, not a synchronisation)

        async def timed(name: str, coro: Any) -> None:
            t0 = time.time()
            o = await coro
            op = Op(name, t0, time.time(), o.line())
            if isinstance(o, worker_ops.Outcome):
                op.paused_s = o.paused_s
            out.ops.append(op)
            say(op.line)

        await timed("region add c", region_ops.add(settings, pw, "c", "a", None, quiet))
        await timed("region remove c", region_ops.remove(settings, pw, "c", "a", quiet))
        await timed("worker add w2", worker_ops.add(settings, pw, "w2", 1, quiet))
        await timed("worker remove w2", worker_ops.remove(settings, pw, "w2", quiet))
        # the run's ids, qualified as stored (bench/broker_modes.py renamed, bench/tenant.py)
        hot = [tn.qualified(f"{bm.run_prefix(run_id)}{f}")
               for f, _ in Counter(e[1] for e in reference).most_common(HOT)]
        await timed(f"{len(hot)} busiest fences hot (2 masters)", worker_ops.hot(settings, pw, hot, 2, quiet))
        await timed(f"the {len(hot)} back to 1 master", worker_ops.hot(settings, pw, hot, 1, quiet))
        r = await run
    except Exception as exc:
        out.error = report.error_text(exc)
        run.cancel()
        return out
    diff = wl.compare(r.events, r.reference)
    out.ok, out.events = not diff, len(r.events)
    if diff:
        report.warn("events differ from shapely: " + "; ".join(diff[:4]))
    for op in out.ops:
        inside = (r.arrivals >= op.started) & (r.arrivals <= op.ended)
        op.events_during = int(inside.sum())
        if r.latency_ms.size == r.arrivals.size and inside.any():
            op.worst_ms = float(r.latency_ms[inside].max())
    return out


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="1,2,3", help="numbers of regions = workers to measure")
    p.add_argument("--fences", type=int, default=1_000)
    p.add_argument("--objects", type=int, default=10_000)
    p.add_argument("--updates", type=int, default=100_000)
    p.add_argument("--rate", type=float, default=2_000.0, help="the paced run's updates/s (latency)")
    p.add_argument("--ops-fences", default="1000,10000", help="fences bound during the operations")
    p.add_argument("--ops-rate", type=float, default=1_500.0)
    p.add_argument("--ops-updates", type=int, default=90_000, help="the operations' stream (~60 s)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--skip-shapes", action="store_true")
    p.add_argument("--skip-ops", action="store_true")
    return p.parse_args(argv)


async def amain(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    pw = load_secrets(settings)
    first = await routing_store.read_worldmap(postgres_dsn(settings, pw.postgres_password))
    assert first is not None, "no worldmap: run `geofence up`"
    shape = Shape(settings, pw, first)
    start_k = len(first.regions)
    _, ring, _ = await worker_ops.current_ring(region_ops.live(settings), pw)
    if list(first.regions) != list(REGIONS[:start_k]) or list(ring.nodes) != list(WORKERS[:len(ring.nodes)]) \
            or len(ring.nodes) != start_k:
        print(f"bench.scale expects regions a.. and workers w0.. in equal numbers; the stack has "
              f"{', '.join(first.regions)} and {', '.join(ring.nodes)}", file=sys.stderr)
        return 2
    w = e2e.Workloads(args.seed)
    shapes: list[ShapeRun] = []
    opsruns: list[OpsRun] = []
    try:
        if not args.skip_shapes:
            for k in (int(x) for x in args.shapes.split(",")):
                print(f"shape: {k} region(s), {k} worker(s)", flush=True)
                await shape.to(k)
                shapes.append(await asyncio.to_thread(run_shape, args, w, k))
        if not args.skip_ops:
            await shape.to(start_k)
            for f in (int(x) for x in args.ops_fences.split(",")):
                print(f"operations with {f:,} fences bound, a stream at {args.ops_rate:,.0f}/s", flush=True)
                opsruns.append(await run_ops(args, w, f, settings, pw))
    finally:
        print(f"back to {start_k} region(s), {start_k} worker(s)", flush=True)
        await shape.to(start_k)

    lines = []
    if shapes:
        rows = [[f"{s.k} / {s.k}", f"{s.max_rate.updates_per_s:,.0f}", "yes" if s.max_rate.ok else "NO",
                 f"{s.paced.p50:.0f}", f"{s.paced.p99:.0f}", "yes" if s.paced.ok else "NO"] for s in shapes]
        print()
        print(report.table(["regions / workers", "updates/s (max)", "exact", f"p50 ms at {args.rate:,.0f}/s",
                            "p99 ms", "exact"], rows))
        base = shapes[0].max_rate.updates_per_s or 1.0
        lines.append("shapes: " + ", ".join(
            f"{s.k}x{s.k} {s.max_rate.updates_per_s:,.0f}/s ({s.max_rate.updates_per_s / base:.2f}x), "
            f"p99 {s.paced.p99:.0f} ms" for s in shapes))
    for o in opsruns:
        print()
        print(f"operations with {o.fences:,} fences bound ({o.events:,} events, "
              f"{'identical to shapely' if o.ok else 'NOT identical: ' + o.error})")
        header = ["operation", "seconds", "x-ingress paused s", "events during", "worst latency ms"]
        print(report.table(header,
                           [[op.name, f"{op.ended - op.started:.1f}",
                             "-" if op.paused_s is None else f"{op.paused_s:.1f}", f"{op.events_during:,}",
                             f"{op.worst_ms:,.0f}"] for op in o.ops]))
        took = ", ".join(f"{op.name} {op.ended - op.started:.1f} s" for op in o.ops)
        lines.append(f"F={o.fences:,}: {took}; events {'exact' if o.ok else 'DIFFER'}")
    ok = all(s.max_rate.ok and s.paced.ok for s in shapes) and all(o.ok for o in opsruns)
    print(report.summary_block("scale " + ("OK" if ok else "with differences"), lines))
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(amain(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
