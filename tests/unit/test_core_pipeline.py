"""The benchmark's workload and core pipeline (bench/workload.py) against its shapely
reference, small enough for a unit test: what `python -m bench.e2e --mode core` checks at scale."""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt
import pytest

import hilbert_c as hk
from bench import workload as wl
from exchanges.fence_binding import INDEX_BITS
from exchanges.fence_options import filters
from exchanges.worldmap import Worldmap

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


@pytest.fixture(scope="module")
def banded() -> tuple[list[wl.Fence], wl.Stream, list[wl.EventTuple]]:
    """Fences with hysteresis bands of 0 to 60 m, and walkers with 8 m of jitter per step, so
    they linger and wobble across the borders (GPS noise)."""
    fences = [dataclasses.replace(f, hysteresis_m=float(m)) for f, m in
              zip(wl.make_fences(40, seed=2, box=BOX, radius_m=(150.0, 300.0)), [0, 10, 30, 60] * 10,
                  strict=True)]
    walk = wl.random_walk(200, 6_000, seed=2, box=BOX)
    jitter = np.random.default_rng(7).normal(0.0, 8.0 / 111_000.0, (2, len(walk)))
    stream = dataclasses.replace(walk, lon=walk.lon + jitter[0], lat=walk.lat + jitter[1])
    return fences, stream, wl.reference_events(fences, stream)


@pytest.mark.parametrize("batch", [200, 73, 1_000])
def test_hysteresis_bands_give_the_reference_events(banded, batch: int) -> None:  # type: ignore[no-untyped-def]
    """Fences with hysteresis bands (exchanges/fence_options/band.py): x-geo covers the grown fence,
    x-fence keeps a pair's state through the band, within a batch and across batches, as the
    reference (fence/reference.py, position by position) does."""
    fences, stream, reference = banded
    assert len(reference) > 300
    assert wl.compare(run(fences, stream, batch), reference) == []
    plain = [dataclasses.replace(f, hysteresis_m=0.0) for f in fences]
    assert wl.compare(run(plain, stream, batch), reference) != [], "without bands the events differ"


def test_a_band_removes_the_flapping_of_noise_at_a_border(banded) -> None:  # type: ignore[no-untyped-def]
    """What the band is for: the same walkers and fences without bands give more ENTER / LEAVE
    pairs, the extra ones those of positions wobbling at a border."""
    fences, stream, with_bands = banded
    without = wl.reference_events([dataclasses.replace(f, hysteresis_m=0.0) for f in fences], stream)
    wide = {f.fence_id for f in fences if f.hysteresis_m >= 30}
    assert sum(e[1] in wide for e in with_bands) < 0.5 * sum(e[1] in wide for e in without)


@pytest.fixture(scope="module")
def filtered() -> tuple[list[wl.Fence], wl.Stream, list[wl.EventTuple]]:
    """Fences with filters on the positions' fields (some with bands too), walkers whose
    `speed` changes at every update and whose `type` is fixed, some positions without fields."""
    clauses = [(), filters.parse([["speed", "<", 30]]), filters.parse([["type", "in", ["truck", "van"]]]),
               filters.parse([["speed", "between", 10, 40], ["type", "!=", "bike"]])]
    fences = [dataclasses.replace(f, where=clauses[i % 4], hysteresis_m=float([0, 0, 20, 0, 40][i % 5]))
              for i, f in enumerate(wl.make_fences(40, seed=3, box=BOX, radius_m=(150.0, 300.0)))]
    walk = wl.random_walk(200, 6_000, seed=3, box=BOX)
    rng = np.random.default_rng(11)
    kinds = ["truck", "van", "car", "bike"]
    speed = rng.uniform(0.0, 60.0, len(walk))
    extra: list[dict[str, object] | None] = [
        None if rng.random() < 0.05 else {"speed": float(s), "type": kinds[int(o) % 4]}
        for s, o in zip(speed.tolist(), walk.obj.tolist(), strict=True)]
    stream = dataclasses.replace(walk, extra=extra)
    return fences, stream, wl.reference_events(fences, stream)


@pytest.mark.parametrize("batch", [200, 1_000])
def test_fence_filters_give_the_reference_events(filtered, batch: int) -> None:  # type: ignore[no-untyped-def]
    """A fence's `where` (exchanges/fence_options/filters.py): a position that fails it is outside, so an
    object inside LEAVEs when its fields stop matching and ENTERs when they match again; x-fence
    filters each batch's candidates per fence, the reference position by position."""
    fences, stream, reference = filtered
    assert len(reference) > 300
    assert wl.compare(run(fences, stream, batch), reference) == []
    unfiltered = wl.reference_events([dataclasses.replace(f, where=()) for f in fences], stream)
    assert wl.compare(unfiltered, reference) != [], "the filters change the events"


