"""The fences' polygons as flat edge columns, for the exact point-in-polygon test in C.

Trade-off: the edges of every fence of a worker live in four growing float columns with a
row range per fence code, so one C call tests a whole batch's candidates against their own
fences; a dropped fence's rows are left dead and reclaimed by compaction when more than
half are dead, not on every drop.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from shapely.geometry import MultiPolygon, Polygon
from shapely.geometry.base import BaseGeometry

from exchanges.object_codes import grow
from hilbert_c import kernel

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


class Edges:
    """Every fence's polygon edges in flat columns, for the exact test in C
    (`kernel.points_in_polygons`): the answers it gives are GEOS's, and it leaves the few
    points it cannot decide (on or within rounding of an edge) to shapely. A fence whose
    geometry is not a valid polygon has no edges here: shapely decides for it."""

    def __init__(self) -> None:
        self.columns = tuple(np.empty(0) for _ in range(4))  # ax, ay, bx, by
        self.used = 0  # rows in use (live or dead)
        self.lo = np.zeros(0, np.int64)  # per fence code: its rows, or -1
        self.hi = np.zeros(0, np.int64)

    def put(self, code: int, geometry: BaseGeometry) -> None:
        self.lo, self.hi = grow(self.lo, code + 1, -1), grow(self.hi, code + 1, -1)
        self.lo[code] = self.hi[code] = -1
        edges = polygon_edges(geometry)
        if edges is None:
            return
        if self.used + len(edges[0]) > self.columns[0].size and self._dead() > self.used // 2:
            self._compact()
        n, at = len(edges[0]), self.used
        self.columns = tuple(grow(c, at + n, 0.0) for c in self.columns)
        for column, values in zip(self.columns, edges, strict=True):
            column[at:at + n] = values
        self.lo[code], self.hi[code], self.used = at, at + n, at + n

    def drop(self, code: int) -> None:
        if code < self.lo.size:
            self.lo[code] = self.hi[code] = -1

    def locate(self, codes: I64, x: F64, y: F64) -> npt.NDArray[np.uint8]:
        cols = tuple(c[: self.used] for c in self.columns)
        return kernel.points_in_polygons(cols, self.lo[codes], self.hi[codes], x, y)  # type: ignore[arg-type]

    def _dead(self) -> int:
        live = self.lo >= 0
        return self.used - int((self.hi[live] - self.lo[live]).sum())

    def _compact(self) -> None:
        live = np.flatnonzero(self.lo >= 0)
        rows = np.concatenate([np.arange(self.lo[c], self.hi[c]) for c in live]) if live.size \
            else np.empty(0, np.int64)
        self.columns = tuple(c[rows] for c in self.columns)
        sizes = self.hi[live] - self.lo[live]
        self.lo[live] = np.cumsum(sizes) - sizes
        self.hi[live] = np.cumsum(sizes)
        self.used = int(rows.size)


def polygon_edges(geometry: BaseGeometry) -> tuple[F64, F64, F64, F64] | None:
    """(ax, ay, bx, by) of every ring's edges, or None unless a valid (Multi)Polygon."""
    if not isinstance(geometry, Polygon | MultiPolygon) or geometry.is_empty or not geometry.is_valid:
        return None
    polys = list(geometry.geoms) if isinstance(geometry, MultiPolygon) else [geometry]
    rings = [np.asarray(r.coords, dtype=np.float64)[:, :2] for p in polys for r in (p.exterior, *p.interiors)]
    a = np.concatenate([r[:-1] for r in rings])  # rings are closed: last == first
    b = np.concatenate([r[1:] for r in rings])
    return a[:, 0].copy(), a[:, 1].copy(), b[:, 0].copy(), b[:, 1].copy()
