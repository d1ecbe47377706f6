"""x-fence's held rows (fence/x_fence/held.py) against the rules written row by row (the
per-object loop the columns replaced): the same rows go, in each object's order, with the
same count of expired holds; and the durable form, new and earlier, round-trips."""

from __future__ import annotations

import random

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exchanges.batch import PositionBatch
from exchanges.worker_batch import WorkerBatch
from fence.x_fence.held import Held

HOLD_S = 300.0


def rows(specs: list[tuple[int, int, float, float]]) -> tuple[WorkerBatch, np.ndarray]:
    """(object code, origin, gate, ts) per row -> a batch (ids o<code>) and the codes."""
    n = len(specs)
    pos = PositionBatch([f"o{c}" for c, _, _, _ in specs], np.full(n, 9.5), np.full(n, 47.1),
                        np.array([t for *_, t in specs], float), np.zeros(n, np.uint64))
    wb = WorkerBatch("w0", pos, np.zeros(n + 1, np.int64), [], np.empty(0, np.int32), np.empty(0, bool),
                     None, np.array([g for _, _, g, _ in specs], float), None,
                     np.array([o for _, o, _, _ in specs], np.int64))
    return wb, np.array([c for c, *_ in specs], np.int64)


def by_the_rules(held: list[tuple[int, int, float, float, float]], ho: np.ndarray, now: float | None
                 ) -> tuple[list[tuple[int, float]], int, list[tuple[int, int, float, float, float]]]:
    """The row-by-row rules: per object in arrival order, a region's row waits behind a
    held one of the same region; (code, ts) of the rows that go, expired count, rows kept."""
    go, kept, expired = [], [], 0
    stuck: set[tuple[int, int]] = set()
    for c, o, g, t, at in held:
        open_ = g <= ho[c] and (o == 0 or (c, o) not in stuck)
        if open_ or (now is not None and now - at >= HOLD_S):
            go.append((c, t))
            expired += not open_
        else:
            kept.append((c, o, g, t, at))
            stuck.add((c, o))
    return go, expired, kept


row_spec = st.tuples(st.integers(0, 5), st.integers(0, 2), st.sampled_from([0.0, 10.0, 20.0, 30.0]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(row_spec, min_size=1, max_size=8), min_size=1, max_size=5),
       st.lists(st.sampled_from([0.0, 10.0, 20.0, 30.0]), min_size=6, max_size=6),
       st.sampled_from([None, 1_000.0, 1_250.0, 2_000.0]), st.integers(0, 2**32 - 1))
def test_ready_lets_go_what_the_rules_let_go(adds: list[list[tuple[int, int, float]]], ho_list: list[float],
                                             now: float | None, seed: int) -> None:
    rng = random.Random(seed)
    held, model = Held(), []
    t = 0.0
    for i, add in enumerate(adds):
        at = 900.0 + 100.0 * i + rng.random()
        specs = []
        for c, o, g in add:
            t += 1.0
            specs.append((c, o, g, t))
            model.append((c, o, g, t, at))
        wb, codes = rows(specs)
        held.add(wb, codes, at)
    ho = np.array(ho_list)
    want_go, want_expired, want_kept = by_the_rules(model, ho, now)
    got, codes, expired = held.ready(ho, now, HOLD_S)
    got_rows = [] if got is None else list(zip(codes.tolist(), got.positions.ts.tolist(), strict=True))
    assert sorted(got_rows) == sorted(want_go) and expired == want_expired
    for c in set(codes.tolist()):  # each object's rows in arrival (ts) order
        ts = [t for cc, t in got_rows if cc == c]
        assert ts == sorted(ts)
    assert len(held) == len(want_kept)
    assert sorted(held._column("codes").tolist()) == sorted(c for c, *_ in want_kept)


def test_a_row_behind_a_held_row_of_its_region_waits_and_goes_with_it() -> None:
    held = Held()
    wb, codes = rows([(1, 1, 20.0, 1.0), (1, 1, 0.0, 2.0), (1, 2, 0.0, 3.0)])
    held.add(wb, codes, 1_000.0)
    ho = np.zeros(3)
    got, c, _ = held.ready(ho, None, HOLD_S)  # region 2's row goes; region 1's second waits
    assert got is not None and got.positions.ts.tolist() == [3.0] and c.tolist() == [1] and len(held) == 2
    ho[1] = 20.0
    got, c, _ = held.ready(ho, None, HOLD_S)
    assert got is not None and got.positions.ts.tolist() == [1.0, 2.0] and c.tolist() == [1, 1] and not held


def test_pair_keys_and_codes_name_what_is_held() -> None:
    held = Held()
    wb, codes = rows([(3, 1, 5.0, 1.0), (7, 2, 5.0, 2.0), (3, 1, 5.0, 3.0)])
    held.add(wb, codes, 0.0)
    assert held.codes().tolist() == [3, 7]
    assert held.pair_keys().tolist() == [3 * (1 << 20) + 1, 7 * (1 << 20) + 2]


def test_the_durable_form_round_trips_and_reads_the_per_row_form() -> None:
    held = Held()
    for i in range(3):
        wb, codes = rows([(i, 1, 9.0, float(i)), (i + 5, 0, 9.0, float(i) + 0.5)])
        held.add(wb, codes, 100.0 + i)
    back = Held.unpack(msgpack.unpackb(msgpack.packb(held.pack(), use_bin_type=True), raw=False))
    assert back.pack() == held.pack() and len(back) == 6
    one, code = rows([(4, 1, 9.0, 7.0)])
    old = [[int(code[0]), one.to_wire(), 55.0]]  # what snapshots before the columns hold
    got = Held.unpack(msgpack.unpackb(msgpack.packb(old, use_bin_type=True), raw=False))
    assert got.codes().tolist() == [4] and got._column("at").tolist() == [55.0]


def test_a_damaged_entry_is_refused() -> None:
    wb, codes = rows([(1, 1, 9.0, 1.0), (2, 1, 9.0, 2.0)])
    with pytest.raises(ValueError, match="2 codes and 1 times for 2 rows"):
        Held.unpack([[codes.tolist(), wb.to_wire(), [1.0]]])
