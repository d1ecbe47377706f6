"""exchanges.binding_diff: a diff applied to the version it was made from gives the new version
exactly; applied to anything else it refuses (DiffMismatch), never a wrong set of ranges."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import shapely
from hypothesis import given, settings
from hypothesis import strategies as st

import hilbert_c as hk
from exchanges import binding_diff as bd
from exchanges.fence_binding import INDEX_BITS


def covering(lon: float, lat: float, radius_deg: float, bits: int = 18) -> tuple[np.ndarray, np.ndarray]:
    cov = hk.cover(shapely.Point(lon, lat).buffer(radius_deg, 16), bits).to_bits(INDEX_BITS)
    return cov.ranges, cov.interior


def test_a_small_move_sends_few_ranges_and_applies_exactly() -> None:
    old = covering(9.52, 47.14, 0.01)
    new = covering(9.5201, 47.14, 0.01)
    d = bd.diff(*old, *new)
    assert 0 < d.size < len(old[0]) + len(new[0])  # only what changed, not both coverings
    r, f = bd.apply(*old, d)
    np.testing.assert_array_equal(r, new[0])
    np.testing.assert_array_equal(f, new[1])


def test_no_change_is_an_empty_diff() -> None:
    old = covering(9.52, 47.14, 0.01)
    d = bd.diff(*old, *old)
    assert d.size == 0
    r, _ = bd.apply(*old, d)
    np.testing.assert_array_equal(r, old[0])


def test_a_diff_onto_another_version_is_refused() -> None:
    v1, v2, v3 = covering(9.52, 47.14, 0.01), covering(9.53, 47.14, 0.01), covering(9.54, 47.15, 0.01)
    d23 = bd.diff(*v2, *v3)
    with pytest.raises(bd.DiffMismatch):
        bd.apply(*v1, d23)  # a region that missed v2
    with pytest.raises(bd.DiffMismatch):
        bd.apply(np.empty((0, 2), np.uint64), np.empty(0, bool), d23)


def test_a_flag_change_alone_is_a_change() -> None:
    r = np.array([[0, 9], [20, 29]], np.uint64)
    old_f, new_f = np.array([False, True]), np.array([True, True])
    d = bd.diff(r, old_f, r, new_f)
    assert d.add.tolist() == [[0, 9]] and d.remove.tolist() == [[0, 9]]
    assert bd.apply(r, old_f, d)[1].tolist() == [True, True]
    with pytest.raises(bd.DiffMismatch):  # same ranges, other flags: the digest tells
        bd.apply(r, np.array([False, False]), d)


def ranges_strategy() -> st.SearchStrategy[tuple[np.ndarray, np.ndarray]]:
    def build(cuts: list[int], keep: list[bool], flags: list[bool]) -> tuple[np.ndarray, np.ndarray]:
        edges = sorted(set(cuts))
        rows = [(a, b - 1) for a, b in itertools.pairwise(edges)]
        rows = [row for row, k in zip(rows, keep, strict=False) if k]
        fl = flags[: len(rows)] + [False] * (len(rows) - len(flags))
        return np.array(rows, np.uint64).reshape(-1, 2), np.array(fl, bool)

    return st.builds(build, st.lists(st.integers(0, 500), max_size=40), st.lists(st.booleans(), max_size=40),
                     st.lists(st.booleans(), max_size=40))


@settings(max_examples=300, deadline=None)
@given(ranges_strategy(), ranges_strategy())
def test_any_two_versions(old: tuple[np.ndarray, np.ndarray], new: tuple[np.ndarray, np.ndarray]) -> None:
    d = bd.diff(*old, *new)
    r, f = bd.apply(*old, d)
    np.testing.assert_array_equal(r, new[0].reshape(-1, 2))
    np.testing.assert_array_equal(f, new[1])
    assert d.size <= len(old[0]) + len(new[0])
