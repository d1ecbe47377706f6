"""The nightly PySpark jobs at scale, on this machine (local[2] by default).

    .venv/bin/python -m bench.spark_jobs [--fences 100000] [--events 10000000] [--master local[2]]
                                         [--only bindings|analytics] [--seed 1]

1. rebuild-bindings over F generated fences (circles of 30 m to 3 km, 64 vertices, and
   rectangles, spread over the local stack's area): the job reads them over JDBC from a
   schema of their own (`bench_spark`, a copy of the live tables' structure, its checks too: the
   ids qualified, `bench:bench-fNNNNNNN`, the benchmarks' tenant's), covers every
   one with the C kernel in the executors, stores the coverings (fence_binding), cuts them by
   the worldmap, diffs against fence_range (empty there: every binding is an 'add') and writes
   the diff; `--dry-run` (nothing live changes) and `--resplit never`, then again with the
   re-split steps computed. Figures: wall time of the job (Spark session excluded) and of its
   covering step, fences/s.
2. occupancy-analytics over E generated events (bench/spark_occupancy_part.py): wall time
   and events/s.

Targets (issue 6): bindings >= 5,000 fences/s, analytics >= 500,000 events/s. The ratio is
the figure over the target. Each job's rate is over its own time, Spark's start (a fixed few
seconds, whatever the data) apart; the line below it gives the rate with the start counted.
The bindings job runs twice in one session: the first run is what a nightly run pays (a
fresh JVM), the second shows the warm figure. The generated data stays in `bench_spark` (dropped and rebuilt
at each run); nothing live is touched. Spark prints its stage progress bars on a terminal.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: again as a module of bench
    import cli  # type: ignore[import-not-found]  # bench/cli.py, in this file's own folder

    cli.run_as_module(__file__)

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

import asyncpg
import numpy as np

from bench import report
from bench.tenant import qualified
from deploy.spark_cmd import job_config
from exchanges.worldmap import AREA
from spark_jobs import rebuild_bindings
from spark_jobs.session import JobConfig, clone_schema, spark_session

SCHEMA = "bench_spark"
TABLES = ("fence", "fence_range", "fence_binding", "fence_binding_run", "fence_binding_diff")
TARGET_FENCES_S = 5_000.0
TARGET_EVENTS_S = 500_000.0


def fence_rows(n: int, seed: int) -> list[tuple[Any, ...]]:
    """n fences as fence-table rows: 80% circles (30 m - 3 km, log-uniform), 20% rectangles."""
    rng = np.random.default_rng(seed)
    x0, y0, x1, y1 = AREA
    lon = rng.uniform(x0, x1, n)
    lat = rng.uniform(y0, y1, n)
    radius = np.exp(rng.uniform(np.log(30.0), np.log(3000.0), n))
    circle = rng.random(n) < 0.8
    t = np.linspace(0.0, 2 * np.pi, 65)[:-1]
    rows = []
    for i in range(n):
        dlat = radius[i] / 111_320.0
        dlon = dlat / np.cos(np.radians(lat[i]))
        if circle[i]:
            xs, ys = lon[i] + dlon * np.cos(t), lat[i] + dlat * np.sin(t)
        else:
            w = rng.uniform(0.3, 1.0)
            xs = lon[i] + dlon * np.array([-1, 1, 1, -1])
            ys = lat[i] + w * dlat * np.array([-1, -1, 1, 1])
        ring = np.round(np.column_stack([xs, ys]), 7).tolist()
        ring.append(ring[0])
        geometry = json.dumps({"type": "Polygon", "coordinates": [ring]})
        rows.append((qualified(f"bench-f{i:07d}"), "", "bench", geometry, '{"timeout_s": 300}', 1,
                     float(min(xs)), float(min(ys)), float(max(xs)), float(max(ys))))
    return rows


async def load_fences(dsn: str, n: int, seed: int) -> float:
    t0 = time.perf_counter()
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        await clone_schema(conn, SCHEMA, TABLES)
        rows = fence_rows(n, seed)
        await conn.copy_records_to_table(
            "fence", schema_name=SCHEMA, records=rows,
            columns=["id", "name", "owner", "geometry", "options", "version", "min_lon", "min_lat",
                     "max_lon", "max_lat"])
        await conn.execute(f"ANALYZE {SCHEMA}.fence")
    finally:
        await conn.close()
    return time.perf_counter() - t0


def bench_bindings(cfg: JobConfig, fences: int, seed: int) -> list[dict[str, Any]]:
    print(f"bindings: generating {fences:,} fences into {SCHEMA}.fence ...", flush=True)
    load_s = asyncio.run(load_fences(cfg.postgres_url, fences, seed))
    print(f"bindings: {fences:,} fences stored in {load_s:.1f} s", flush=True)
    t0 = time.perf_counter()
    spark = spark_session(cfg, "geofence-bench-bindings")
    start_s = time.perf_counter() - t0
    results = []
    try:
        for resplit in ("never", "always"):
            args = SimpleNamespace(master=None, partitions=None, schema=SCHEMA, dry_run=True, resplit=resplit,
                                   max_imbalance=1.25, settle_timeout=0.0, quiet=False)
            t0 = time.perf_counter()
            job = rebuild_bindings.Job(cfg, args).run(spark)  # type: ignore[arg-type]
            wall = time.perf_counter() - t0
            print(job.line(), flush=True)
            results.append({"resplit": resplit, "fences": job.fences, "ranges": job.ranges,
                            "failed": job.failed, "wall_s": wall,
                            "cover_s": job.seconds.get("cover", 0.0), "diff_rows": job.diff_rows,
                            "imbalance": (job.imbalance_before, job.imbalance_after),
                            "start_s": start_s})
    finally:
        spark.stop()
    return results


def vs_target(rate: float, target: float, named: bool = False) -> str:
    """A rate against its target: "1.23x", named "1.23x target 5,000"."""
    return report.times(report.ratio(rate, target), f"target {target:,.0f}" if named else "")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fences", type=int, default=100_000)
    p.add_argument("--events", type=int, default=10_000_000)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--only", choices=("bindings", "analytics"))
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    title = f"spark_jobs ({a.master})"
    if a.only is None:  # each job in a fresh process: a fresh JVM, as a nightly run has
        summaries, rc = [], 0
        for part in ("bindings", "analytics"):
            args = [sys.executable, "-m", "bench.spark_jobs", "--only", part, "--fences", str(a.fences),
                    "--events", str(a.events), "--master", a.master, "--seed", str(a.seed)]
            done = subprocess.run(args, stdout=subprocess.PIPE, text=True, check=False)
            out = done.stdout.split(f"\nSUMMARY {title}:")
            print(out[0], flush=True)
            failed = [f"{part}: failed (exit {done.returncode})"]
            summaries += [x.removeprefix("  ") for x in out[1].splitlines()[1:]] if len(out) > 1 else failed
            rc = rc or done.returncode
        print("\n" + report.summary_block(title, summaries), flush=True)
        return rc
    cfg = job_config(master=a.master)  # the local stack's URLs unless GEOFENCE_*_URL are set
    print(f"bench: master {a.master}, {os.cpu_count()} cores, {cfg.masked()}", flush=True)
    lines = []
    ok = True
    if a.only in (None, "bindings"):
        for k, r in enumerate(bench_bindings(cfg, a.fences, a.seed)):
            rate = r["fences"] / r["wall_s"]
            before, after = r["imbalance"]
            run = "first run" if k == 0 else "second run, same session"
            lines.append(f"rebuild-bindings ({run}, re-split {r['resplit']}): {r['fences']:,} fences, "
                         f"{r['ranges']:,} ranges, {r['diff_rows']:,} diff rows: job {r['wall_s']:.1f} s = "
                         f"{rate:,.0f} fences/s ({vs_target(rate, TARGET_FENCES_S, named=True)}); "
                         f"covering step {r['cover_s']:.1f} s; imbalance {before:.3f} -> {after:.3f}")
            if k == 0:
                with_start = r["fences"] / (r["wall_s"] + r["start_s"])
                lines.append(f"  with Spark's start ({r['start_s']:.1f} s): {with_start:,.0f} fences/s "
                             f"({vs_target(with_start, TARGET_FENCES_S)})")
            ok &= r["failed"] == 0
    if a.only in (None, "analytics"):
        from bench.spark_occupancy_part import bench_occupancy, venue_line

        r = bench_occupancy(a.events, "bench_spark_occ", a.master)
        start_s = float(r["phases_s"].get("session", 0.0))
        job_s = r["wall_s"] - start_s
        rate = r["events"] / job_s
        with_start = r["events_per_s"]
        phases = ", ".join(f"{k} {v:.1f} s" for k, v in r["phases_s"].items()
                           if k not in ("session", "venues"))
        lines.append(f"occupancy-analytics: {r['events']:,} events over {r.get('days', '?')} days: job "
                     f"{job_s:.1f} s = {rate:,.0f} events/s "
                     f"({vs_target(rate, TARGET_EVENTS_S, named=True)}); phases {phases}")
        lines.append(f"  with Spark's start ({start_s:.1f} s): {with_start:,.0f} events/s "
                     f"({vs_target(with_start, TARGET_EVENTS_S)})")
        lines.append(venue_line(r))
    print("\n" + report.summary_block(title, lines), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
