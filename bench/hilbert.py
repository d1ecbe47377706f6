"""Hilbert kernel benchmark: batch and scalar encode/decode against `hilbertcurve` and a
numpy memory floor, and polygon coverings (a 5 km circle, the 11 Liechtenstein
municipalities (c) OpenStreetMap contributors) at 17/19/20/22 bits.

Figures, not tests: run `.venv/bin/python -m bench.hilbert`. Each timing is the best of
several repeats (the machine is shared); ratios compare figures taken in this one run.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: again as a module of bench
    import cli  # type: ignore[import-not-found]  # bench/cli.py, in this file's own folder

    cli.run_as_module(__file__)

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from hilbertcurve.hilbertcurve import HilbertCurve  # type: ignore[import-untyped]

import hilbert_c as hk
from bench import report
from deploy.demo.osm_extract import OSM_CREDIT, municipalities

TARGETS = {
    "batch encode ns/pt": 10.0,
    "batch decode ns/pt": 10.0,
    "scalar encode ns/call": 300.0,
    "circle 20b build ms": 20.0,
    "circle 20b area ratio": 1.02,
}


def best_ns(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t)
    return float(min(times))


def bench_curve(n: int, sample: int, repeats: int) -> dict[str, float]:
    rng = np.random.default_rng(2016)
    xs = rng.integers(0, 1 << 26, n, dtype=np.uint32)
    ys = rng.integers(0, 1 << 26, n, dtype=np.uint32)
    hs = hk.encode_many(xs, ys, 26)
    out = {}
    out["batch encode ns/pt"] = best_ns(lambda: hk.encode_many(xs, ys, 26), repeats) / n
    out["batch decode ns/pt"] = best_ns(lambda: hk.decode_many(hs, 26), repeats) / n
    a = rng.integers(0, 2**63, n, dtype=np.uint64)
    b = rng.integers(0, 2**63, n, dtype=np.uint64)
    c = np.empty_like(a)
    out["numpy xor floor ns/pt"] = best_ns(lambda: np.bitwise_xor(a, b, out=c), repeats) / n

    ref = HilbertCurve(p=26, n=2)
    pts = np.column_stack([xs[:sample], ys[:sample]]).tolist()
    t = time.perf_counter_ns()
    ref_h = ref.distances_from_points(pts)
    out["hilbertcurve encode ns/pt"] = (time.perf_counter_ns() - t) / sample
    t = time.perf_counter_ns()
    ref_p = ref.points_from_distances(ref_h)
    out["hilbertcurve decode ns/pt"] = (time.perf_counter_ns() - t) / sample
    if [int(v) for v in hs[:sample]] != ref_h or ref_p != pts:
        sys.exit("MISMATCH: the kernel disagrees with hilbertcurve")

    calls = 200_000
    sx, sy = [int(v) for v in xs[:calls]], [int(v) for v in ys[:calls]]
    enc = hk.encode

    def scalar() -> None:
        for x, y in zip(sx, sy, strict=True):
            enc(x, y, 26)

    out["scalar encode ns/call"] = best_ns(scalar, max(3, repeats // 2)) / calls
    dec = hk.decode
    sh = [int(v) for v in hs[:calls]]

    def scalar_dec() -> None:
        for h in sh:
            dec(h, 26)

    out["scalar decode ns/call"] = best_ns(scalar_dec, max(3, repeats // 2)) / calls
    return out


def bench_covering(repeats: int) -> list[dict[str, Any]]:
    shapes = [("circle r=5 km @47N", hk.circle(9.5, 47.0, 5000.0, vertices=128))]
    shapes += list(municipalities().items())
    rows: list[dict[str, Any]] = []
    for name, geom in shapes:
        true_area = hk.geometry_area_m2(geom)
        for bits in (17, 19, 20, 22):
            cov = hk.cover(geom, bits)

            def build(g: Any = geom, b: int = bits) -> object:
                return hk.cover(g, b)

            ms = best_ns(build, repeats) / 1e6
            rows.append({
                "shape": name, "bits": bits, "ranges": len(cov), "merged": len(cov.merged()),
                "interior": cov.interior_share, "area_ratio": cov.area_m2() / true_area,
                "ms": ms, "vertices": len(hk.as_geometry(geom).exterior.coords)
                if geom.geom_type == "Polygon" else sum(len(p.exterior.coords) for p in geom.geoms),
            })
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--sample", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()

    print(f"Hilbert kernel, 26 bits per axis, {args.points:,} random points "
          f"(best of {args.repeats}); hilbertcurve on {args.sample:,}")
    c = bench_curve(args.points, args.sample, args.repeats)
    floor = c["numpy xor floor ns/pt"]
    curve = []
    for op in ("encode", "decode"):
        ours, ref = c[f"batch {op} ns/pt"], c[f"hilbertcurve {op} ns/pt"]
        speed_up = report.ratio(ours, ref, lower_is_better=True)  # hilbertcurve's time / ours
        curve.append([f"batch {op}", f"{ours:.2f}", report.ratio_cell(report.ratio(ours, floor), ".1f"),
                      f"{ref:,.0f}", report.times(speed_up, spec=",.0f")])
    curve.append(["numpy xor floor", f"{floor:.2f}", "", "", ""])
    for op in ("encode", "decode"):
        curve.append([f"scalar {op} (Python)", f"{c[f'scalar {op} ns/call']:.0f} ns/call", "", "", ""])
    print(report.table(["", "ns/point", "x numpy floor", "hilbertcurve ns", "speed-up"], curve, indent="  "))

    rows = bench_covering(max(3, args.repeats // 2))
    print(f"\nCoverings (ranges merged per kind; 'merged' = all adjacent joined); {OSM_CREDIT}")
    cells = [[str(r[k]) for k in ("shape", "vertices", "bits", "ranges", "merged")]
             + [f"{r['interior']:.1%}", f"{r['area_ratio']:.4f}", f"{r['ms']:.2f}"] for r in rows]
    header = ["shape", "verts", "bits", "ranges", "merged", "interior", "area/true", "build ms"]
    print(report.table(header, cells, indent="  "))
    munis = [r for r in rows if not str(r["shape"]).startswith("circle")]
    for bits in (17, 19, 20, 22):
        sel = [r for r in munis if r["bits"] == bits]
        print(f"  municipalities @{bits}: median ranges {statistics.median(r['ranges'] for r in sel):.0f}, "
              f"median area/true {statistics.median(r['area_ratio'] for r in sel):.4f}, "
              f"total build {sum(r['ms'] for r in sel):.1f} ms")

    circle20 = next(r for r in rows if r["bits"] == 20 and str(r["shape"]).startswith("circle"))
    got = {
        "batch encode ns/pt": c["batch encode ns/pt"],
        "batch decode ns/pt": c["batch decode ns/pt"],
        "scalar encode ns/call": c["scalar encode ns/call"],
        "circle 20b build ms": float(circle20["ms"]),
        "circle 20b area ratio": float(circle20["area_ratio"]),
    }
    speed_up = c["hilbertcurve encode ns/pt"] / c["batch encode ns/pt"]
    encode_floor, decode_floor = c["batch encode ns/pt"] / floor, c["batch decode ns/pt"] / floor
    ok = all(got[k] <= v for k, v in TARGETS.items())
    ok &= speed_up >= 1000
    ok &= encode_floor <= 10 and decode_floor <= 10
    print()
    print(report.summary([", ".join(f"{k} {got[k]:.3g} (<= {v:g})" for k, v in TARGETS.items()),
                          f"encode {report.times(speed_up, 'hilbertcurve', ',.0f')}, "
                          f"{encode_floor:.1f}x/{report.times(decode_floor, 'numpy floor', '.1f')}"],
                         verdict="all targets met" if ok else "TARGET MISSED"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
