"""ingress/partition_split.py: what an x-ingress instance keeps of a batch, what it hands on."""

from __future__ import annotations

import numpy as np
import pytest

from exchanges.batch import PositionBatch, pack
from ingress import partition_split as ps


def batch(ids: list[str]) -> PositionBatch:
    n = len(ids)
    lon = np.arange(n, dtype=np.float64)
    return PositionBatch(ids, lon, np.zeros(n), lon + 1e9, np.zeros(n, np.uint64))


class Msg:
    def __init__(self, exchange: str) -> None:
        self.exchange = exchange


def test_split_keeps_its_own_and_groups_the_rest_by_partition_in_order() -> None:
    b = batch([f"t:o{i}" for i in range(8)])
    parts = np.array([0, 3, 1, 3, 0, 2, 3, 1])
    owned = np.array([True, False, True, False])  # partitions 0 and 2 are this instance's
    mine, others = ps.split(b, parts, owned)
    assert mine.ids == ["t:o0", "t:o4", "t:o5"]
    assert {p: o.ids for p, o in others.items()} == {1: ["t:o2", "t:o7"], 3: ["t:o1", "t:o3", "t:o6"]}
    assert others[3].lon.tolist() == [1.0, 3.0, 6.0]


def test_split_of_a_batch_it_owns_is_the_batch() -> None:
    b = batch(["t:a", "t:b"])
    mine, others = ps.split(b, np.array([0, 1]), np.array([True, True]))
    assert mine is b and others == {}


def test_every_position_is_kept_or_handed_on_once() -> None:
    rng = np.random.default_rng(3)
    ids = [f"t:o{i}" for i in range(500)]
    parts = rng.integers(0, 16, 500)
    owned = rng.random(16) < 0.5
    mine, others = ps.split(batch(ids), parts, owned)
    handed = [i for o in others.values() for i in o.ids]
    assert sorted(mine.ids + handed) == sorted(ids)
    assert all(not owned[p] for p in others)
    assert all(parts[int(i[3:])] == p for p, o in others.items() for i in o.ids)


def test_of_tenants() -> None:
    b = batch(["a:1", "b:2", "a:3", "c:4"])
    assert ps.of_tenants(b, frozenset({"a"})).ids == ["a:1", "a:3"]
    assert ps.of_tenants(b, frozenset({"a", "c"})).ids == ["a:1", "a:3", "c:4"]
    assert len(ps.of_tenants(b, frozenset())) == 0
    assert ps.of_tenants(b, frozenset({"a", "b", "c"})) is b


def test_hand_ons_are_the_default_exchanges_and_read_back() -> None:
    assert ps.handed_on(Msg("")) and not ps.handed_on(Msg("amq.topic"))
    b = batch(["t:x", "t:y"])
    back, origin, seq = ps.read_handed_on(pack(ps.HANDED_ON, batch=b.to_wire(), origin="tok", seq=7))
    assert back.ids == b.ids and back.ts.tolist() == b.ts.tolist() and (origin, seq) == ("tok", 7)
    assert ps.read_handed_on(pack(ps.HANDED_ON, batch=b.to_wire()))[1:] == (None, 0)
    with pytest.raises(ValueError):
        ps.read_handed_on(pack("positions", batch=b.to_wire()))
    with pytest.raises(ValueError):
        ps.read_handed_on(b"{not msgpack")


def test_runs() -> None:
    assert ps.runs([Msg(""), Msg(""), Msg("amq.topic"), Msg("")], ps.handed_on) == [
        (True, 0, 2), (False, 2, 3), (True, 3, 4)]
    assert ps.runs([], ps.handed_on) == []
