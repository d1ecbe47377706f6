"""A fence as users give it (a GeoJSON Feature), validated, and its Hilbert bindings.

Pure: GeoJSON in, a FenceSpec and per-region ranges out. The budget that keeps routing
cheap is explicit: at most MAX_VERTICES vertices, and a covering of at most MAX_RANGES
ranges at a level chosen from the fence's size (cells about 1/CELLS_ACROSS of its extent, so a
500 m circle and a 5 km district both get a few hundred ranges, and the share of positions
that need the exact polygon test stays small).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import shapely
from shapely.geometry import MultiPolygon, Polygon, mapping

import hilbert_c as hk
from exchanges.range_index import INDEX_BITS
from hilbert_c.covering import Covering, _flatten, coarsen, cover_flat
from ingress.worldmap import Worldmap

FENCE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
MAX_VERTICES = 10_000
MAX_RANGES = 4_096
CELLS_ACROSS = 64  # cells across the fence's larger bbox side
MIN_BITS, MAX_BITS = 10, 24
MAX_EXTENT_DEG = 10.0  # a fence larger than this is refused (the covering grows with area)
DEFAULT_TIMEOUT_S = 300.0


class InvalidFence(ValueError):
    """What is wrong with a fence, in words a user can act on."""


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

    def geojson(self) -> dict[str, Any]:
        return dict(mapping(self.geometry))

    def bbox(self) -> tuple[float, float, float, float]:
        x0, y0, x1, y1 = self.geometry.bounds
        return float(x0), float(y0), float(x1), float(y1)


def shown(value: Any, limit: int = 80) -> str:
    """A value as an error message names it: its repr, cut to `limit` characters (the input
    may be huge; an integer of thousands of digits has no repr at all)."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def check_fence_id(fence_id: Any) -> str:
    if not isinstance(fence_id, str) or not FENCE_ID_RE.fullmatch(fence_id):
        raise InvalidFence(f"fence id {shown(fence_id)}: 1-64 characters from A-Z a-z 0-9 _ -, "
                           "starting with a letter or digit")
    return fence_id


def check_timeout(value: Any) -> float:
    # compared as given, never converted first: an integer beyond float range (JSON has no
    # limit) must be refused, not raise OverflowError; NaN fails every comparison
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 7 * 86400:
        raise InvalidFence(f"timeout_s {shown(value)}: a number of seconds in (0, 604800]")
    return float(value)


def check_name(name: Any) -> str:
    """A fence's name: text PostgreSQL can store (no NUL character, no lone surrogate)."""
    if not isinstance(name, str) or len(name) > 200:
        raise InvalidFence("name must be a string of at most 200 characters")
    if not is_storable(name):
        raise InvalidFence(f"name {shown(name)}: a NUL character or invalid Unicode (a lone surrogate)")
    return name


def is_storable(text: str) -> bool:
    """PostgreSQL's text refuses NUL, and UTF-8 has no lone surrogates (JSON's "\\ud800")."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def named_fence_id(feature: Mapping[str, Any]) -> Any:
    """The fence id a Feature names itself, None if none: properties.fence_id, else the
    Feature's id, else properties.id; whatever it is (the caller checks it)."""
    props = feature.get("properties")
    if not isinstance(props, Mapping):
        props = {}
    return next((v for v in (props.get("fence_id"), feature.get("id"), props.get("id"))
                 if v is not None), None)


def from_feature(feature: Any, fence_id: str | None = None, owner: str = "") -> FenceSpec:
    """A FenceSpec from a GeoJSON Feature (properties: id or fence_id, name, timeout_s);
    `fence_id` overrides the id in the feature."""
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
    return FenceSpec(check_fence_id(fid), check_geometry(geometry), name,
                     check_timeout(props.get("timeout_s", DEFAULT_TIMEOUT_S)), owner)


def check_geometry(geometry: Any) -> Polygon | MultiPolygon:
    if isinstance(geometry, Mapping):
        n = _check_positions(geometry)
        if n > MAX_VERTICES:
            raise InvalidFence(f"the polygon has {n} vertices; at most {MAX_VERTICES} are accepted")
    try:
        geom = hk.as_geometry(geometry)
    except hk.InvalidGeometry as exc:
        raise InvalidFence(str(exc)) from None
    except (ValueError, TypeError, KeyError, IndexError, OverflowError) as exc:
        raise InvalidFence(f"not a GeoJSON Polygon or MultiPolygon: {exc}") from None
    n = int(shapely.get_num_coordinates(geom))
    if n > MAX_VERTICES:
        raise InvalidFence(f"the polygon has {n} vertices; at most {MAX_VERTICES} are accepted")
    x0, y0, x1, y1 = geom.bounds
    if x0 < -180 or x1 > 180 or y0 < -90 or y1 > 90:
        raise InvalidFence(RANGE_MESSAGE)
    if max(x1 - x0, y1 - y0) > MAX_EXTENT_DEG:
        raise InvalidFence(f"the fence spans {max(x1 - x0, y1 - y0):.1f} degrees; at most "
                           f"{MAX_EXTENT_DEG} are accepted")
    return geom


_POSITION_DEPTH = {"Polygon": 2, "MultiPolygon": 3}  # list levels above a [lon, lat] position
RANGE_MESSAGE = "coordinates must be lon in [-180, 180] and lat in [-90, 90]"


def _check_positions(geometry: Mapping[str, Any]) -> int:
    """The number of positions of a GeoJSON (Multi)Polygon, each checked to hold JSON numbers
    before the kernel converts them: numpy would take "9.5" and true as numbers, and raise
    OverflowError on an integer beyond float range. What has another shape is left to
    `hk.as_geometry`, which says what is wrong with it."""
    kind = geometry.get("type")
    depth = _POSITION_DEPTH.get(kind) if isinstance(kind, str) else None
    if depth is None:
        return 0

    def walk(v: Any, level: int) -> int:
        if not isinstance(v, list | tuple):
            return 0
        if level < depth:
            return sum(walk(c, level + 1) for c in v)
        for x in v:
            if isinstance(x, list | tuple):
                continue  # nested too deep: not a position (as_geometry refuses it)
            if isinstance(x, bool) or not isinstance(x, int | float):
                raise InvalidFence(f"coordinates must be numbers, not {shown(x)}")
            if isinstance(x, int) and not -180 <= x <= 180:  # before float() can overflow
                raise InvalidFence(RANGE_MESSAGE)
        return 1

    return walk(geometry.get("coordinates"), 0)


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
