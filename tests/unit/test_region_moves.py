"""A region added or removed live (issue 21): the worldmap's vacate / drop / balanced cut,
the bindings the grow and shrink steps move (fence/region_moves.py) against the fences'
coverings cut by the new maps (fence.spec.bindings, the API's own cut), the x-geo taking a
fence's moved ranges at the same version, and the stack's record of its regions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from shapely.geometry import Point, box

from deploy.settings import Settings, SettingsError, read_live_topology, write_live_topology
from exchanges.fence_binding import FenceBinding
from exchanges.worldmap import TOP, Worldmap
from exchanges.x_geo.core import XGeo
from fence import region_moves as moves
from fence.spec import bindings
from tests.unit.test_x_geo import FixedRing, batch, binding

AREA_MAP = Worldmap.over_area(["a", "b"])


def fences(seed: int, n: int) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    return {f"f{i}": Point(x, y).buffer(float(r)) for i, (x, y, r) in enumerate(zip(
        rng.uniform(9.45, 9.65, n), rng.uniform(47.05, 47.25, n), rng.uniform(0.002, 0.03, n),
        strict=True))}


def live_of(geoms: dict[str, object], wm: Worldmap) -> dict[tuple[str, str], moves.Piece]:
    return {(fid, r): p for fid, g in geoms.items() for r, p in bindings(g, wm).per_region.items()}


def rows(live: dict[tuple[str, str], moves.Piece], region: str) -> list[moves.Bound]:
    return [moves.Bound(f, r, 1, 26, p[0], p[1]) for (f, r), p in sorted(live.items()) if r == region]


def apply(live: dict[tuple[str, str], moves.Piece], rebinds: list[moves.Rebind]) -> None:
    for rb in rebinds:
        for region, piece in rb.per_region.items():
            if piece is None:
                live.pop((rb.fence_id, region), None)
            else:
                live[(rb.fence_id, region)] = piece


def assert_cut_by(live: dict[tuple[str, str], moves.Piece], geoms: dict[str, object], wm: Worldmap) -> None:
    want = live_of(geoms, wm)
    assert set(live) == set(want)
    for key, (ranges, interior) in want.items():
        assert np.array_equal(live[key][0], ranges) and np.array_equal(live[key][1], interior), key


def superset(live: dict[tuple[str, str], moves.Piece], geoms: dict[str, object], *maps: Worldmap) -> None:
    """Every region binds at least what it owns under each of `maps` (grow's promise)."""
    for wm in maps:
        for (fid, region), (ranges, _) in live_of(geoms, wm).items():
            have = live.get((fid, region))
            assert have is not None, (fid, region)
            assert moves._within(ranges, have[0]).all(), (fid, region)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(["a", "b"]))
def test_a_split_then_a_join_cut_every_fence_as_the_api_would(seed: int, split: str) -> None:
    geoms = fences(seed, 30)
    live = live_of(geoms, AREA_MAP)
    before = dict(live)
    old = rows(live, split)
    at = AREA_MAP.balanced_cut(split, np.concatenate([b.ranges[:, 0] for b in old]))
    new = AREA_MAP.split(split, at, "c")
    assert new.version == AREA_MAP.version + 1 and new.regions == ("a", "b", "c")
    grow = moves.split_grow(old, new, "c")
    assert grow, "the balanced cut gives the new region some fences"
    apply(live, grow)
    superset(live, geoms, AREA_MAP, new)  # a position routed with either map finds its fences
    apply(live, moves.split_shrink(rows(live, split), new))
    assert_cut_by(live, geoms, new)
    assert not moves.split_shrink(rows(live, split), new)  # shrunk once: nothing more to do

    mid = new.vacate("c", split)
    assert mid.regions == new.regions and not len(mid.intervals("c"))
    staying = {b.fence_id: b for b in rows(live, split)}
    grown = moves.join_grow(rows(live, "c"), staying, split, new, mid)
    apply(live, grown)
    superset(live, geoms, new, mid)
    again = {b.fence_id: b for b in rows(live, split)}
    assert not moves.join_grow(rows(live, "c"), again, split, new, mid)  # run again: nothing
    apply(live, moves.join_shrink(rows(live, "c")))
    final = mid.drop("c")
    assert final.regions == AREA_MAP.regions
    assert final.to_json()["intervals"] == AREA_MAP.to_json()["intervals"]
    assert_cut_by(live, geoms, final)
    assert {k: (p[0].tolist(), p[1].tolist()) for k, p in live.items()} == \
        {k: (p[0].tolist(), p[1].tolist()) for k, p in before.items()}


