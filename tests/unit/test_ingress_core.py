"""The x-ingress core: indices, split by region, handovers when objects cross regions."""

from __future__ import annotations

import numpy as np

import hilbert_c as hk
from exchanges.batch import PositionBatch
from exchanges.range_index import INDEX_BITS
from ingress.core import XIngress
from ingress.worldmap import Worldmap

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
    assert all(not rb.entered.any() for rb in out.regions.values())  # nobody waits for those notices
    assert ing.route(batch([("o1", WEST, 3.0), ("o2", EAST, 3.0)])).handovers == {}


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