@pytest.fixture(scope="module")
def dwelling() -> tuple[list[wl.Fence], wl.Stream, list[wl.EventTuple]]:
    """Fences with dwell times of 0 to 15 s (the walkers step once a second, 20 m), some with
    bands and filters too, and walkers with 8 m of jitter: many stays are shorter than their
    fence's dwell time, many longer."""
    where = [(), (), filters.parse([["speed", "<", 45]])]
    fences = [dataclasses.replace(f, dwell_s=float([0, 3, 8, 15][i % 4]),
                                  hysteresis_m=float([0, 0, 0, 20, 0][i % 5]), where=where[i % 3])
              for i, f in enumerate(wl.make_fences(40, seed=4, box=BOX, radius_m=(100.0, 300.0)))]
    walk = wl.random_walk(200, 8_000, seed=4, box=BOX)
    rng = np.random.default_rng(5)
    jitter = rng.normal(0.0, 8.0 / 111_000.0, (2, len(walk)))
    extra: list[dict[str, object] | None] = [{"speed": float(v)} for v in rng.uniform(0.0, 50.0, len(walk))]
    stream = dataclasses.replace(walk, lon=walk.lon + jitter[0], lat=walk.lat + jitter[1], extra=extra)
    return fences, stream, wl.reference_events(fences, stream)


@pytest.mark.parametrize("batch", [200, 73, 1_000])
def test_dwell_gives_the_reference_events(dwelling, batch: int) -> None:  # type: ignore[no-untyped-def]
    """A fence's `dwell_s`: ENTER `dwelled` at the first position a stay has lasted that long,
    no event for a shorter stay; per run of observations within a batch (73 and 1,000: several
    positions of an object per batch), across batches, with bands and filters."""
    fences, stream, reference = dwelling
    dwelled = [e for e in reference if e[4] == "dwelled"]
    assert len(dwelled) > 100 and len(reference) > 400
    assert wl.compare(run(fences, stream, batch), reference) == []
    at_once = [dataclasses.replace(f, dwell_s=0.0) for f in fences]
    assert wl.compare(run(at_once, stream, batch), reference) != [], "without dwell the events differ"


def test_dwell_drops_the_short_stays(dwelling) -> None:  # type: ignore[no-untyped-def]
    """Every stay the reference reports in a fence with a dwell time lasted at least that long
    (its LEAVE comes at least dwell_s after the stay began), and fewer stays are reported."""
    fences, stream, reference = dwelling
    dwell = {f.fence_id: f.dwell_s for f in fences}
    without = wl.reference_events([dataclasses.replace(f, dwell_s=0.0) for f in fences], stream)
    long_ones = {f for f, d in dwell.items() if d >= 8}
    assert sum(e[1] in long_ones for e in reference) < 0.8 * sum(e[1] in long_ones for e in without)
    assert {e[4] for e in reference if dwell[e[1]] > 0} <= {"dwelled", "exited"}


@pytest.fixture(scope="module")
def crossing() -> tuple[list[wl.Fence], wl.Stream, npt.NDArray[np.int64], list[wl.EventTuple]]:
    """Small fences (20-60 m) that detect CROSS, some filtered, and sparse walkers: 120 m a step,
    so many pass a fence between two positions without one inside it; two regions."""
    where = [(), filters.parse([["speed", "<", 40]])]
    fences = [dataclasses.replace(f, cross=i % 3 != 2, where=where[i % 2])
              for i, f in enumerate(wl.make_fences(60, seed=5, box=BOX, radius_m=(20.0, 60.0)))]
    walk = wl.random_walk(200, 8_000, seed=5, box=BOX, step_m=120.0)
    rng = np.random.default_rng(9)
    stream = dataclasses.replace(walk, extra=[{"speed": float(v)} for v in rng.uniform(0.0, 50.0, len(walk))])
    x, y = hk.lonlat_to_grid(stream.lon, stream.lat, INDEX_BITS)
    region = split_in_box().region_index(hk.encode_many(x, y, INDEX_BITS))
    return fences, stream, region, wl.reference_events(fences, stream, region=region)


@pytest.mark.parametrize("batch", [200, 73, 1_000])
def test_cross_gives_the_reference_events(crossing, batch: int) -> None:  # type: ignore[no-untyped-def]
    """A fence's `cross`: x-geo tests each segment within a region against the bounding boxes
    of the fences that detect it and sends the previous position with the candidate; x-fence
    reports `cross` when both ends are outside and the segment goes through, as the reference
    does for every segment and fence (several positions of an object per batch at 73 and 1,000)."""
    fences, stream, _, reference = crossing
    crossed = [e for e in reference if e[0] == "cross"]
    assert len(crossed) > 100 and {e[1] for e in crossed} <= {f.fence_id for f in fences if f.cross}
    assert wl.compare(run(fences, stream, batch), reference) == []


def test_cross_is_only_where_no_position_was_inside(crossing) -> None:  # type: ignore[no-untyped-def]
    """What CROSS adds: passages that ENTER / LEAVE miss (no position inside), none with one;
    and a segment between the two regions is not tested (the regions split the box)."""
    fences, stream, region, reference = crossing
    stays = {(e[1], e[2], e[3]) for e in reference if e[0] == "enter"}
    assert not any((e[1], e[2], e[3]) in stays for e in reference if e[0] == "cross")
    one_region = wl.reference_events(fences, stream, region=np.zeros_like(region))
    assert sum(e[0] == "cross" for e in one_region) > sum(e[0] == "cross" for e in reference)