def test_merge_at_joins_only_at_the_cuts_given_with_equal_flags() -> None:
    r = np.array([[20, 29], [0, 9], [10, 19], [30, 39]], np.uint64)
    f = np.array([True, False, False, True])
    got, flags = moves.merge_at(r, f, [10, 20, 30])  # 20: the flags differ there
    assert got.tolist() == [[0, 19], [20, 39]] and flags.tolist() == [False, True]
    got, _ = moves.merge_at(r, f, [])
    assert got.tolist() == [[0, 9], [10, 19], [20, 29], [30, 39]]


def test_join_refuses_bindings_of_two_versions() -> None:
    a = moves.Bound("f", "a", 2, 26, np.array([[0, 9]], np.uint64), np.array([False]))
    c = moves.Bound("f", "c", 3, 26, np.array([[10, 19]], np.uint64), np.array([False]))
    wm = Worldmap(1, ("a", "c"), np.array([0, 10], np.uint64), np.array([0, 1], np.int64))
    with pytest.raises(ValueError, match="version"):
        moves.join_grow([c], {"f": a}, "a", wm, wm.vacate("c", "a"))


def test_vacate_drop_and_the_share_moved() -> None:
    wm = Worldmap(4, ("a", "b", "c"), np.array([0, 100, 200, 300], np.uint64),
                  np.array([0, 2, 1, 2], np.int64))
    mid = wm.vacate("c", "a")
    assert mid.version == 5 and mid.starts.tolist() == [0, 200, 300] and mid.owner.tolist() == [0, 1, 0]
    assert moves.moved_share(wm, mid) == pytest.approx((100 + (TOP + 1 - 300)) / (TOP + 1))
    with pytest.raises(ValueError, match="still owns"):
        wm.drop("c")
    end = mid.drop("c")
    assert end.regions == ("a", "b") and end.owner.tolist() == [0, 1, 0] and end.version == 6
    with pytest.raises(ValueError, match="into itself"):
        wm.vacate("a", "a")
    assert moves.moved_share(wm, wm) == 0.0


def test_balanced_cut_halves_the_sample_and_stays_inside_the_region() -> None:
    wm = Worldmap(1, ("a", "b"), np.array([0, 1000], np.uint64), np.array([0, 1], np.int64))
    at = wm.balanced_cut("a", np.arange(100, 300, dtype=np.uint64))
    assert at == 200
    assert wm.balanced_cut("a", np.empty(0, np.uint64)) == 500  # nothing bound: the middle
    assert wm.balanced_cut("b", [5, 6]) == 1000 + (TOP - 1000 + 1) // 2  # no sample inside b
    tiny = Worldmap(1, ("a", "b"), np.array([0, 1], np.uint64), np.array([0, 1], np.int64))
    with pytest.raises(ValueError, match="too small"):
        tiny.balanced_cut("a", [0])
    gone = Worldmap(1, ("a", "b"), np.array([0], np.uint64), np.array([0], np.int64))
    with pytest.raises(ValueError, match="owns no part"):
        gone.balanced_cut("b", [])


def test_x_geo_takes_moved_ranges_at_the_same_version_without_re_checks() -> None:
    geo = XGeo("a", ["w0"], FixedRing({"A": "w0"}))
    whole = binding("A", box(9.50, 47.10, 9.52, 47.12))
    n = len(whole.ranges) // 2
    half = FenceBinding("A", 1, whole.ranges[:n], whole.interior[:n])
    geo.change("A", 1, half)
    inside = batch([("o", 9.5199, 47.1199, 1.0)])
    assert not geo.route(inside)  # outside the half bound here
    assert geo.rebind("A", 1, whole) and geo.route(batch([("o", 9.5199, 47.1199, 2.0)]))
    assert not geo.rebind("A", 1, whole)  # the same ranges again: nothing to do
    assert not geo.rebind("A", 2, half)  # another version is a change, not a move
    assert geo.rebind("A", 1, None) and geo.binding("A") is None and geo.known_version("A") == 1
    assert not geo.rebind("A", 1, None)


def test_the_stack_records_its_regions_and_the_environment_wins(tmp_path: Path) -> None:
    assert read_live_topology(tmp_path) is None
    s = Settings.from_env({"GEOFENCE_STATE_DIR": str(tmp_path)})
    assert s.regions == ("a", "b")
    write_live_topology(s, ("a", "b", "c"), ("w0", "w1"))
    assert Settings.from_env({"GEOFENCE_STATE_DIR": str(tmp_path)}).regions == ("a", "b", "c")
    explicit = Settings.from_env({"GEOFENCE_STATE_DIR": str(tmp_path), "GEOFENCE_REGIONS": "a,b"})
    assert explicit.regions == ("a", "b") and explicit.workers == ("w0", "w1")
    with pytest.raises(ValueError):
        write_live_topology(s, ("a", "a"), ("w0",))
    (tmp_path / "topology.json").write_text(json.dumps({"regions": ["a"]}))
    with pytest.raises(SettingsError, match="damaged"):
        Settings.from_env({"GEOFENCE_STATE_DIR": str(tmp_path)})
