"""A fence as users give it (a GeoJSON Feature), validated, and its Hilbert bindings.

Pure: GeoJSON in, a FenceSpec and per-region ranges out. The budget that keeps routing
cheap is explicit: at most MAX_VERTICES vertices, and a covering of at most MAX_RANGES
ranges at a level chosen from the fence's size (cells about 1/CELLS_ACROSS of its extent, so a
500 m circle and a 5 km district both get a few hundred ranges, and the share of positions
that need the exact polygon test stays small).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from shapely.geometry import MultiPolygon, Polygon, mapping

from exchanges import filters
from exchanges.fence_binding import INDEX_BITS
from exchanges.fence_def import (
    DEFAULT_TIMEOUT_S,
    FenceDef,
    InvalidFence,
    check_cross,
    check_dwell,
    check_fence_id,
    check_geometry,
    check_hysteresis,
    check_name,
    check_timeout,
    check_where,
)
from exchanges.worldmap import Worldmap
from hilbert_c.covering import Covering, _flatten, coarsen, cover_flat

MAX_RANGES = 4_096
CELLS_ACROSS = 64  # cells across the fence's larger bbox side
MIN_BITS, MAX_BITS = 10, 24


@dataclass(frozen=True)
class Follow:
    """The fence is a circle of radius_m around object_id's latest position (fence/follow.py)."""

    object_id: str
    radius_m: float

    def to_json(self) -> dict[str, Any]:
        return {"object_id": self.object_id, "radius_m": self.radius_m}


@dataclass(frozen=True, eq=False)
class FenceSpec:
    fence_id: str
    geometry: Polygon | MultiPolygon
    name: str = ""
    timeout_s: float = DEFAULT_TIMEOUT_S
    owner: str = ""
    follow: Follow | None = None
    hysteresis_m: float = 0.0  # exchanges/fence_def.py `hysteresis_zones`
    where: tuple[filters.Clause, ...] = ()  # exchanges/fence_def.py FenceDef.where
    dwell_s: float = 0.0  # exchanges/fence_def.py FenceDef.dwell_s
    cross: bool = False  # exchanges/fence_def.py FenceDef.cross

    def cover_geometry(self) -> Polygon | MultiPolygon:
        """What the bindings cover: the fence grown by its hysteresis band (or itself)."""
        return self.definition(0).routed_geometry()

    def geojson(self) -> dict[str, Any]:
        return dict(mapping(self.geometry))

    def definition(self, version: int) -> FenceDef:
        """The fence as the roles carry it, at `version`."""
        return FenceDef(self.fence_id, version, self.geometry, self.timeout_s, self.name, self.hysteresis_m,
                        self.where, self.dwell_s, self.cross)

    def bbox(self) -> tuple[float, float, float, float]:
        x0, y0, x1, y1 = self.geometry.bounds
        return float(x0), float(y0), float(x1), float(y1)


def named_fence_id(feature: Mapping[str, Any]) -> Any:
    """The fence id a Feature names itself, None if none: properties.fence_id, else the
    Feature's id, else properties.id; whatever it is (the caller checks it)."""
    props = feature.get("properties")
    if not isinstance(props, Mapping):
        props = {}
    return next((v for v in (props.get("fence_id"), feature.get("id"), props.get("id"))
                 if v is not None), None)


def from_feature(feature: Any, fence_id: str | None = None, owner: str = "") -> FenceSpec:
    """A FenceSpec from a GeoJSON Feature (properties: id or fence_id, name, timeout_s,
    hysteresis_m, where, dwell_s, cross); `fence_id` overrides the id in the feature."""
    if not isinstance(feature, Mapping) or feature.get("type") != "Feature":
        raise InvalidFence("expected a GeoJSON Feature ({\"type\": \"Feature\", \"geometry\": ..., "
                           "\"properties\": ...})")
    props = feature.get("properties")
    if props is None:  # GeoJSON: a Feature without properties has "properties": null
        props = {}
    if not isinstance(props, Mapping):  # [], 0, false, "" too: not "no properties"
        raise InvalidFence("the Feature's properties must be an object (or null)")
    # the first id given wins, whatever it is: an empty or numeric id is refused, never
    # skipped for the next source (nor coerced)
    fid = fence_id if fence_id is not None else named_fence_id(feature)
    name = check_name(props.get("name", ""))
    geometry = feature.get("geometry")
    if not isinstance(geometry, Mapping):
        raise InvalidFence("the Feature has no geometry object")
    geom = check_geometry(geometry)
    timeout = check_timeout(props.get("timeout_s", DEFAULT_TIMEOUT_S))
    return FenceSpec(check_fence_id(fid), geom, name, timeout, owner,
                     hysteresis_m=check_hysteresis(props.get("hysteresis_m", 0), geom),
                     where=check_where(props.get("where")), dwell_s=check_dwell(props.get("dwell_s", 0)),
                     cross=check_cross(props.get("cross", False)))


# --------------------------------------------------------------------------- bindings


@dataclass(frozen=True, eq=False)
class Bindings:
    """A fence's covering at `bits`, expressed at INDEX_BITS, divided between regions."""

    bits: int
    per_region: dict[str, tuple[npt.NDArray[np.uint64], npt.NDArray[np.bool_]]]

    @property
    def ranges(self) -> int:
        return sum(len(r) for r, _ in self.per_region.values())


def choose_bits(geometry: Polygon | MultiPolygon) -> int:
    """The level whose cells are about 1/CELLS_ACROSS of the fence's larger extent."""
    return choose_bits_bounds(*geometry.bounds)


def choose_bits_bounds(x0: float, y0: float, x1: float, y1: float) -> int:
    extent = max((x1 - x0) / 360.0, (y1 - y0) / 180.0, 1e-12)  # as a share of the grid
    bits = math.ceil(math.log2(CELLS_ACROSS / extent))
    return max(MIN_BITS, min(MAX_BITS, bits))


Flat = tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.int64]]


def covering(flat: Flat, budget: int = MAX_RANGES) -> tuple[int, Covering]:
    """A fence's whole covering (no region cuts) at its level, expressed at INDEX_BITS."""
    lon, lat, ends = flat
    bits = choose_bits_bounds(float(lon.min()), float(lat.min()), float(lon.max()), float(lat.max()))
    return bits, cover_flat(lon, lat, ends, bits, max_ranges=budget).to_bits(INDEX_BITS)


def bindings(geometry: Polygon | MultiPolygon, worldmap: Worldmap) -> Bindings:
    return bindings_flat(_flatten(geometry), worldmap)


def bindings_flat(flat: Flat, worldmap: Worldmap, first: tuple[int, Covering] | None = None) -> Bindings:
    """Within MAX_RANGES in all: clipping at region boundaries can add a range per boundary
    crossed, so the covering is coarsened by that much when it does. `first`: the whole
    covering when already computed (the nightly rebuild computes it once per fence)."""
    return bindings_of(first if first is not None else covering(flat), worldmap)


def bindings_of(first: tuple[int, Covering], worldmap: Worldmap) -> Bindings:
    """`bindings_flat` from the whole covering alone: a smaller budget's covering is the
    whole one coarsened (hilbert_c.covering.coarsen), so the geometry is not needed again."""
    bits, whole = first
    cov, budget = whole, MAX_RANGES
    while True:
        b = Bindings(bits, worldmap.clip(cov.ranges, cov.interior))
        if b.ranges <= MAX_RANGES or budget <= 1:
            return b
        budget = max(1, budget - (b.ranges - MAX_RANGES))
        cov = coarsen(whole, budget)
