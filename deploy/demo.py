"""`geofence demo`: the main job the README's first command runs.

For now a kernel demo on real data (the pipeline issue turns it into the live fleet demo):
the 11 municipalities of Liechtenstein ((c) OpenStreetMap contributors) become fences,
their Hilbert coverings are built, and a batch of positions is routed through them the way
x-geo and x-fence will: one vectorised range lookup, the exact polygon test only where the
range is a boundary range. The result is checked against shapely on every point.
"""

from __future__ import annotations

import argparse
import time


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--points", type=int, default=1_000_000, help="positions to route")
    parser.add_argument("--bits", type=int, default=22, help="covering resolution")
    parser.add_argument("--seed", type=int, default=2013)


def run(args: argparse.Namespace) -> int:
    import numpy as np
    import shapely

    import hilbert_c as hk
    from deploy.osm_extract import OSM_CREDIT, municipalities

    fences = municipalities()
    print(f"Fences: {len(fences)} municipalities of Liechtenstein ({OSM_CREDIT})")
    t = time.perf_counter()
    coverings = {name: hk.cover(geom, args.bits) for name, geom in fences.items()}
    cover_ms = (time.perf_counter() - t) * 1e3
    print(f"Coverings at {args.bits} bits ({hk.cell_size_m(args.bits, 47.1)[0]:.1f} m cells): "
          f"{sum(len(c) for c in coverings.values()):,} ranges in {cover_ms:.0f} ms")

    union = shapely.union_all(list(fences.values()))
    x0, y0, x1, y1 = union.bounds
    rng = np.random.default_rng(args.seed)
    lon = rng.uniform(x0, x1, args.points)
    lat = rng.uniform(y0, y1, args.points)

    t = time.perf_counter()
    xs, ys = hk.lonlat_to_grid(lon, lat, args.bits)
    hs = hk.encode_many(xs, ys, args.bits)
    hits: dict[str, int] = {}
    exact_checks = 0
    for name, cov in coverings.items():
        row = hk.ranges_lookup(cov.ranges, hs)
        cand = row >= 0
        boundary = cand.copy()
        boundary[cand] = ~cov.interior[row[cand]]
        inside = cand.copy()
        idx = np.flatnonzero(boundary)
        exact_checks += idx.size
        inside[idx] = shapely.contains_xy(fences[name], lon[idx], lat[idx])
        hits[name] = int(inside.sum())
    route_s = time.perf_counter() - t

    truth = {name: int(shapely.contains_xy(g, lon, lat).sum()) for name, g in fences.items()}
    print(f"\n  {'municipality':<14}{'positions inside':>18}{'shapely':>10}")
    for name in fences:
        print(f"  {name:<14}{hits[name]:>18,}{truth[name]:>10,}")
    ok = hits == truth
    print(f"\nSUMMARY {'OK' if ok else 'MISMATCH'}: {args.points:,} positions routed through "
          f"{len(fences)} fences in {route_s * 1e3:.0f} ms "
          f"({args.points / route_s / 1e6:.1f} M positions/s, exact test on "
          f"{exact_checks / (args.points * len(fences)):.2%} of position-fence pairs); "
          f"matches shapely on every point: {ok}")
    return 0 if ok else 1
