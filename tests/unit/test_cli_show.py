"""`geofence fence show` for a person (deploy/fence_cmd.fence_lines): every stored field a line,
the geometry summed up (type, polygons, vertices, bbox); `--json` gives the fence whole."""

from __future__ import annotations

from deploy.fence_cmd import fence_lines


def test_a_fence_is_shown_field_by_field_its_geometry_summed_up() -> None:
    ring = [[9.5, 47.1], [9.6, 47.1], [9.6, 47.2], [9.5, 47.1]]
    shown = fence_lines({"id": "fleet:depot", "geometry": {"type": "Polygon", "coordinates": [ring]},
                         "name": "Depot", "version": 3, "options": {"dwell_s": 60}})
    lines = shown.splitlines()
    assert lines[0].split() == ["fence", "fleet:depot"]
    assert "Polygon, 1 polygon(s), 4 vertices, bbox 9.500000,47.100000,9.600000,47.200000" in lines[1]
    assert lines[2].split() == ["name", "Depot"] and lines[3].split() == ["version", "3"]
    assert lines[4].split(None, 1) == ["options", '{"dwell_s": 60}']
    two = {"type": "MultiPolygon", "coordinates": [[ring], [ring]]}
    assert "2 polygon(s), 8 vertices" in fence_lines({"id": "f", "geometry": two})
