"""End-to-end benchmark of the fleet-over-fences workload (see bench/workload.py).

    .venv/bin/python bench/e2e.py --mode core [--fences 1000,10000] [--objects 10000]
        [--updates 200000] [--batch 10000] [--seed 1] [--profile]

Modes (one function each, `MODES`):
- core: the routing cores in one process, no broker (x-ingress -> x-geo per region -> x-fence
  per worker): the ceiling of the platform.

Every mode prints updates/s, events/s and where the time went, then checks the events
against the shapely STRtree reference on the same stream (identical multisets, or exit 1).
Figures, not tests: the machine is shared, run twice before believing a difference.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workload as wl

TARGETS = {"core": 500_000}  # updates/s, core-only at F=1,000 (the figure)


@dataclass
class Result:
    mode: str
    fences: int
    updates: int
    setup_s: float
    stream_s: float
    events: list[wl.EventTuple]
    steady_s: float = 0.0  # stream time after the first round (every object seen once)
    cpu_s: float = 0.0  # this process's CPU time over the stream: well below stream_s = contention
    steady_updates: int = 0
    stages: dict[str, float] = field(default_factory=dict)  # seconds per stage
    notes: list[str] = field(default_factory=list)
    profile: str = ""

    @property
    def updates_per_s(self) -> float:
        return self.updates / self.stream_s if self.stream_s else 0.0

    @property
    def steady_per_s(self) -> float:
        return self.steady_updates / self.steady_s if self.steady_s else 0.0

    @property
    def events_per_s(self) -> float:
        return len(self.events) / self.stream_s if self.stream_s else 0.0


class Progress:
    """One stderr line, rewritten at most every half second."""

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total = label, total
        self.t0 = self.shown = time.perf_counter()

    def update(self, done: int) -> None:
        now = time.perf_counter()
        if now - self.shown < 0.5 and done < self.total:
            return
        self.shown = now
        rate = done / (now - self.t0) if now > self.t0 else 0.0
        print(f"\r  {self.label}: {done:,}/{self.total:,} updates, {rate:,.0f}/s   ",
              end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        print("\r" + " " * 79 + "\r", end="", file=sys.stderr, flush=True)


def run_core(args: argparse.Namespace, fences: list[wl.Fence], stream: wl.Stream) -> Result:
    """x-ingress -> x-geo per region -> x-fence per worker, in this process."""
    t = time.perf_counter()
    pipe = wl.CorePipeline()
    pipe.define(fences, max_ranges=args.max_ranges, cells_per_radius=args.cells_per_radius)
    batches = [c.batch() for c in stream.chunks(args.batch)]  # the source is not measured
    setup_s = time.perf_counter() - t

    progress = Progress(f"core F={len(fences):,}", len(stream))
    received: list[wl.EventTuple] = []
    profiler = cProfile.Profile() if args.profile else None
    done, steady_s, steady_updates = 0, 0.0, 0
    t, cpu = time.perf_counter(), time.process_time()
    if profiler:
        profiler.enable()
    for b in batches:
        tb = time.perf_counter()
        # the receiver keeps what the check needs; the Event objects go, as after a publish
        received += wl.as_tuples(pipe.feed(b))
        if done >= len(stream.object_ids):
            steady_s += time.perf_counter() - tb
            steady_updates += len(b)
        done += len(b)
        progress.update(done)
    if profiler:
        profiler.disable()
    stream_s, cpu_s = time.perf_counter() - t, time.process_time() - cpu
    progress.close()

    times = pipe.times
    workers = ", ".join(f"{w} {s / max(len(stream), 1) * 1e6:.2f}" for w, s in times.per_worker.items())
    return Result(
        "core", len(fences), len(stream), setup_s, stream_s, received,
        steady_s=steady_s, steady_updates=steady_updates, cpu_s=cpu_s,
        stages={"ingress": times.ingress, "geo": times.geo, "fence": times.fence},
        notes=[f"x-fence per worker (us/update): {workers}",
               f"inside pairs at the end: {pipe.inside_pairs():,}",
               f"regions {list(pipe.worldmap.regions)}, workers {list(pipe.fence)}, batch {args.batch:,}"],
        profile=top_functions(profiler) if profiler else "",
    )


MODES: dict[str, Callable[[argparse.Namespace, list[wl.Fence], wl.Stream], Result]] = {
    "core": run_core,
}


def top_functions(profiler: cProfile.Profile, n: int = 20) -> str:
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(n)
    return out.getvalue()


def check(result: Result, reference: list[wl.EventTuple]) -> list[str]:
    return wl.compare(result.events, reference)


def report(results: list[Result], checks: list[list[str]], ref_s: list[float]) -> None:
    """The figures side by side, one column per fence count."""
    cols = [f"F={r.fences:,}" for r in results]
    rows: list[tuple[str, list[str]]] = [
        ("updates", [f"{r.updates:,}" for r in results]),
        ("setup (s)", [f"{r.setup_s:.1f}" for r in results]),
        ("stream (s)", [f"{r.stream_s:.2f}" for r in results]),
        ("  cpu (s)", [f"{r.cpu_s:.2f}" for r in results]),
        ("updates/s", [f"{r.updates_per_s:,.0f}" for r in results]),
        ("  after round 1", [f"{r.steady_per_s:,.0f}" for r in results]),
        ("events", [f"{len(r.events):,}" for r in results]),
        ("events/s", [f"{r.events_per_s:,.0f}" for r in results]),
    ]
    for stage in results[0].stages:
        rows.append((f"{stage} (us/update)",
                     [f"{r.stages[stage] / max(r.updates, 1) * 1e6:.2f}" for r in results]))
    rows.append(("reference (s)", [f"{s:.1f}" for s in ref_s]))
    rows.append(("events match", ["yes" if not c else "NO" for c in checks]))
    width = max(len(name) for name, _ in rows)
    print(f"{'':{width}}  " + "  ".join(f"{c:>14}" for c in cols))
    for name, values in rows:
        print(f"{name:{width}}  " + "  ".join(f"{v:>14}" for v in values))
    for r in results:
        for note in r.notes:
            print(f"  F={r.fences:,}: {note}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=sorted(MODES), default="core")
    p.add_argument("--fences", default="1000,10000",
                   help="fence counts, comma-separated: each is a run on the same stream")
    p.add_argument("--objects", type=int, default=10_000)
    p.add_argument("--updates", type=int, default=200_000)
    p.add_argument("--batch", type=int, default=10_000, help="updates per intake batch")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-ranges", type=int, default=wl.MAX_RANGES, help="per fence covering")
    p.add_argument("--cells-per-radius", type=float, default=wl.CELLS_PER_RADIUS,
                   help="covering resolution: the cell side is about radius / this")
    p.add_argument("--profile", action="store_true", help="cProfile the stream: top 20 functions")
    args = p.parse_args(argv)
    try:
        args.fence_counts = [int(f) for f in args.fences.split(",") if f.strip()]
    except ValueError:
        p.error(f"--fences takes comma-separated integers, got {args.fences!r}")
    if not args.fence_counts or min(args.fence_counts) < 1:
        p.error("--fences needs at least one positive count")
    if args.objects < 1 or args.updates < 1 or args.batch < 1:
        p.error("--objects, --updates and --batch must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = MODES[args.mode]
    stream = wl.random_walk(args.objects, args.updates, args.seed)
    print(f"mode {args.mode}: N={args.objects:,} objects, U={args.updates:,} updates, "
          f"batch {args.batch:,}, seed {args.seed}; fences {args.fences}")
    results, checks, ref_s = [], [], []
    for n in args.fence_counts:
        fences = wl.make_fences(n, args.seed)
        result = run(args, fences, stream)
        t = time.perf_counter()
        reference = wl.reference_events(fences, stream)
        ref_s.append(time.perf_counter() - t)
        results.append(result)
        checks.append(check(result, reference))
        if result.profile:
            print(f"-- profile F={n:,} (top 20 by own time) --\n{result.profile}")
    report(results, checks, ref_s)
    ok = True
    for r, diff in zip(results, checks, strict=True):
        if diff:
            ok = False
            print(f"F={r.fences:,}: events DIFFER from the shapely reference:")
            print("\n".join(diff))
        else:
            print(f"F={r.fences:,}: events match the shapely reference: {len(r.events):,} events")
    summary = "; ".join(f"F={r.fences:,} {r.updates_per_s:,.0f} updates/s ({r.events_per_s:,.0f} events/s)"
                        for r in results)
    target = TARGETS.get(args.mode)
    print(f"{args.mode}: {summary}; reference {'match' if ok else 'MISMATCH'}"
          + (f"; target {target:,} updates/s at F=1,000" if target else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
