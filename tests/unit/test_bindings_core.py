"""The nightly rebuild's pure core: coverings, cuts equal to the fence service's, the diff
against live bindings, the union cut of a re-split, balancing."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import shapely
from shapely.geometry import MultiPolygon, Polygon, box, mapping

import hilbert_c as hk
from fence.spec import MAX_RANGES, bindings, choose_bits, covering
from hilbert_c.covering import _flatten, circle, flatten_geojson
from ingress.worldmap import AREA, Worldmap
from spark_jobs import bindings_core as core

WM = Worldmap.over_area(["a", "b", "c"])


def fences() -> list[Polygon | MultiPolygon]:
    rng = np.random.default_rng(3)
    out: list[Polygon | MultiPolygon] = [circle(9.4 + 0.3 * rng.random(), 47 + 0.3 * rng.random(),
                                                float(rng.uniform(20, 8000))) for _ in range(40)]
    out.append(box(9.40, 47.00, 9.70, 47.30).difference(box(9.50, 47.10, 9.60, 47.20)))  # a hole, 3 regions
    out.append(MultiPolygon([circle(9.45, 47.05, 300), circle(9.65, 47.25, 800)]))
    return out


def frame(geoms: list[Polygon | MultiPolygon]) -> pd.DataFrame:
    return pd.DataFrame({"fence_id": [f"f{i}" for i in range(len(geoms))],
                         "version": list(range(1, len(geoms) + 1)),
                         "geometry": [json.dumps(mapping(g)) for g in geoms]})


def test_flatten_geojson_equals_shapely_and_closes_rings() -> None:
    for g in fences():
        for got, want in zip(flatten_geojson(json.loads(json.dumps(mapping(g)))), _flatten(g), strict=True):
            assert np.array_equal(got, want)
    open_ring = {"type": "Polygon", "coordinates": [[[9.5, 47.1], [9.6, 47.1], [9.6, 47.2]]]}
    lon, lat, ends = flatten_geojson(open_ring)
    assert list(ends) == [4] and (lon[0], lat[0]) == (lon[-1], lat[-1])
    with pytest.raises(hk.InvalidGeometry):
        flatten_geojson({"type": "Point", "coordinates": [9.5, 47.1]})


def test_coverings_are_the_kernels_and_a_refused_geometry_is_a_row_with_its_error() -> None:
    geoms = fences()
    df = frame(geoms)
    df.loc[len(df)] = ["bad", 9, json.dumps({"type": "LineString", "coordinates": [[0, 0], [1, 1]]})]
    out = core.cover_batch(df)
    assert list(out["fence_id"]) == list(df["fence_id"])
    for g, row in zip(geoms, out.itertuples(), strict=False):
        want = hk.cover(g, choose_bits(g), max_ranges=MAX_RANGES).to_bits(26)
        assert (row.ranges, row.interior) == core.to_bytes(want.ranges, want.interior)
        assert row.n_ranges == len(want) and row.error is None
    bad = out.iloc[-1]
    assert bad.n_ranges == 0 and bad.ranges == b"" and "LineString" in bad.error


STRIPES = np.unique(np.linspace(0, 2**52 - 1, 40_000).astype(np.uint64))


@pytest.mark.parametrize("wm", [WM, Worldmap.single("a"),
                                # many small intervals: cuts push big fences past MAX_RANGES
                                Worldmap(1, ("a", "b"), STRIPES, np.arange(STRIPES.size) % 2)],
                         ids=["three-regions", "one-region", "fine-stripes"])
def test_cuts_equal_what_the_fence_service_stores(wm: Worldmap) -> None:
    geoms = fences()
    cut = core.cut_batch(core.cover_batch(frame(geoms)), wm)
    for i, g in enumerate(geoms):
        want = bindings(g, wm)
        got = cut[cut.fence_id == f"f{i}"]
        assert set(got.region) == set(want.per_region)
        for row in got.itertuples():
            assert (row.ranges, row.interior) == core.to_bytes(*want.per_region[row.region])
            assert row.bits == want.bits and row.version == i + 1
        assert want.ranges <= MAX_RANGES


def test_the_diff_names_only_what_differs_with_minimal_counts() -> None:
    geoms = fences()[:6]
    df = frame(geoms)
    want = [bindings(g, WM) for g in geoms]
    live: list[dict[str, tuple[int, bytes, bytes]]] = []
    for i, b in enumerate(want):
        rows = {r: (i + 1, *core.to_bytes(*v)) for r, v in b.per_region.items()}
        region = sorted(rows)[0]
        if i == 1:  # two ranges lost, one grown
            r, f = b.per_region[region]
            r2 = r[2:].copy()
            r2[0, 1] += 1
            rows[region] = (i + 1, *core.to_bytes(r2, f[2:]))
        elif i == 2:
            del rows[region]
        elif i == 3:
            extra = np.array([[1, 2], [7, 9]], np.uint64), np.array([True, False])
            rows["zz"] = (i + 1, *core.to_bytes(*extra))
        live.append(rows)
    df["live_regions"] = [sorted(x) or None for x in live]
    df["live_versions"] = [[x[r][0] for r in sorted(x)] for x in live]
    df["live_ranges"] = [[x[r][1] for r in sorted(x)] for x in live]
    df["live_interior"] = [[x[r][2] for r in sorted(x)] for x in live]
    out = core.rebuild_batch(df, WM)
    diffs = {d["fence_id"]: d for ds in out["diffs"] for d in ds}
    assert set(diffs) == {"f1", "f2", "f3"}
    assert all(len(ds) <= 1 for ds in out["diffs"])
    f1 = diffs["f1"]
    assert (f1["action"], f1["ranges_removed"], f1["ranges_added"]) == ("change", 1, 3)
    f2 = diffs["f2"]
    r2 = sorted(want[2].per_region)[0]
    assert (f2["action"], f2["region"], f2["ranges_added"], f2["ranges_before"]) == \
        ("add", r2, len(want[2].per_region[r2][0]), 0)
    assert (f2["ranges"], f2["interior"]) == core.to_bytes(*want[2].per_region[r2])
    f3 = diffs["f3"]
    assert (f3["action"], f3["region"], f3["ranges_removed"], f3["ranges"]) == ("remove", "zz", 2, None)
    assert [list(x) for x in out["cut_regions"]] == [sorted(b.per_region) for b in want]
    assert [list(x) for x in out["cut_sizes"]] == [[len(b.per_region[r][0]) for r in sorted(b.per_region)]
                                                   for b in want]


def test_a_union_cut_binds_each_piece_where_either_map_routes_it() -> None:
    new = WM
    old = Worldmap.over_area(["a", "b", "c"], (9.40, 47.00, 9.55, 47.30))
    rng = np.random.default_rng(9)
    for g in fences()[:20]:
        first = covering(_flatten(g))
        u = core.union_cut(first, new, old)
        lon = rng.uniform(g.bounds[0], g.bounds[2], 300)
        lat = rng.uniform(g.bounds[1], g.bounds[3], 300)
        inside = shapely.contains_xy(g, lon, lat)
        x, y = hk.lonlat_to_grid(lon[inside], lat[inside], 26)
        h = hk.encode_many(x, y, 26)
        for wm in (new, old):
            regions = np.array(wm.regions)[wm.region_index(h)]
            for region in set(regions.tolist()):
                ranges, _ = u.per_region[region]
                assert hk.ranges_contain(ranges, h[regions == region]).all()


def test_balanced_splits_the_counted_ranges_evenly_and_imbalance_measures_it() -> None:
    rng = np.random.default_rng(2)
    x0, y0, _, y1 = AREA
    lon, lat = rng.uniform(x0, x0 + 0.05, 20_000), rng.uniform(y0, y1, 20_000)  # crowded in the west
    gx, gy = hk.lonlat_to_grid(lon, lat, 26)
    h = hk.encode_many(gx, gy, 26)
    b, n = np.unique(h >> np.uint64(core.BUCKET_SHIFT), return_counts=True)
    before = WM.region_index(h)
    new = core.balanced(WM, b, n)
    assert new.version == WM.version + 1 and new.regions == WM.regions
    after = new.region_index(h)
    loads = {r: int((after == i).sum()) for i, r in enumerate(new.regions)}
    assert core.imbalance(loads, new.regions) < 1.02
    assert core.imbalance({r: int((before == i).sum()) for i, r in enumerate(WM.regions)}, WM.regions) > 1.5
    assert core.imbalance({"a": 5, "b": 5}, ["a", "b"]) == 1.0
    assert core.imbalance({"a": 10}, ["a", "b"]) == 2.0
    assert core.balanced(WM, [], []) is WM
    assert core.balanced(Worldmap.single("a"), b, n).version == 1
