"""Attribute filters (exchanges/fence_options/filters.py), fuzzed against a direct reading of the rules, and
spatial queries filtered by the extra fields of the objects' latest positions."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exchanges.batch import PositionBatch
from exchanges.fence_options import filters
from exchanges.hash_ring import HashRing
from exchanges.worldmap import Worldmap
from exchanges.x_geo import queries
from exchanges.x_geo.core import XGeo
from ingress.core import XIngress

VALUES = st.one_of(st.sampled_from(["truck", "van", "car", ""]), st.integers(-5, 50),
                   st.floats(-5, 50, allow_nan=False), st.booleans())
EXTRA = st.one_of(st.none(), st.dictionaries(st.sampled_from(["type", "speed", "cold"]), VALUES, max_size=3))
CLAUSE = st.one_of(
    st.tuples(st.sampled_from(["type", "speed", "cold"]), st.sampled_from(["==", "!="]), VALUES),
    st.tuples(st.sampled_from(["speed", "type"]), st.sampled_from(["<", "<=", ">", ">="]),
              st.integers(-5, 50)),
    st.tuples(st.sampled_from(["type", "speed"]), st.just("in"),
              st.lists(VALUES, min_size=1, max_size=4)),
    st.tuples(st.just("speed"), st.just("between"), st.integers(-5, 20), st.integers(20, 50)),
)


def number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def same(a: Any, b: Any) -> bool:
    """JSON equality: numbers by value (3 == 3.0), else the same type and value."""
    if number(a) and number(b):
        return float(a) == float(b)
    return type(a) is type(b) and a == b


def holds(extra: dict[str, Any] | None, clause: tuple[Any, ...]) -> bool:
    field, op, *args = clause
    present = extra is not None and field in extra
    v = extra.get(field) if extra else None
    if op == "!=":
        return not present or not same(v, args[0])
    if not present:
        return False
    if op == "==":
        return same(v, args[0])
    if op == "in":
        return any(same(v, a) for a in args[0])
    if not number(v):
        return False
    if op == "between":
        return args[0] <= v <= args[1]
    return {"<": v < args[0], "<=": v <= args[0], ">": v > args[0], ">=": v >= args[0]}[op]


@settings(max_examples=300, deadline=None)
@given(st.lists(CLAUSE, max_size=3), st.lists(EXTRA, max_size=30))
def test_a_filter_holds_exactly_where_every_clause_does(clauses: list[tuple[Any, ...]],
                                                       extras: list[dict[str, Any] | None]) -> None:
    parsed = filters.parse([list(c) for c in clauses])
    assert filters.parse(filters.to_wire(parsed)) == parsed
    got = filters.matches(parsed, extras).tolist()
    assert got == [all(holds(e, c) for c in clauses) for e in extras]


@pytest.mark.parametrize(("raw", "says"), [
    ("type == truck", "a list"),
    ([["type"]], "field, op, value"),
    ([["type", "~", "x"]], "op"),
    ([["", "==", 1]], "field"),
    ([["speed", ">", "fast"]], "finite number"),
    ([["speed", ">", float("nan")]], "finite number"),
    ([["speed", "between", 5, 1]], "lo <= hi"),
    ([["speed", "between", 5]], "between"),
    ([["type", "in", []]], "in"),
    ([["type", "in", "truck"]], "in"),
    ([["type", "==", {"a": 1}]], "a string"),
    ([["type", "==", 1, 2]], "=="),
    ([["speed", ">", 1]] * 17, "at most 16"),
])
def test_a_bad_filter_says_what_is_wrong(raw: Any, says: str) -> None:
    with pytest.raises(filters.InvalidFilter, match=says):
        filters.parse(raw)


def test_queries_filter_on_the_latest_positions_fields() -> None:
    area = (9.50, 47.10, 9.56, 47.16)
    wm = Worldmap.over_area(["a", "b"], area)
    geo = {r: XGeo(r, ["w0"], HashRing(["w0"])) for r in wm.regions}
    ingress = XIngress(wm)
    rng = np.random.default_rng(7)
    kinds = ["truck", "van", "car"]
    truth: dict[str, dict[str, Any] | None] = {}
    for t in range(3):
        n = 200
        lon, lat = rng.uniform(9.50, 9.56, n), rng.uniform(47.10, 47.16, n)
        extra: list[dict[str, Any] | None] = [
            None if i % 7 == 0 else {"type": kinds[(i + t) % 3], "speed": float(rng.integers(0, 40))}
            for i in range(n)]
        ids = [f"o{i:03d}" for i in range(n)]
        batch = PositionBatch(ids, lon, lat, np.full(n, 10.0 + t), np.zeros(n, np.uint64), extra)
        for region, rb in ingress.route(batch).regions.items():
            geo[region].route(rb.batch, notice=rb.notice, gate=rb.gate, announced=rb.announced)
        truth = dict(zip(ids, extra, strict=True))
    where = [["type", "in", ["truck", "van"]], ["speed", ">=", 20]]
    q = queries.parse({"query": "bbox", "bbox": list(area), "limit": 10_000, "where": where})
    got = queries.merge(q, [g.query(q) for g in geo.values()])["objects"]
    want = sorted(o for o, e in truth.items() if e and e["type"] in ("truck", "van") and e["speed"] >= 20)
    assert [r["id"] for r in got] == want and len(want) > 20
    assert all(r["fields"] == truth[r["id"]] for r in got)  # the latest position's fields
    near = queries.parse({"query": "nearby", "point": [9.53, 47.13], "radius_m": 5000, "limit": 5,
                          "where": [["type", "==", "car"]]})
    rows = queries.merge(near, [g.query(near) for g in geo.values()])["objects"]
    assert len(rows) == 5 and all(truth[r["id"]]["type"] == "car" for r in rows)  # type: ignore[index]
    assert [r["distance_m"] for r in rows] == sorted(r["distance_m"] for r in rows)
    with pytest.raises(queries.InvalidQuery, match="op"):
        queries.parse({"query": "bbox", "bbox": list(area), "where": [["type", "like", "t%"]]})
