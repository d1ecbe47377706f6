"""x-geo's range index against brute force: every change sequence, every query."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hilbert_c as hk
from exchanges.fence_binding import INDEX_BITS
from exchanges.x_geo.range_index import RangeIndex

TOP = 4**INDEX_BITS - 1


@st.composite
def range_sets(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """Sorted disjoint inclusive ranges, clustered in a small window so fences overlap."""
    base = draw(st.sampled_from([0, 4**20 * 7 + 12345, TOP - 5000]))
    cuts = sorted(set(draw(st.lists(st.integers(0, 5000), min_size=0, max_size=16))))
    ranges = [(base + cuts[i], base + cuts[i + 1] - 1) for i in range(0, len(cuts) - 1, 2)
              if cuts[i + 1] - 1 >= cuts[i]]
    r = np.array(ranges, dtype=np.uint64).reshape(-1, 2)
    return r, np.array(draw(st.lists(st.booleans(), min_size=len(r), max_size=len(r))), dtype=bool)


ops = st.lists(
    st.tuples(st.sampled_from(["add", "add", "remove", "compact"]), st.integers(0, 6), range_sets()),
    min_size=1, max_size=25,
)


def brute(bound: dict[str, tuple[np.ndarray, np.ndarray]], hs: np.ndarray) -> set[tuple[int, str, bool]]:
    out = set()
    for fid, (r, flags) in bound.items():
        row = hk.ranges_lookup(r, hs)
        for p in np.flatnonzero(row >= 0):
            out.add((int(p), fid, bool(flags[row[p]])))
    return out


@settings(max_examples=200, deadline=None)
@given(ops, st.integers(0, 2**32 - 1))
def test_route_equals_brute_force(sequence, seed: int) -> None:  # type: ignore[no-untyped-def]
    index = RangeIndex()
    bound: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    rng = np.random.default_rng(seed)
    for op, n, (ranges, flags) in sequence:
        fid = f"fence-{n}"
        if op == "add":
            index.add(fid, ranges, flags)
            bound[fid] = (ranges, flags)
        elif op == "remove":
            if fid in bound:
                index.remove(fid)
                del bound[fid]
            else:
                with pytest.raises(KeyError):
                    index.remove(fid)
        else:
            index.compact()
        # query: range ends, neighbours, random points in the window
        edges = [v for r, _ in bound.values() for v in r.ravel().tolist()]
        probe = set(edges) | {max(0, e - 1) for e in edges} | {min(TOP, e + 1) for e in edges}
        probe |= set(rng.integers(0, 6000, 50).tolist()) | {TOP, 0}
        hs = np.array(sorted(probe), dtype=np.uint64)
        m = index.route(hs)
        got = {(int(p), fid, bool(i)) for p, fid, i in
               zip(m.point, index.fence_of_slot(m.slot), m.interior, strict=True)}
        assert got == brute(bound, hs)
        assert len(got) == len(m)  # no pair twice
        assert (np.diff(m.point) >= 0).all()
        assert sorted(index.fences()) == sorted(bound)


def test_real_coverings_route_like_shapely() -> None:
    rng = np.random.default_rng(5)
    fences = {f"c{i}": hk.circle(9.5 + rng.uniform(-0.05, 0.05), 47.0 + rng.uniform(-0.05, 0.05),
                                 rng.uniform(200, 800), 32) for i in range(60)}
    index = RangeIndex()
    for fid, poly in fences.items():
        cov = hk.cover(poly, 20).to_bits(INDEX_BITS)
        index.add(fid, cov.ranges, cov.interior)
    lon = rng.uniform(9.43, 9.57, 20000)
    lat = rng.uniform(46.93, 47.07, 20000)
    x, y = hk.lonlat_to_grid(lon, lat, INDEX_BITS)
    m = index.route(hk.encode_many(x, y, INDEX_BITS))
    names = index.fence_of_slot(m.slot)
    candidates = {(int(p), f) for p, f in zip(m.point, names, strict=True)}
    import shapely
    for fid, poly in fences.items():
        inside = np.flatnonzero(shapely.contains_xy(poly, lon, lat))
        assert {(int(p), fid) for p in inside} <= candidates  # no false negatives
    for p, f, inner in zip(m.point, names, m.interior, strict=True):
        if inner:  # interior blocks need no exact test: they really are inside
            assert shapely.contains_xy(fences[f], lon[p], lat[p])
    # candidates are close: boundary cells at 20 bits are ~26 m x 19 m
    assert len(candidates) < 1.2 * sum(int(shapely.contains_xy(g, lon, lat).sum()) for g in fences.values())


def test_bad_bindings_are_refused() -> None:
    index = RangeIndex()
    with pytest.raises(ValueError, match="not sorted"):
        index.add("f", [[5, 9], [3, 4]])
    with pytest.raises(ValueError, match="not sorted"):
        index.add("f", [[5, 4]])
    with pytest.raises(ValueError, match="exceed"):
        index.add("f", [[0, 4**26]])
    with pytest.raises(ValueError, match="flags"):
        index.add("f", [[0, 4]], [True, False])
    assert len(index) == 0


def test_moving_fence_writes_a_small_run_and_masks_the_old_slot() -> None:
    index = RangeIndex()
    for i in range(50):
        index.add(f"f{i}", [[i * 4096, i * 4096 + 4095]])
    index.compact()
    assert index.stats()["runs"] == [50]
    index.add("f3", [[10**6 * 4096, 10**6 * 4096 + 4095]])  # moved
    m = index.route(np.array([3 * 4096, 10**6 * 4096 + 5], dtype=np.uint64))
    assert index.fence_of_slot(m.slot) == ["f3"] and m.point.tolist() == [1]
    assert index.stats()["runs"] == [1, 50]  # the move did not rewrite the big run
    index.compact()
    assert index.stats()["runs"] == [50]  # the dead slot's block is gone


def test_a_fence_moving_for_hours_reuses_a_few_slots() -> None:
    """A rebind per second (a fence following a car): dead slots are taken again once no
    run holds their blocks, so the slots (and x-geo's per-slot arrays) stay bounded."""
    index = RangeIndex()
    for i in range(100):
        index.add(f"still-{i}", [[i * 4096, i * 4096 + 4095]])
    for step in range(20_000):
        lo = (10**6 + step % 997) * 4096
        index.add("mover", [[lo, lo + 4095]])
        if step % 10 == 0:  # x-geo routes between changes
            m = index.route(np.array([lo + 7, 5 * 4096], dtype=np.uint64))
            assert sorted(index.fence_of_slot(m.slot)) == ["mover", "still-5"]
    assert index.slot_count() < 200, index.stats()
    m = index.route(np.array([(10**6 + 19_999 % 997) * 4096 + 1], dtype=np.uint64))
    assert index.fence_of_slot(m.slot) == ["mover"]


def test_a_freed_slot_is_not_taken_while_a_run_still_holds_its_blocks() -> None:
    index = RangeIndex()
    for i in range(40):
        index.add(f"f{i}", [[i * 4096, i * 4096 + 4095]])
    index.compact()
    index.remove("f7")  # its block is still in the big run (masked)
    index.add("new", [[50 * 4096, 50 * 4096 + 4095]])
    assert index.slot_of("new") == 40 and index.stats()["free_slots"] == 0
    m = index.route(np.array([7 * 4096 + 1, 50 * 4096 + 1], dtype=np.uint64))
    assert index.fence_of_slot(m.slot) == ["new"] and m.point.tolist() == [1]
    index.compact()  # the masked block is dropped: slot 7 is free, and taken next
    assert index.stats()["free_slots"] == 1
    index.add("newer", [[60 * 4096, 60 * 4096 + 4095]])
    assert index.slot_of("newer") == 7
    m = index.route(np.array([7 * 4096 + 1, 60 * 4096 + 1], dtype=np.uint64))
    assert index.fence_of_slot(m.slot) == ["newer"] and m.point.tolist() == [1]
