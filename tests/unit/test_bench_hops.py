"""bench/hops.py's arithmetic: a histogram's quantile from its cumulative bucket counts (linear
within the bucket, as Prometheus's histogram_quantile), and what a run added to it."""

from __future__ import annotations

import math

import numpy as np

from bench.hops import added, quantile

BOUNDS = [0.001, 0.002, 0.005, 0.01, math.inf]


def test_quantiles_are_linear_within_their_bucket() -> None:
    cumulative = np.array([0, 10, 10, 20, 20], np.float64)  # 10 in (1, 2] ms, 10 in (5, 10] ms
    assert quantile(BOUNDS, cumulative, 50) == 0.002
    assert abs(quantile(BOUNDS, cumulative, 25) - 0.0015) < 1e-12
    assert abs(quantile(BOUNDS, cumulative, 75) - 0.0075) < 1e-12
    assert math.isnan(quantile(BOUNDS, np.zeros(5), 50))


def test_a_quantile_past_the_last_bound_is_the_last_bound() -> None:
    assert quantile(BOUNDS, np.array([0, 0, 0, 1, 10], np.float64), 99) == 0.01


def test_added_is_the_runs_share_summed_over_the_sidecars_of_a_hop() -> None:
    before = {"x-fence-w0": {"h": (BOUNDS, np.array([1, 2, 3, 4, 5], np.float64))}}
    after = {"x-fence-w0": {"h": (BOUNDS, np.array([1, 3, 4, 6, 8], np.float64))},
             "x-fence-w1": {"h": (BOUNDS, np.array([0, 0, 1, 1, 1], np.float64))},
             "x-geo-a": {"h": (BOUNDS, np.array([9, 9, 9, 9, 9], np.float64))}}
    got = added(before, after, "h", "x-fence-")
    assert got is not None and got[1].tolist() == [0, 1, 2, 3, 4]
    assert added(before, after, "other", "x-fence-") is None
