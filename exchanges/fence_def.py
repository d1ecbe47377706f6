"""A fence definition as every role carries it (x-geo forwards it, x-fence judges with it,
the fence service stores it) and the checks a definition passes wherever it comes in: the id,
the timeout, the name, the geometry (GeoJSON (Multi)Polygon within the world, a bounded
number of vertices and extent). Errors are InvalidFence, in words a user can act on.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import shapely
from shapely.geometry import MultiPolygon, Polygon
from shapely.geometry.base import BaseGeometry

import hilbert_c as hk
from exchanges import filters

FENCE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
MAX_VERTICES = 10_000
MAX_EXTENT_DEG = 10.0  # a fence larger than this is refused (the covering grows with area)
DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True, eq=False)
class FenceDef:
    fence_id: str
    version: int
    geometry: BaseGeometry  # Polygon / MultiPolygon in lon/lat
    timeout_s: float
    name: str = ""
    hysteresis_m: float = 0.0  # 0: none (see `hysteresis_zones`)
    # a filter on the positions' extra fields (exchanges/filters.py): a position that fails it
    # is outside the fence (an object inside whose fields stop matching LEAVEs); () = all
    where: tuple[filters.Clause, ...] = ()
    # dwell (issue 20, part 2): an object's stay counts, and is reported (ENTER reason
    # `dwelled`), only once it has been inside this long; a shorter stay gives no event at all
    dwell_s: float = 0.0
    # cross (issue 20, part 2): an object whose two consecutive positions are both outside
    # the fence while the segment between them passes through it gets event `cross`, reason
    # `crossed` (`crosses` below)
    cross: bool = False

    def routed_geometry(self) -> BaseGeometry:
        """What x-geo covers: the fence, grown by its hysteresis band (positions in the band
        outside it decide a LEAVE)."""
        if not self.hysteresis_m:
            return self.geometry
        return hysteresis_zones(self.geometry, self.hysteresis_m)[1]


# Hysteresis (issue 20, part 2): GPS noise at a border gives ENTER / LEAVE pairs every sample.
# With `hysteresis_m` = M, a position M metres or more inside the fence (in `inner`, the fence
# shrunk by M) is inside, one M metres or more outside it (not in `outer`, the fence grown by
# M) is outside, and one in the band between keeps the pair's state before it. Metres are
# those of a local equirectangular projection at the fence's bounding-box centre (exact to a
# fraction of a percent across a fence of a few km); x-fence and the reference
# (fence/reference.py) judge with the same two polygons, made here once per definition.
def check_where(raw: Any) -> tuple[filters.Clause, ...]:
    """A fence's `where` (a list of clauses, exchanges/filters.py); None or [] for none."""
    if raw is None:
        return ()
    try:
        return filters.parse(raw)
    except filters.InvalidFilter as exc:
        raise InvalidFence(str(exc)) from None


MAX_HYSTERESIS_M = 1_000.0
_R_EARTH_M = 6_371_008.8


def check_hysteresis(value: Any, geometry: BaseGeometry | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_HYSTERESIS_M:
        raise InvalidFence(f"hysteresis_m {shown(value)}: a number of metres in [0, {MAX_HYSTERESIS_M:.0f}]")
    m = float(value)
    if m and geometry is not None and hysteresis_zones(geometry, m)[0].is_empty:
        raise InvalidFence(f"hysteresis_m {m:g}: the fence is nowhere {m:g} m wide, so nothing could "
                           "ever be inside it (a smaller band, or none)")
    return m


_ZONES: dict[tuple[bytes, float], tuple[BaseGeometry, BaseGeometry]] = {}


def hysteresis_zones(geometry: BaseGeometry, m: float) -> tuple[BaseGeometry, BaseGeometry]:
    """(inner, outer): the fence shrunk and grown by `m` metres (see above), prepared."""
    key = (shapely.to_wkb(geometry), float(m))
    got = _ZONES.get(key)
    if got is not None:
        return got
    x0, y0, x1, y1 = geometry.bounds
    lon0, lat0 = (x0 + x1) / 2, (y0 + y1) / 2
    ky = math.pi / 180 * _R_EARTH_M
    kx = ky * math.cos(math.radians(lat0))

    def to_m(c: Any) -> Any:
        return np.column_stack([(c[:, 0] - lon0) * kx, (c[:, 1] - lat0) * ky])

    def to_deg(c: Any) -> Any:
        return np.column_stack([c[:, 0] / kx + lon0, c[:, 1] / ky + lat0])

    local = shapely.transform(geometry, to_m)
    inner, outer = (shapely.transform(local.buffer(d, quad_segs=8), to_deg) for d in (-m, m))
    for g in (inner, outer):
        shapely.prepare(g)
    if len(_ZONES) > 4_096:
        _ZONES.clear()
    _ZONES[key] = (inner, outer)
    return inner, outer


class InvalidFence(ValueError):
    """What is wrong with a fence, in words a user can act on."""


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


MAX_DWELL_S = 86_400.0


def check_cross(value: Any) -> bool:
    """A fence's `cross`: true or false (JSON booleans only)."""
    if not isinstance(value, bool):
        raise InvalidFence(f"cross {shown(value)}: true or false")
    return value


# A segment longer than this (degrees of longitude or latitude, about 55 km) is not tested for
# CROSS: an object silent that long, or a jump, says nothing of where it went in between.
CROSS_MAX_SEGMENT_DEG = 0.5


def cross_box(fence: FenceDef) -> tuple[float, float, float, float] | None:
    """What x-geo tests segments against for a fence that detects CROSS: its bounding box."""
    if not fence.cross:
        return None
    x0, y0, x1, y1 = (float(v) for v in fence.geometry.bounds)
    return x0, y0, x1, y1


def crosses(geometries: Any, x0: Any, y0: Any, x1: Any, y1: Any) -> Any:
    """Per (fence, segment from (x0, y0) to (x1, y1)): whether the segment passes through the
    fence's interior while both its ends are outside it (`shapely.contains_xy` false: a point
    on the boundary is outside, as for ENTER / LEAVE). The one rule of CROSS, for x-fence and
    the reference alike."""
    x0, y0, x1, y1 = (np.asarray(v, np.float64) for v in (x0, y0, x1, y1))
    lines = shapely.linestrings(np.stack([np.stack([x0, y0], -1), np.stack([x1, y1], -1)], -2))
    out: Any = (~shapely.contains_xy(geometries, x0, y0) & ~shapely.contains_xy(geometries, x1, y1)
                & shapely.relate_pattern(lines, geometries, "T********"))
    return out


def check_dwell(value: Any) -> float:
    """A fence's `dwell_s`: seconds in [0, 86400] (0: ENTER at once, as without dwell)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_DWELL_S:
        raise InvalidFence(f"dwell_s {shown(value)}: a number of seconds in [0, {MAX_DWELL_S:.0f}]")
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
