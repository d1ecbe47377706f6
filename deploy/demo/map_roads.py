"""The live map's offline background: the extract's drivable roads as GeoJSON, one
MultiLineString per road class (fastest first: the page draws them by class), each road drawn
once whatever its directions. `geofence up` writes it into the state dir when the extract is
newer than the file; the API serves it at /map/roads (GEOFENCE_MAP_ROADS)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from deploy.demo.osm_extract import EXTRACT, HIGHWAY_CLASSES, RoadNetwork, road_network

DEGREES = 5  # ~1 m


def roads_geojson(network: RoadNetwork) -> dict[str, object]:
    lo = np.minimum(network.src, network.dst)
    hi = np.maximum(network.src, network.dst)
    _, first = np.unique(lo.astype(np.int64) << 32 | hi.astype(np.int64), return_index=True)
    lon, lat = np.round(network.lon, DEGREES), np.round(network.lat, DEGREES)
    features = []
    for code, name in enumerate(HIGHWAY_CLASSES):
        edges = first[network.highway[first] == code]
        if not edges.size:
            continue
        a, b = network.src[edges], network.dst[edges]
        lines = np.stack([np.stack([lon[a], lat[a]], 1), np.stack([lon[b], lat[b]], 1)], 1)
        features.append({"type": "Feature", "properties": {"highway": name, "rank": code},
                         "geometry": {"type": "MultiLineString", "coordinates": lines.tolist()}})
    return {"type": "FeatureCollection", "features": features,
            "properties": {"source": "OpenStreetMap contributors (ODbL)", "bbox": list(network.bbox)}}


def ensure(path: Path, extract: Path = EXTRACT) -> Path:
    """Write the roads of `extract` to `path` unless it is already newer than the extract."""
    if path.is_file() and path.stat().st_mtime >= extract.stat().st_mtime:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(roads_geojson(road_network(extract)), separators=(",", ":")))
    tmp.chmod(0o644)
    os.replace(tmp, path)
    return path
