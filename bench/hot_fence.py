"""A hot fence (issue 21, seed 001's "N masters"): one fence that most objects are in, judged
by 1, 2 and 3 workers, each master for its own share of the objects.

    python -m bench.hot_fence [--objects 20000] [--updates 200000] [--fences 1000] [--workers 3]
        [--masters 1,2,3] [--batch 5000] [--seed 1]

The routing cores in one process (x-ingress, one x-geo per region, one x-fence per worker:
bench.workload.CorePipeline, no broker), the same stream each time: objects walking in a
20 km box with F ordinary fences and a "stadium", a circle over the middle of the box that
about a third of the positions are in. Per number of masters: the seconds each worker spent
(on their own machines the workers run in parallel, so the busiest one bounds the rate:
updates / its seconds), x-geo's seconds (it routes a hot fence per object), the stadium's
occupants on each worker at the end, and the events against shapely (identical each time, or
the run says so). The figures never fail the run; different events do (exit 1).

Trade-off measured: a hot fence costs x-geo a per-object lookup (each object's walk of the
ring, cached) for each of its candidates, and buys a worker load that no longer piles on one
master.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: again as a module of bench
    import cli  # type: ignore[import-not-found]  # bench/cli.py, in this file's own folder

    cli.run_as_module(__file__)

import argparse
import sys
import time
from dataclasses import dataclass

import numpy as np

import hilbert_c as hk
from bench import report
from bench import workload as wl

STADIUM = "stadium"


@dataclass
class Run:
    masters: int
    per_worker: dict[str, float]
    geo_s: float
    occupants: dict[str, int]
    events: int
    exact: bool
    wall_s: float

    @property
    def busiest_s(self) -> float:
        return max(self.per_worker.values())


def stadium(box: wl.Box) -> wl.Fence:
    """A circle over the middle of the box (a third of its side across)."""
    lon, lat = box.to_lonlat(np.array([box.side_m / 2]), np.array([box.side_m / 2]))
    r = box.side_m / 3
    return wl.Fence(STADIUM, float(lon[0]), float(lat[0]), r, hk.circle(float(lon[0]), float(lat[0]), r,
                                                                       wl.VERTICES))


def one(masters: int, workers: list[str], fences: list[wl.Fence], stream: wl.Stream,
        reference: list[wl.EventTuple], batch: int) -> Run:
    pipe = wl.CorePipeline(workers=workers, hot={STADIUM: masters})
    pipe.define(fences)
    events = []
    t0 = time.perf_counter()
    bar = report.Progress(f"{masters} master(s)", len(stream))
    for chunk in stream.chunks(batch):
        events += pipe.feed(chunk.batch())
        bar.update(chunk.start + len(chunk.ids))
    bar.close()
    wall = time.perf_counter() - t0
    diff = wl.compare(wl.as_tuples(events), reference)
    if diff:
        report.warn(f"{masters} master(s): events differ from shapely: " + "; ".join(diff[:4]))
    occupants = {w: len(x.occupants(STADIUM)) if x.fence(STADIUM) is not None else 0
                 for w, x in pipe.fence.items()}
    return Run(masters, dict(pipe.times.per_worker), pipe.times.geo, occupants, len(events), not diff, wall)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.hot_fence", description=__doc__.split("\n\n")[0])
    p.add_argument("--objects", type=int, default=20_000)
    p.add_argument("--updates", type=int, default=200_000)
    p.add_argument("--fences", type=int, default=1_000, help="ordinary fences beside the stadium")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--masters", default="1,2,3", help="the stadium's numbers of masters to measure")
    p.add_argument("--batch", type=int, default=5_000)
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workers = [f"w{i}" for i in range(args.workers)]
    fences = [*wl.make_fences(args.fences, args.seed), stadium(wl.DEFAULT_BOX)]
    stream = wl.random_walk(args.objects, args.updates, args.seed)
    print(f"reference: {len(fences):,} fences, {len(stream):,} updates of {args.objects:,} objects (shapely)",
          flush=True)
    reference = wl.reference_events(fences, stream)
    in_stadium = sum(1 for e in reference if e[1] == STADIUM)
    print(f"{len(reference):,} events, {in_stadium:,} of them the stadium's", flush=True)
    runs = [one(int(m), workers, fences, stream, reference, args.batch) for m in args.masters.split(",")]
    base = runs[0]
    rows = []
    for r in runs:
        rows.append([str(r.masters), *(f"{r.per_worker[w]:.2f}" for w in workers),
                     f"{len(stream) / r.busiest_s:,.0f}", report.times(report.ratio(
                         len(stream) / r.busiest_s, len(stream) / base.busiest_s), f"{base.masters} master"),
                     f"{r.geo_s:.2f}", " / ".join(f"{r.occupants[w]:,}" for w in workers),
                     "yes" if r.exact else "NO"])
    print()
    print(report.table(["masters", *(f"{w} s" for w in workers), "updates/s (busiest worker)", "vs",
                        "x-geo s", "stadium occupants per worker", "exact"], rows))
    ok = all(r.exact for r in runs)
    parts = [f"{r.masters} master(s): busiest worker {r.busiest_s:.2f} s = {len(stream) / r.busiest_s:,.0f} "
             f"updates/s, x-geo {r.geo_s:.2f} s" for r in runs]
    print(report.summary(parts, "OK" if ok else "with differences",
                         f"hot fence, {len(stream):,} updates, {args.workers} workers"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
