"""The worldmap: lookups, clipping a covering between regions, split / join, persistence."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hilbert_c as hk
from exchanges.fence_binding import INDEX_BITS
from exchanges.worldmap import TOP, Worldmap


@st.composite
def maps(draw: st.DrawFn) -> Worldmap:
    cuts = sorted(set(draw(st.lists(st.integers(1, 10_000), max_size=6))))
    regions = draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=len(cuts) + 1,
                            max_size=len(cuts) + 1))
    names = tuple(sorted(set(regions)))
    return Worldmap(1, names, np.array([0, *cuts], np.uint64),
                    np.array([names.index(r) for r in regions], np.int64))


def owner_brute(m: Worldmap, h: int) -> str:
    i = max(j for j, s in enumerate(m.starts.tolist()) if s <= h)
    return m.regions[int(m.owner[i])]


@settings(max_examples=200)
@given(maps(), st.lists(st.integers(0, 12_000), min_size=1, max_size=30),
       st.lists(st.integers(0, 12_000), max_size=12))
def test_lookup_and_clip_against_brute_force(m: Worldmap, probes: list[int], cuts: list[int]) -> None:
    assert [m.regions[i] for i in m.region_index(probes)] == [owner_brute(m, h) for h in probes]
    pts = sorted(set(cuts))
    ranges = np.array([(pts[i], pts[i + 1]) for i in range(0, len(pts) - 1, 2)], np.uint64).reshape(-1, 2)
    flags = np.arange(len(ranges)) % 2 == 0
    parts = m.clip(ranges, flags)
    covered: dict[int, tuple[str, bool]] = {}
    for region, (r, f) in parts.items():
        assert (r[:, 0] <= r[:, 1]).all()
        for (s, e), flag in zip(r.tolist(), f.tolist(), strict=True):
            for h in range(s, e + 1):
                assert h not in covered  # pieces are disjoint
                assert owner_brute(m, h) == region  # each piece lies in its region
                covered[h] = (region, flag)
    want = {h: flag for (s, e), flag in zip(ranges.tolist(), flags.tolist(), strict=True)
            for h in range(s, e + 1)}
    assert {h: f for h, (_, f) in covered.items()} == want  # nothing lost, flags kept
    for region in m.regions:  # intervals of all regions tile the curve
        for s, e in m.intervals(region).tolist():
            assert owner_brute(m, s) == region and owner_brute(m, e) == region


def test_split_and_join_move_only_what_they_say() -> None:
    m = Worldmap.single("a")
    m2 = m.split("a", 1000, "b")
    assert m2.version == 2 and m2.regions == ("a", "b")
    assert m2.region_of(999) == "a" and m2.region_of(1000) == "b" and m2.region_of(TOP) == "b"
    m3 = m2.split("b", 5000, "a")
    assert [m3.region_of(h) for h in (0, 1000, 5000)] == ["a", "b", "a"]
    assert m3.intervals("a").tolist() == [[0, 999], [5000, TOP]]
    m4 = m3.join("b", "a")
    assert m4.regions == ("a",) and m4.starts.tolist() == [0] and m4.version == 4
    with pytest.raises(ValueError, match="not in region"):
        m2.split("a", 2000, "c")
    with pytest.raises(ValueError, match="nothing to split"):
        m2.split("b", 1000, "c")


def test_balanced_split_of_real_bindings_and_json_round_trip() -> None:
    rng = np.random.default_rng(3)
    hs = []
    for _ in range(40):
        c = hk.cover(hk.circle(9.5 + rng.uniform(-0.1, 0.1), 47.1 + rng.uniform(-0.1, 0.1), 500), 20)
        hs.append(c.to_bits(INDEX_BITS).ranges[:, 0])
    sample = np.concatenate(hs)
    m = Worldmap.balanced(["a", "b"], sample)
    share = np.bincount(m.region_index(sample), minlength=2) / sample.size
    assert abs(share[0] - 0.5) < 0.01
    back = Worldmap.from_json(m.to_json())
    assert back.version == m.version and back.regions == m.regions
    assert np.array_equal(back.starts, m.starts) and np.array_equal(back.owner, m.owner)
    with pytest.raises(ValueError, match="bits per axis"):
        Worldmap.from_json({**m.to_json(), "bits": 20})


def test_invalid_maps_are_refused() -> None:
    with pytest.raises(ValueError, match="begin at 0"):
        Worldmap(1, ("a",), np.array([5], np.uint64), np.array([0]))
    with pytest.raises(ValueError, match="known region"):
        Worldmap(1, ("a",), np.array([0, 9], np.uint64), np.array([0, 1]))
    with pytest.raises(ValueError, match="repeat"):
        Worldmap(1, ("a", "a"), np.array([0, 9], np.uint64), np.array([0, 1]))
