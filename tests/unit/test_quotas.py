"""fence/quotas.py's pure rule (`exceeded`: past a cap and growing) and vertex count, and
`geofence tenant quota`'s --set parsing; the rest (locks, counts, the API's 403s) against the
running stack in tests/integration/test_quotas_live.py."""

from __future__ import annotations

import pytest
from shapely.geometry import MultiPolygon, Polygon, box

from deploy.tenant_cmd import parse_sets, quota_lines
from fence.quotas import RESOURCES, exceeded, vertices_of
from fence.tenants import TenantError

CAPS = {"fences": 2, "vertices": 100, "follow_fences": 1, "subscriptions": 3}
NONE = {"fences": 0, "vertices": 0, "follow_fences": 0, "subscriptions": 0}


def test_within_the_caps_nothing_is_said() -> None:
    assert exceeded("t", NONE, {"fences": 1, "vertices": 100, "follow_fences": 1}, {}, CAPS) is None
    held = {**NONE, "fences": 1, "vertices": 50}
    assert exceeded("t", held, {"fences": 1, "vertices": 50, "follow_fences": 0}, {}, CAPS) is None


def test_a_new_thing_past_a_cap_is_named_with_the_numbers() -> None:
    held = {**NONE, "fences": 2, "vertices": 10}
    msg = exceeded("fleet", held, {"fences": 1, "vertices": 5, "follow_fences": 0}, {}, CAPS)
    assert msg is not None and msg.startswith("tenant 'fleet' would hold 3 live fences; its quota is 2")
    assert "geofence tenant quota fleet --set fences=N" in msg
    msg = exceeded("t", {**NONE, "vertices": 90}, {"fences": 1, "vertices": 11, "follow_fences": 0}, {}, CAPS)
    assert msg is not None and "101 vertices in its live fences; its quota is 100" in msg


def test_a_change_that_does_not_grow_is_never_refused_even_over_a_lowered_cap() -> None:
    held = {**NONE, "fences": 5, "vertices": 500, "follow_fences": 3}  # over every cap already
    before = {"fences": 1, "vertices": 40, "follow_fences": 1}
    assert exceeded("t", held, {"fences": 1, "vertices": 40, "follow_fences": 1}, before, CAPS) is None
    assert exceeded("t", held, {"fences": 1, "vertices": 10, "follow_fences": 0}, before, CAPS) is None
    msg = exceeded("t", held, {"fences": 1, "vertices": 41, "follow_fences": 1}, before, CAPS)
    assert msg is not None and "vertices" in msg  # grew: refused


def test_vertices_are_every_position_of_every_ring() -> None:
    assert vertices_of(box(0, 0, 1, 1)) == 5
    with_hole = Polygon([(0, 0), (4, 0), (4, 4), (0, 4)], [[(1, 1), (2, 1), (2, 2), (1, 1)]])
    assert vertices_of(with_hole) == 9
    assert vertices_of(MultiPolygon([box(0, 0, 1, 1), box(2, 2, 3, 3)])) == 10


def test_quota_sets_are_parsed_or_refused() -> None:
    assert parse_sets(["fences=5", "vertices=default", "subscriptions=0"]) == [
        ("fences", 5), ("vertices", None), ("subscriptions", 0)]
    for bad in ("fences", "fences=-1", "fences=1.5", "fences=", "nope=1", "fences=9999999999999999"):
        with pytest.raises(TenantError, match="--set"):
            parse_sets([bad])


def test_the_quota_table_names_every_resource() -> None:
    report = {k: {"max": 10, "used": 1, "default": k != "fences"} for k in RESOURCES}
    text = quota_lines("fleet", report)
    assert all(k in text for k in RESOURCES) and "(set)" in text and "(default)" in text
