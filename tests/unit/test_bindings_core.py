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
from exchanges.worldmap import AREA, Worldmap
from fence.spec import MAX_RANGES, bindings, choose_bits, covering
from hilbert_c.covering import _flatten, circle, flatten_geojson
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
    assert set(f2) == set(core.REBUILD_DIFF_FIELDS)  # the ranges to send are cut again by the apply
    f3 = diffs["f3"]
    assert (f3["action"], f3["region"], f3["ranges_removed"], f3["ranges_after"]) == ("remove", "zz", 2, 0)
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


def test_each_batch_carries_its_totals_on_its_first_row_and_they_sum_to_the_whole() -> None:
    geoms = fences()
    df = frame(geoms)
    df.loc[len(df)] = ["bad", 9, json.dumps({"type": "LineString", "coordinates": [[0, 0], [1, 1]]})]
    for column in ("live_regions", "live_versions", "live_ranges", "live_interior"):
        df[column] = None
    halves = [core.rebuild_batch(df.iloc[:17].reset_index(drop=True), WM),
              core.rebuild_batch(df.iloc[17:].reset_index(drop=True), WM)]
    for out in halves:
        assert out["batch_counts"].iloc[1:].isna().all() and out["batch_buckets"].iloc[1:].isna().all()
    counts = sum(np.asarray(h["batch_counts"].iloc[0]) for h in halves)
    adds = sum(len(ds) for h in halves for ds in h["diffs"])  # nothing live: every cut is an add
    assert list(counts) == [len(df), sum(int(h["n_ranges"].sum()) for h in halves), 1, adds, 0, 0]
    loads = sum(np.asarray(h["batch_loads"].iloc[0]) for h in halves)
    want = {r: 0 for r in WM.regions}
    for g in geoms:
        for region, (ranges, _) in bindings(g, WM).per_region.items():
            want[region] += len(ranges)
    assert dict(zip(WM.regions, loads.tolist(), strict=True)) == want
    ids, n = core.sum_histograms(h["batch_buckets"].iloc[0] for h in halves)
    starts = np.concatenate([covering(_flatten(g))[1].ranges[:, 0] for g in geoms])
    want_ids, want_n = np.unique(starts >> np.uint64(core.BUCKET_SHIFT), return_counts=True)
    assert np.array_equal(ids, want_ids.astype(np.int64)) and np.array_equal(n, want_n)
    assert [len(x) for x in core.sum_histograms([])] == [0, 0]
    # the loads a balanced map would give, from the histogram alone: within the few ranges a
    # new boundary cuts in two (at most one per fence)
    new = core.balanced(WM, ids, n)
    estimate = core.loads_by_start(new, ids, n)
    exact = {r: 0 for r in new.regions}
    for g in geoms:
        for region, (ranges, _) in bindings(g, new).per_region.items():
            exact[region] += len(ranges)
    assert all(0 <= exact[r] - estimate[r] <= len(geoms) for r in new.regions)
    assert sum(estimate.values()) == int(n.sum())


def test_the_batch_covering_equals_the_fence_services_one_fence_at_a_time() -> None:
    geoms = [json.dumps(mapping(g)) for g in fences()]
    open_ring = {"type": "Polygon", "coordinates": [[[9.5, 47.1], [9.6, 47.1], [9.6, 47.2]]]}
    three_d = {"type": "Polygon", "coordinates": [[[9.5, 47.1, 3.0], [9.6, 47.1, 1.0], [9.6, 47.2, 0.0],
                                                   [9.5, 47.1, 9.0]]]}
    odd = [json.dumps(open_ring),
           json.dumps({"type": "LineString", "coordinates": [[0, 0], [1, 1]]}),
           json.dumps({"type": "Polygon", "coordinates": [[[9.5, 147.1], [9.6, 47.1], [9.6, 47.2]]]}),  # lat
           json.dumps({"type": "MultiPolygon", "coordinates": []}),
           json.dumps({"type": "Polygon", "coordinates": [[]]}),
           "{not json"]
    text_vertex = json.dumps({"type": "Polygon", "coordinates": [[["x", 47.1], [9.6, 47.1], [9.6, 47.2]]]})
    batches = {"plain": geoms, "with odd ones": geoms[:10] + odd + geoms[10:],
               "a vertex not a number (whole batch one by one)": [*geoms[:3], text_vertex],
               "a 3D one (whole batch one by one)": [*geoms[:5], json.dumps(three_d), *geoms[5:8]]}
    for name, batch in batches.items():
        firsts, errors = core.covers(batch)
        assert len(firsts) == len(errors) == len(batch), name
        for text, got, error in zip(batch, firsts, errors, strict=True):
            try:
                want = covering(core.flat(text))
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                assert got is None and error == f"{type(exc).__name__}: {exc}"[:500], (name, text)
                continue
            assert got is not None and error is None, (name, text)
            assert got[0] == want[0] and got[1].bits == want[1].bits and got[1].level == want[1].level
            assert np.array_equal(got[1].ranges, want[1].ranges) and np.array_equal(got[1].interior,
                                                                                   want[1].interior)
    assert core.covers([]) == ([], [])


def test_cover_many_reports_each_polygons_failure_on_its_own() -> None:
    lon = np.array([9.5, 9.6, 9.6, 9.5, 9.5, 9.6, 9.6])
    lat = np.array([47.1, 47.1, 47.2, 47.1, 99.0, 47.1, 47.2])
    ends = np.array([4, 7], np.int64)
    ranges, interior, counts, status, nodes = hk.kernel.cover_many(
        lon, lat, ends, np.array([0, 1, 2, 2], np.int64), np.array([12, 12, 12], np.int32), 26, 10_000)
    assert list(status) == [hk.kernel.COVER_OK, hk.kernel.lib.HK_E_COORD, hk.kernel.lib.HK_E_RINGS]
    assert counts[0] == len(ranges) == len(interior) > 0 and counts[1] == counts[2] == 0
    want = hk.kernel.cover_rings(lon[:4], lat[:4], ends[:1], 12, 12, 10_000)
    shift = np.uint64(2 * (26 - 12))
    assert np.array_equal(ranges[:, 0], want[0][:, 0] << shift)
    assert np.array_equal(ranges[:, 1], ((want[0][:, 1] + np.uint64(1)) << shift) - np.uint64(1))
    assert np.array_equal(interior, want[1]) and nodes[0] == want[2]
    with pytest.raises(ValueError, match="poly_rings"):
        hk.kernel.cover_many(lon, lat, ends, np.array([0, 5], np.int64), np.array([12], np.int32), 26, 10)
    with pytest.raises(ValueError, match="ring ends"):
        hk.kernel.cover_many(lon, lat, np.array([4, 70], np.int64), np.array([0, 2], np.int64),
                             np.array([12], np.int32), 26, 10)
