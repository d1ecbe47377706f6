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
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt
from shapely.geometry import mapping
from shapely.geometry.base import BaseGeometry

from exchanges.fence_binding import INDEX_BITS
from exchanges.fence_def import FenceDef, InvalidFence, check_fence_id, check_geometry, check_name
from exchanges.fence_options import check_options
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


@dataclass(frozen=True, eq=False, kw_only=True)
class FenceSpec(FenceDef):
    """A fence as a user gives it, before the store numbers it: FenceDef's fields (the
    vocabulary: exchanges/fence_def.py, the options in exchanges/fence_options/) at version 0,
    with its owner and the object it follows, if any."""

    version: int = 0
    owner: str = ""
    follow: Follow | None = None

    def cover_geometry(self) -> BaseGeometry:
        """What the bindings cover: the fence grown by its hysteresis band (or itself)."""
        return self.routed_geometry()

    def geojson(self) -> dict[str, Any]:
        return dict(mapping(self.geometry))

    @classmethod
    def of(cls, fence: FenceDef, owner: str = "", follow: Follow | None = None, **changes: Any) -> FenceSpec:
        """A stored fence as a spec again (its fields, with `changes`), to put a new version."""
        given = {f.name: getattr(fence, f.name) for f in fields(FenceDef)} | {"version": 0}
        return cls(**(given | changes), owner=owner, follow=follow)

    def definition(self, version: int) -> FenceDef:
        """The fence as the roles carry it, at `version`."""
        return FenceDef(**{f.name: getattr(self, f.name) for f in fields(FenceDef)} | {"version": version})

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
    options = check_options(props, geom)  # (before the id, as the timeout always was)
    return FenceSpec(fence_id=check_fence_id(fid), geometry=geom, name=name, owner=owner, **options)


# --------------------------------------------------------------------------- bindings


@dataclass(frozen=True, eq=False)
class Bindings:
    """A fence's covering at `bits`, expressed at INDEX_BITS, divided between regions."""

    bits: int
    per_region: dict[str, tuple[npt.NDArray[np.uint64], npt.NDArray[np.bool_]]]

    @property
    def ranges(self) -> int:
        return sum(len(r) for r, _ in self.per_region.values())


def choose_bits(geometry: BaseGeometry) -> int:
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


def bindings(geometry: BaseGeometry, worldmap: Worldmap) -> Bindings:
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
