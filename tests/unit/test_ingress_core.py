"""The x-ingress core: indices, split by region, handovers when objects cross regions."""

from __future__ import annotations

import numpy as np

import hilbert_c as hk
from exchanges.batch import PositionBatch
from exchanges.fence_binding import INDEX_BITS
from exchanges.worldmap import Worldmap
from ingress.core import XIngress

WEST, EAST = (9.40, 47.10), (9.60, 47.10)


def split_map() -> Worldmap:
    """a owns the curve up to EAST's index (exclusive), b from there on."""
    h_east = hk.encode(*hk.lonlat_to_grid(*EAST, INDEX_BITS), INDEX_BITS)
    h_west = hk.encode(*hk.lonlat_to_grid(*WEST, INDEX_BITS), INDEX_BITS)
    assert h_west < h_east
    return Worldmap.single("a").split("a", h_east, "b")


def batch(points: list[tuple[str, tuple[float, float], float]]) -> PositionBatch:
    return PositionBatch([p[0] for p in points], np.array([p[1][0] for p in points]),
                         np.array([p[1][1] for p in points]), np.array([p[2] for p in points]),
                         np.zeros(len(points), np.uint64))


def ids(routed: dict[str, PositionBatch]) -> dict[str, list[tuple[str, float]]]:
    return {r: list(zip(b.ids, b.ts.tolist(), strict=True)) for r, b in routed.items()}


def test_indices_and_regions() -> None:
    ing = XIngress(split_map(), announce_unknown=False)
    out = ing.route(batch([("o1", WEST, 1.0), ("o2", EAST, 1.0)]))
    assert ids(out.positions) == {"a": [("o1", 1.0)], "b": [("o2", 1.0)]}
    assert out.handovers == {}
    x, y = hk.lonlat_to_grid(*WEST, INDEX_BITS)
    assert int(out.positions["a"].h[0]) == hk.encode(x, y, INDEX_BITS)


def test_an_object_not_seen_since_the_start_is_announced_to_every_other_region() -> None:
    ing = XIngress(split_map())  # a restarted x-ingress: it cannot tell new objects from known ones
    out = ing.route(batch([("o1", WEST, 1.0), ("o2", EAST, 1.0), ("o1", WEST, 2.0)]))
    assert ids(out.positions) == {"a": [("o1", 1.0), ("o1", 2.0)], "b": [("o2", 1.0)]}
    assert ids(out.handovers) == {"b": [("o1", 1.0)], "a": [("o2", 1.0)]}  # once, the first position
    # the first position is announced: gated on its own ts where it is, a barrier elsewhere
    a, b = out.regions["a"], out.regions["b"]
    assert a.batch.ids == ["o1", "o2", "o1"] and a.notice.tolist() == [False, True, False]
    assert a.gate.tolist() == [1.0, 0.0, 1.0] and a.announcements().tolist() == [True, True, False]
    assert b.batch.ids == ["o1", "o2"] and b.notice.tolist() == [True, False]
    assert b.gate.tolist() == [0.0, 1.0] and b.announcements().tolist() == [True, True]
    later = ing.route(batch([("o1", WEST, 3.0), ("o2", EAST, 3.0)]))
    assert later.handovers == {}
    assert all(rb.announced is None for rb in later.regions.values())
    # gated on their entries
    assert {r: rb.gate.tolist() for r, rb in later.regions.items()} == {"a": [1.0], "b": [1.0]}


def test_forget_objects_announces_them_again() -> None:
    ing = XIngress(split_map())
    ing.route(batch([("o1", WEST, 1.0)]))
    ing.forget_objects()
    assert ing.region_of_object("o1") is None
    assert ids(ing.route(batch([("o1", WEST, 2.0)])).handovers) == {"b": [("o1", 2.0)]}


def test_one_region_announces_nothing() -> None:
    ing = XIngress(Worldmap.single("a"))
    rb = ing.route(batch([("o1", WEST, 1.0)])).regions["a"]
    assert rb.announced is None and not rb.gate.any() and not rb.notice.any()


def test_announcements_travel_on_the_wire() -> None:
    from exchanges.batch import RegionBatch
    out = XIngress(split_map()).route(batch([("o1", WEST, 1.0), ("o2", EAST, 1.0)]))
    for rb in out.regions.values():
        back = RegionBatch.from_wire(rb.to_wire())
        assert back.announcements().tolist() == rb.announcements().tolist()
        assert back.gate.tolist() == rb.gate.tolist() and back.notice.tolist() == rb.notice.tolist()


def test_crossing_regions_tells_the_old_region_once() -> None:
    ing = XIngress(split_map())
    ing.route(batch([("o1", WEST, 1.0)]))
    out = ing.route(batch([("o1", EAST, 2.0)]))
    assert ids(out.positions) == {"b": [("o1", 2.0)]}
    assert ids(out.handovers) == {"a": [("o1", 2.0)]}
    assert ing.route(batch([("o1", EAST, 3.0)])).handovers == {}
    # there and back within one batch: both crossings are told, in order
    out = ing.route(batch([("o1", WEST, 4.0), ("o1", EAST, 5.0)]))
    assert ids(out.handovers) == {"b": [("o1", 4.0)], "a": [("o1", 5.0)]}
    assert ing.region_of_object("o1") == "b"


def test_a_new_worldmap_reroutes_and_hands_over() -> None:
    m = split_map()
    ing = XIngress(m, announce_unknown=False)
    ing.route(batch([("o1", WEST, 1.0)]))
    assert not ing.set_worldmap(m)  # same version: ignored
    assert ing.set_worldmap(m.join("a", "b"))  # a is gone: everything goes to b
    out = ing.route(batch([("o1", WEST, 2.0)]))
    assert ids(out.positions) == {"b": [("o1", 2.0)]} and out.handovers == {}
    assert ing.region_of_object("o1") == "b"


def test_gates_are_each_objects_entry_into_its_region_and_a_notice_gates_on_the_stay_it_ends() -> None:
    """o1 comes in to a at 2 (announced: no region known), stays at 3, crosses to b at 4,
    back to a at 6 and stays at 7, in one batch and then one by one: the same gates."""
    walk = [("o1", WEST, 2.0), ("o2", EAST, 2.0), ("o1", WEST, 3.0), ("o1", EAST, 4.0),
            ("o1", WEST, 6.0), ("o1", WEST, 7.0)]
    want = {"a": [("o1", 2.0, False, 2.0), ("o2", 2.0, True, 0.0), ("o1", 3.0, False, 2.0),
                  ("o1", 4.0, True, 2.0), ("o1", 6.0, False, 6.0), ("o1", 7.0, False, 6.0)],
            "b": [("o1", 2.0, True, 0.0), ("o2", 2.0, False, 2.0), ("o1", 4.0, False, 4.0),
                  ("o1", 6.0, True, 4.0)]}

    def rows(routed: dict[str, list[tuple[str, float, bool, float]]], out: object) -> None:
        for r, rb in out.regions.items():  # type: ignore[attr-defined]
            routed.setdefault(r, []).extend(zip(rb.batch.ids, rb.batch.ts.tolist(), rb.notice.tolist(),
                                                rb.gate.tolist(), strict=True))

    at_once: dict[str, list[tuple[str, float, bool, float]]] = {}
    rows(at_once, XIngress(split_map()).route(batch(walk)))
    assert at_once == want
    ing, one_by_one = XIngress(split_map()), {}
    for p in walk:
        rows(one_by_one, ing.route(batch([p])))
    assert one_by_one == want
