"""The benchmark's workload and core pipeline (bench/workload.py) against its shapely
reference, small enough for a unit test: what `python -m bench.e2e --mode core` checks at scale."""

from __future__ import annotations

import numpy as np
import pytest

import hilbert_c as hk
from bench import workload as wl
from exchanges.worldmap import Worldmap
from exchanges.x_geo.range_index import INDEX_BITS

BOX = wl.Box(9.55, 47.15, 2_000.0)  # dense: 2 km, so a few hundred objects meet the fences


def split_in_box() -> Worldmap:
    """Two regions whose border crosses the box, so objects are handed over."""
    lon0, lat0, lon1, lat1 = BOX.bounds
    lon, lat = np.meshgrid(np.linspace(lon0, lon1, 64), np.linspace(lat0, lat1, 64))
    x, y = hk.lonlat_to_grid(lon.ravel(), lat.ravel(), INDEX_BITS)
    return Worldmap.balanced(["a", "b"], hk.encode_many(x, y, INDEX_BITS))


def run(fences: list[wl.Fence], stream: wl.Stream, batch: int) -> list[wl.EventTuple]:
    pipe = wl.CorePipeline(worldmap=split_in_box())
    pipe.define(fences)
    out: list[wl.EventTuple] = []
    for chunk in stream.chunks(batch):
        out += wl.as_tuples(pipe.feed(chunk.batch()))
    return out


@pytest.fixture(scope="module")
def small() -> tuple[list[wl.Fence], wl.Stream, list[wl.EventTuple]]:
    # seed 1: an object crosses the border and back within a batch of 1,000 and leaves a
    # fence on the way (what route(batch, left=...) gets right and route + objects_left not)
    fences = wl.make_fences(40, seed=1, box=BOX, radius_m=(100.0, 300.0))
    stream = wl.random_walk(200, 6_000, seed=1, box=BOX)
    return fences, stream, wl.reference_events(fences, stream)


@pytest.mark.parametrize("batch", [200, 73, 1_000])
def test_core_pipeline_gives_the_reference_events(small, batch: int) -> None:  # type: ignore[no-untyped-def]
    """One round per batch, batches across rounds, and five positions of every object per
    batch (objects crossing the region border and back within one batch)."""
    fences, stream, reference = small
    assert len(reference) > 500  # the walk really crosses fences
    assert wl.compare(run(fences, stream, batch), reference) == []


def test_objects_cross_the_region_border(small) -> None:  # type: ignore[no-untyped-def]
    _, stream, _ = small
    x, y = hk.lonlat_to_grid(stream.lon, stream.lat, INDEX_BITS)
    region = split_in_box().region_index(hk.encode_many(x, y, INDEX_BITS))
    crossings = sum(int(np.count_nonzero(np.diff(region[stream.obj == o])))
                    for o in range(len(stream.object_ids)))
    assert crossings > 20  # handovers are exercised


def test_workload_is_deterministic_and_walks_in_the_box() -> None:
    a, b = wl.random_walk(50, 1_030, seed=3), wl.random_walk(50, 1_030, seed=3)
    assert np.array_equal(a.lon, b.lon) and np.array_equal(a.obj, b.obj) and len(a) == 1_030
    lon0, lat0, lon1, lat1 = wl.DEFAULT_BOX.bounds
    assert (a.lon >= lon0).all() and (a.lon <= lon1).all() and (a.lat >= lat0).all() and (a.lat <= lat1).all()
    for o in range(50):  # every object once per round, later rounds later, ~20 m steps
        ts, lon, lat = a.ts[a.obj == o], a.lon[a.obj == o], a.lat[a.obj == o]
        assert (np.diff(ts) > 0).all()
        box = wl.DEFAULT_BOX
        step = np.hypot(np.diff(lon) * box.m_per_deg_lon, np.diff(lat) * box.m_per_deg_lat)
        assert (step <= wl.STEP_M + 1e-6).all()
    assert sorted(a.obj[:50].tolist()) == list(range(50))
    f1, f2 = wl.make_fences(5, seed=3), wl.make_fences(5, seed=3)
    assert [f.fence_id for f in f1] == ["f00000", "f00001", "f00002", "f00003", "f00004"]
    assert all(x.geometry.equals(y.geometry) for x, y in zip(f1, f2, strict=True))
    assert all(200.0 <= f.radius_m <= 800.0 for f in f1)


def test_chunks_cover_the_stream_in_order() -> None:
    s = wl.random_walk(10, 95, seed=1)
    chunks = list(s.chunks(40))
    assert [len(c) for c in chunks] == [40, 40, 15] and [c.start for c in chunks] == [0, 40, 80]
    assert [i for c in chunks for i in c.ids] == s.ids()
    assert np.array_equal(np.concatenate([c.batch().ts for c in chunks]), s.ts)


def test_covering_bits_follow_the_radius() -> None:
    assert wl.covering_bits(200.0, 47.15) > wl.covering_bits(800.0, 47.15)
    w, h = hk.cell_size_m(wl.covering_bits(500.0, 47.15), 47.15)
    assert 500.0 / 40 < (w * h) ** 0.5 < 500.0 / 10


def test_compare_names_the_differences() -> None:
    e = ("enter", "f1", "o1", 1.0, "entered")
    assert wl.compare([e], [e]) == []
    diff = wl.compare([e, e], [e, ("leave", "f1", "o1", 2.0, "exited")])
    assert diff[0].endswith("1 unexpected, 1 missing") and len(diff) == 3
