"""Reading the shipped OpenStreetMap extract (c) OpenStreetMap contributors, ODbL 1.0.

pyosmium assembles multipolygon relations into areas; we keep what the benchmarks, tests and
demo need as shapely geometries in lon/lat.
"""

from __future__ import annotations

from pathlib import Path

import shapely
from shapely.geometry import MultiPolygon

EXTRACT = Path(__file__).resolve().parent / "data" / "liechtenstein-2013-08-03.osm.pbf"
OSM_CREDIT = "(c) OpenStreetMap contributors, ODbL 1.0"


def municipalities(path: Path = EXTRACT) -> dict[str, MultiPolygon]:
    """Named municipality boundaries (admin_level 8), by name, sorted by name."""
    import osmium  # heavy, and only needed here

    wkb = osmium.geom.WKBFactory()
    found: dict[str, MultiPolygon] = {}
    areas = osmium.FileProcessor(str(path)).with_areas(
        osmium.filter.TagFilter(("boundary", "administrative"))
    )
    for obj in areas:
        if not isinstance(obj, osmium.osm.Area):
            continue
        tags = obj.tags
        name = tags.get("name")
        if tags.get("boundary") == "administrative" and tags.get("admin_level") == "8" and name:
            geom = shapely.from_wkb(bytes.fromhex(wkb.create_multipolygon(obj)))
            if isinstance(geom, MultiPolygon) and geom.is_valid:
                found[name] = geom
    return dict(sorted(found.items()))
