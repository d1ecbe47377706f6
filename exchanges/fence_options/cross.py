"""`cross`: an object whose two consecutive positions are both outside the fence while the
segment between them passes through it gets event `cross`, reason `crossed` (a fast vehicle,
a sparse tracker). x-geo sends, with a position, the object's position before it in the region
when the segment meets the bounding box of a fence that detects CROSS (`cross_box`); x-fence
judges it with `crosses`, for fresh positions only (a pure function of the two positions: no
pair state)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import shapely
from shapely.geometry.base import BaseGeometry

from exchanges.fence_options.base import FenceOption, InvalidFence, shown

CROSSED = "crossed"  # the reason of a CROSS event
# A segment longer than this (degrees of longitude or latitude, about 55 km) is not tested for
# CROSS: an object silent that long, or a jump, says nothing of where it went in between.
CROSS_MAX_SEGMENT_DEG = 0.5


def check_cross(value: Any) -> bool:
    """A fence's `cross`: true or false (JSON booleans only)."""
    if not isinstance(value, bool):
        raise InvalidFence(f"cross {shown(value)}: true or false")
    return value


def cross_box(cross: bool, geometry: BaseGeometry) -> tuple[float, float, float, float] | None:
    """What x-geo tests segments against for a fence that detects CROSS: its bounding box."""
    if not cross:
        return None
    x0, y0, x1, y1 = (float(v) for v in geometry.bounds)
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


class Cross(FenceOption):
    key: ClassVar[str] = "cross"
    default: ClassVar[Any] = False

    def check(self, raw: Any, geometry: BaseGeometry) -> bool:
        return check_cross(raw)

    def decode(self, raw: Any) -> bool:
        return bool(raw)


OPTION = Cross()
