"""`hysteresis_m`: a band around the fence's border where a position keeps the state before it.

GPS noise at a border gives ENTER / LEAVE pairs every sample. With `hysteresis_m` = M, a
position M metres or more inside the fence (in `inner`, the fence shrunk by M) is inside, one
M metres or more outside it (not in `outer`, the fence grown by M) is outside, and one in the
band between keeps the pair's state before it. Metres are those of a local equirectangular
projection at the fence's bounding-box centre (exact to a fraction of a percent across a fence
of a few km); x-fence and the reference (fence/reference.py) judge with the same two
polygons, made here once per definition. x-geo covers the grown fence (`routed`), so a
position in the band reaches x-fence.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import shapely
from shapely.geometry.base import BaseGeometry

from exchanges.fence_options.base import F64, FenceOption, InvalidFence, shown

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


def routed(geometry: BaseGeometry, m: float) -> BaseGeometry:
    """What x-geo covers for a fence with band `m`: the fence grown by it (or the fence)."""
    return hysteresis_zones(geometry, m)[1] if m else geometry


def zones(inner: Any, outer: Any, x: F64, y: F64) -> npt.NDArray[np.int8]:
    """Per (band, point): 2 past the band inward (in `inner`), 1 within the band, 0 past it
    outward (not in `outer`). The rule of the band: x-fence and the reference alike."""
    zone: npt.NDArray[np.int8] = shapely.contains_xy(outer, x, y).astype(np.int8)
    maybe = np.flatnonzero(zone)
    if maybe.size:
        zone[maybe] += shapely.contains_xy(inner[maybe] if isinstance(inner, np.ndarray) else inner,
                                           x[maybe], y[maybe])
    return zone


class Band(FenceOption):
    key: ClassVar[str] = "hysteresis_m"
    default: ClassVar[Any] = 0.0

    def check(self, raw: Any, geometry: BaseGeometry) -> float:
        return check_hysteresis(raw, geometry)

    def decode(self, raw: Any) -> float:
        return float(raw)


OPTION = Band()
