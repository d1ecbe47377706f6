"""The public hive search (fence/venues/hive_index.py) and opening hours (reads.open_now):
proximity by great-circle distance over the longitude band (across the antimeridian too),
type and name filters, accents and case, and the queries refused."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from fence.venues.hive_index import HiveCard, HiveIndex, SearchError, distance_m, fold, parse_near
from fence.venues.reads import open_now


def card(hid: str, name: str, kind: str, lon: float, lat: float) -> HiveCard:
    return HiveCard(hid, name, kind, "", lon, lat, "Europe/Vaduz", 50, {})


INDEX = HiveIndex([card("a", "Café Zürich", "cafe", 9.5210, 47.1410),
                   card("b", "Bar Zürich", "bar", 9.5230, 47.1420),
                   card("c", "Rhein shop", "shop", 9.6000, 47.2000),
                   card("d", "Date line bar", "bar", 179.999, -16.5),
                   card("e", "Other side", "bar", -179.999, -16.5)])


def ids(found: list[tuple[HiveCard, float | None]]) -> list[str]:
    return [c.hive_id for c, _ in found]


def test_near_sorts_by_distance_within_the_radius() -> None:
    found = INDEX.search(parse_near("9.5210,47.1410", 500), None, None)
    assert ids(found) == ["a", "b"] and found[0][1] == 0.0
    assert found[1][1] == pytest.approx(distance_m(9.5210, 47.1410, 9.5230, 47.1420))
    assert ids(INDEX.search(parse_near("9.5210,47.1410", 20_000), None, None)) == ["a", "b", "c"]


def test_the_band_reaches_across_the_antimeridian() -> None:
    found = INDEX.search(parse_near("179.9995,-16.5", 1000), None, None)
    assert sorted(ids(found)) == ["d", "e"] and all(d is not None and d < 200 for _, d in found)


def test_type_and_name_filters_fold_case_and_accents() -> None:
    assert ids(INDEX.search(None, "bar", None)) == ["b", "d", "e"]  # by name without `near`
    assert ids(INDEX.search(None, None, "ZURICH")) == ["b", "a"]
    assert ids(INDEX.search(None, None, "café zür")) == ["a"]
    assert ids(INDEX.search(None, "shop", "zurich")) == []
    assert fold("Ärger Café") == "arger cafe"


def test_changes_to_the_index() -> None:
    index = HiveIndex([card("x", "One", "bar", 1.0, 1.0)])
    index.add(card("x", "Moved", "bar", 2.0, 1.0))  # replaced, not doubled
    assert len(index) == 1 and ids(index.search(parse_near("2,1", 100), None, None)) == ["x"]
    index.remove("x")
    assert len(index) == 0 and index.search(None, None, None) == []
    assert HiveIndex.from_json(INDEX.to_json()).to_json() == INDEX.to_json()


@pytest.mark.parametrize(("near", "radius", "why"), [
    ("9.5", None, "lon,lat expected"), ("x,y", None, "lon,lat expected"), ("200,1", None, "lon in"),
    ("1,1", 0.0, "radius_m"), ("1,1", 60_000.0, "radius_m"), (None, 100.0, "radius_m needs near"),
])
def test_bad_queries_are_refused_with_a_reason(near: str | None, radius: float | None, why: str) -> None:
    with pytest.raises(SearchError, match=why):
        parse_near(near, radius)


def test_a_limit_out_of_range_is_refused() -> None:
    with pytest.raises(SearchError, match="limit"):
        INDEX.search(None, None, None, limit=0)


def test_open_now_by_local_hours_including_past_midnight() -> None:
    hours = {"fri": [["11:00", "14:00"], ["18:00", "02:00"]], "sat": [["18:00", "02:00"]]}

    def at(d: int, h: int, m: int = 0) -> float:  # 2026-01-xx in Vaduz (UTC+1)
        return datetime(2026, 1, d, h - 1, m, tzinfo=UTC).timestamp()
    assert open_now(hours, "Europe/Vaduz", at(9, 12)) is True  # Friday lunch
    assert open_now(hours, "Europe/Vaduz", at(9, 15)) is False
    assert open_now(hours, "Europe/Vaduz", at(10, 1, 30)) is True  # Friday's evening runs into Saturday
    assert open_now(hours, "Europe/Vaduz", at(10, 2, 30)) is False
    assert open_now(hours, "Europe/Vaduz", at(11, 1)) is True  # Saturday's, into Sunday
    assert open_now({}, "Europe/Vaduz", at(9, 12)) is None
