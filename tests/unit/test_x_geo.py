"""The x-geo core: routing to workers, immediate-LEAVE control, versions, recovery."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from shapely.geometry import box

import hilbert_c as hk
from exchanges.batch import PositionBatch, pack, unpack
from exchanges.contract import InvalidMessage
from exchanges.fence_binding import INDEX_BITS, FenceBinding
from exchanges.worker_batch import WorkerBatch
from exchanges.x_geo.core import XGeo


class FixedRing:
    def __init__(self, owner: dict[str, str]) -> None:
        self.owner = owner

    def node_for(self, key: str) -> str:
        return self.owner[key]

    def masters(self, key: str) -> list[str]:
        return [self.owner[key]]

    def iter_nodes(self, key: str) -> Iterator[str]:
        return iter(sorted(set(self.owner.values())))


def binding(fid: str, geom, version: int = 1, bits: int = 20) -> FenceBinding:  # type: ignore[no-untyped-def]
    cov = hk.cover(geom, bits).to_bits(INDEX_BITS)
    return FenceBinding(fid, version, cov.ranges, cov.interior)


def batch(points: list[tuple[str, float, float, float]]) -> PositionBatch:
    ids = [p[0] for p in points]
    lon = np.array([p[1] for p in points], float)
    lat = np.array([p[2] for p in points], float)
    x, y = hk.lonlat_to_grid(lon, lat, INDEX_BITS)
    return PositionBatch(ids, lon, lat, np.array([p[3] for p in points], float),
                         hk.encode_many(x, y, INDEX_BITS))


A = box(9.50, 47.10, 9.52, 47.12)   # on w0
B = box(9.53, 47.10, 9.55, 47.12)   # on w1
C = box(9.51, 47.11, 9.54, 47.13)   # overlaps A and B, on w1


@pytest.fixture
def geo() -> XGeo:
    g = XGeo("a", ["w0", "w1"], FixedRing({"A": "w0", "B": "w1", "C": "w1"}))
    for fid, geom in (("A", A), ("B", B), ("C", C)):
        g.add_binding(binding(fid, geom))
    return g


def routed(out: dict[str, WorkerBatch]) -> dict[str, list[tuple[str, list[str]]]]:
    return {w: [(wb.positions.ids[i], sorted(f for f, _ in wb.candidates(i)))
                for i in range(len(wb.positions))] for w, wb in out.items()}


def test_routes_each_position_to_the_workers_of_its_candidate_fences(geo: XGeo) -> None:
    out = geo.route(batch([("o1", 9.505, 47.105, 1), ("o2", 9.535, 47.115, 1),
                           ("o3", 9.515, 47.115, 1), ("o4", 9.60, 47.20, 1)]))
    assert routed(out) == {
        "w0": [("o1", ["A"]), ("o3", ["A"])],
        "w1": [("o2", ["B", "C"]), ("o3", ["C"])],
    }
    wb = out["w1"]
    assert all(inner for _, inner in wb.candidates(0))  # deep inside: interior blocks
    assert wb.positions.ts.tolist() == [1.0, 1.0]


def test_leaving_every_fence_of_a_worker_still_reaches_that_worker_once(geo: XGeo) -> None:
    geo.route(batch([("o1", 9.505, 47.105, 1)]))            # in A (w0)
    out = geo.route(batch([("o1", 9.60, 47.20, 2)]))         # outside everything
    assert routed(out) == {"w0": [("o1", [])]}               # the control message
    assert geo.route(batch([("o1", 9.61, 47.21, 3)])) == {}  # nobody has it any more
    assert geo.objects() == {}


def test_positions_of_one_object_in_one_batch_are_handled_in_order(geo: XGeo) -> None:
    out = geo.route(batch([("o1", 9.505, 47.105, 1), ("o1", 9.60, 47.20, 2),
                           ("o1", 9.535, 47.105, 3)]))
    assert routed(out) == {"w0": [("o1", ["A"]), ("o1", [])], "w1": [("o1", ["B"])]}
    assert geo.objects() == {"o1": ["w1"]}


def test_objects_handed_over_to_another_region(geo: XGeo) -> None:
    geo.route(batch([("o1", 9.515, 47.115, 1), ("o2", 9.60, 47.20, 1)]))  # o1 in A and C
    out = geo.objects_left(["o1", "o2"], [5.0, 5.0], [10.0, 10.0], [48.0, 48.0], [0, 0])
    # every worker hears of every notice (a worker may hold a position until it does)
    assert routed(out) == {"w0": [("o1", []), ("o2", [])], "w1": [("o1", []), ("o2", [])]}
    assert out["w0"].positions.ts.tolist() == [5.0, 5.0]
    assert out["w0"].notices().tolist() == [True, True] and out["w0"].gate is None
    assert geo.objects() == {}


def test_gates_are_passed_on_and_notices_go_to_every_worker(geo: XGeo) -> None:
    b = batch([("o1", 9.505, 47.105, 2), ("o2", 9.60, 47.20, 2), ("o1", 10.0, 48.0, 4)])
    out = geo.route(b, notice=np.array([False, False, True]), gate=np.array([2.0, 0.0, 2.0]))
    w0 = out["w0"]
    assert w0.positions.ids == ["o1", "o1"] and w0.notices().tolist() == [False, True]
    assert w0.gates().tolist() == [2.0, 2.0]
    assert geo.route(batch([("o1", 9.505, 47.105, 9)]))["w0"].gate is None


def test_announced_positions_go_to_every_worker_and_announced_notices_are_barriers(geo: XGeo) -> None:
    b = batch([("o1", 9.505, 47.105, 2), ("o2", 10.0, 48.0, 2), ("o3", 9.505, 47.105, 2)])
    out = geo.route(b, notice=np.array([False, True, False]), gate=np.array([2.0, 0.0, 0.0]),
                    announced=np.array([True, True, False]))
    assert routed(out) == {"w0": [("o1", ["A"]), ("o2", []), ("o3", ["A"])], "w1": [("o1", []), ("o2", [])]}
    assert out["w1"].barriers().tolist() == [False, True] and out["w1"].notices().tolist() == [False, True]
    back = WorkerBatch.from_wire(out["w1"].to_wire())
    assert back.barriers().tolist() == [False, True]
    assert geo.objects() == {"o1": ["w0"], "o3": ["w0"]}  # o2 left: forgotten


def test_with_announce_unknown_an_unseen_object_goes_to_every_worker_once() -> None:
    geo = XGeo("r", ["w0", "w1"], FixedRing({"A": "w0"}), announce_unknown=True)
    geo.add_binding(binding("A", A))
    assert routed(geo.route(batch([("o1", 9.505, 47.105, 1)]))) == {"w0": [("o1", ["A"])], "w1": [("o1", [])]}
    assert routed(geo.route(batch([("o1", 9.505, 47.105, 2)]))) == {"w0": [("o1", ["A"])]}
    geo.forget_objects()
    assert routed(geo.route(batch([("o1", 9.6, 47.2, 3)]))) == {"w0": [("o1", [])], "w1": [("o1", [])]}
    assert routed(geo.route(batch([("o1", 9.6, 47.2, 4)]))) == {}


def test_worker_batch_wire_keeps_notices_and_gates(geo: XGeo) -> None:
    out = geo.route(batch([("o1", 9.515, 47.115, 2), ("o1", 10.0, 48.0, 3)]),
                    notice=np.array([False, True]), gate=np.array([2.0, 2.0]))
    wb = WorkerBatch.from_wire(out["w0"].to_wire())
    assert wb.notices().tolist() == [False, True] and wb.gates().tolist() == [2.0, 2.0]
    bad = out["w0"].to_wire()
    bad["gate"] = bad["gate"][:8]
    with pytest.raises(ValueError, match="do not fit"):
        WorkerBatch.from_wire(bad)


def test_versions_make_bind_and_unbind_idempotent(geo: XGeo) -> None:
    geo.add_binding(binding("A", box(9.70, 47.10, 9.72, 47.12), version=3))  # moved
    geo.add_binding(binding("A", A, version=2))  # late, older: ignored
    assert routed(geo.route(batch([("o1", 9.505, 47.105, 1), ("o2", 9.71, 47.11, 1)]))) == {
        "w0": [("o2", ["A"])]}
    geo.remove_bindings([("A", 2)])  # stale unbind: ignored
    assert "A" in geo.fences()
    geo.remove_bindings([("A", 4), ("A", 4), ("nope", 1)])
    assert "A" not in geo.fences()
    geo.add_binding(binding("A", A, version=3))  # older than the removal: ignored
    assert "A" not in geo.fences()
    geo.add_binding(binding("A", A, version=5))
    assert geo.worker_of("A") == "w0"


def test_recover_equals_the_same_bindings_added(geo: XGeo) -> None:
    fresh = XGeo("a", ["w0", "w1"], FixedRing({"A": "w0", "B": "w1", "C": "w1"}))
    fresh.recover([binding(f, g) for f, g in (("A", A), ("B", B), ("C", C))])
    b = batch([(f"o{i}", 9.50 + i * 0.001, 47.10 + i * 0.0007, 1) for i in range(60)])
    assert routed(fresh.route(b)) == routed(geo.route(b))


def test_wire_round_trip(geo: XGeo) -> None:
    out = geo.route(batch([("o1", 9.505, 47.105, 1), ("o2", 9.535, 47.115, 2)]))
    for wb in out.values():
        back = WorkerBatch.from_wire(unpack(pack("matches", **wb.to_wire())))
        assert routed({wb.worker: back}) == routed({wb.worker: wb})
        assert np.array_equal(back.positions.h, wb.positions.h)
        assert np.array_equal(back.interior, wb.interior)


def test_validate_refuses_what_route_must_not_see(geo: XGeo) -> None:
    b = batch([("o1", 9.505, 47.105, 1)])
    bad_h = PositionBatch(b.ids, b.lon, b.lat, b.ts, np.array([4**26], np.uint64))
    with pytest.raises(InvalidMessage, match="beyond the 26-bit curve"):
        geo.validate(bad_h)
    bad_ts = PositionBatch(b.ids, b.lon, b.lat, np.array([np.nan]), b.h)
    with pytest.raises(InvalidMessage, match="timestamp"):
        geo.validate(bad_ts)
    geo.validate(b)


def test_unpack_refuses_garbage() -> None:
    with pytest.raises(ValueError, match="not a msgpack body"):
        unpack(b"\xc1garbage")
    with pytest.raises(ValueError, match="wire version"):
        unpack(b"\x81\xa1v\x07")  # {"v": 7}
