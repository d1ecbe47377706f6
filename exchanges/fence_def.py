"""A fence definition as every role carries it (x-geo forwards it, x-fence judges with it,
the fence service stores it) and the checks of its own fields wherever it comes in: the id, the
name, the geometry (GeoJSON (Multi)Polygon within the world, a bounded number of vertices and
extent). Its options (timeout, band, filter, dwell, cross, ...) are declared here as fields and
live in exchanges/fence_options/, one module each. Errors are InvalidFence, in words a user
can act on.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import shapely
from shapely.geometry import MultiPolygon, Polygon
from shapely.geometry.base import BaseGeometry

import hilbert_c as hk
from exchanges.fence_options import band, cross, filters, timeout
from exchanges.fence_options.base import InvalidFence, is_storable, shown
from exchanges.tenancy import TENANT_RULE, is_tenant
from exchanges.text import NAME_MAX, TextError, check_text

__all__ = ["FENCE_ID_RE", "MAX_EXTENT_DEG", "MAX_VERTICES", "RANGE_MESSAGE", "FenceDef", "InvalidFence",
           "check_fence_id", "check_fence_key", "check_geometry", "check_name", "is_storable", "shown"]

FENCE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
MAX_VERTICES = 10_000
MAX_EXTENT_DEG = 10.0  # a fence larger than this is refused (the covering grows with area)


@dataclass(frozen=True, eq=False, kw_only=True)
class FenceDef:
    """A fence at one version. Every field after `name` is an option: its module in
    exchanges/fence_options/ (registered in OPTIONS) says what it means and does."""

    fence_id: str
    version: int
    geometry: BaseGeometry  # Polygon / MultiPolygon in lon/lat
    name: str = ""
    timeout_s: float = timeout.DEFAULT_TIMEOUT_S  # fence_options/timeout.py
    hysteresis_m: float = 0.0  # fence_options/band.py
    where: tuple[filters.Clause, ...] = ()  # fence_options/where.py
    dwell_s: float = 0.0  # fence_options/dwell.py
    cross: bool = False  # fence_options/cross.py
    expires_at: float = math.inf  # fence_options/expiry.py
    counts_from: tuple[str, ...] = ()  # fence_options/shares.py

    def routed_geometry(self) -> BaseGeometry:
        """What x-geo covers: the fence, grown by its hysteresis band (positions in the band
        outside it decide a LEAVE)."""
        return band.routed(self.geometry, self.hysteresis_m)

    def cross_box(self) -> tuple[float, float, float, float] | None:
        """What x-geo tests segments against when the fence detects CROSS (else None)."""
        return cross.cross_box(self.cross, self.geometry)


def check_fence_id(fence_id: Any) -> str:
    if not isinstance(fence_id, str) or not FENCE_ID_RE.fullmatch(fence_id):
        raise InvalidFence(f"fence id {shown(fence_id)}: 1-64 characters from A-Z a-z 0-9 _ -, "
                           "starting with a letter or digit")
    return fence_id


def check_fence_key(key: Any) -> str:
    """A fence id as the pipeline names it: `<tenant>:<fence id>` (exchanges/tenancy.py), or a
    bare fence id (the platform's own, the cores' tests)."""
    if not isinstance(key, str):
        raise InvalidFence(f"fence id {shown(key)}: a string")
    tenant, sep, name = key.partition(":")
    if not sep:
        return check_fence_id(key)
    if not is_tenant(tenant):
        raise InvalidFence(f"fence id {shown(key)}: the tenant part is not a tenant ({TENANT_RULE})")
    check_fence_id(name)
    return key


def check_name(name: Any) -> str:
    """A fence's name: text as exchanges/text.py says (may be empty), in NFC."""
    try:
        return check_text(name, "name", NAME_MAX, required=False)
    except TextError as exc:
        raise InvalidFence(str(exc)) from None


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
