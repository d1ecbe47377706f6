"""Polygon covering: a geometry in lon/lat to sorted, merged Hilbert ranges.

The descent (quadtree along the curve, inside / outside / boundary per cell) is C
(`covering.c`); this module validates the geometry, flattens its rings for C, coarsens to
`max_ranges` and answers questions about a covering. Ranges are merged when adjacent and of
the same kind, so `interior` stays informative: a boundary range is followed by an interior
one only where the curve really leaves the polygon's edge. `Covering.merged()` merges
regardless of kind (the fewest ranges, as the design's figures count them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import shapely
from shapely.geometry import MultiPolygon, Polygon

from hilbert_c import kernel

EARTH_RADIUS_M = 6_371_008.8  # mean radius (IUGG)
# Quadtree nodes one covering may visit before it is refused (or coarsened when max_ranges
# is given): ~12 M nodes is ~3 M boundary cells, about 1.5 s and 300 MB at worst.
DEFAULT_MAX_NODES = 12_000_000


class InvalidGeometry(ValueError):
    """The geometry cannot be covered; the message says what is wrong."""


@dataclass(frozen=True, eq=False)
class Covering:
    """Inclusive [start, end] Hilbert ranges (uint64, shape (N, 2)), sorted and disjoint.

    `interior[i]` is True when every cell of range i lies inside the geometry (no exact
    check needed for a point there); otherwise the range touches the geometry's boundary
    (or was widened by `max_ranges`) and a point in it needs the exact test.
    """

    ranges: npt.NDArray[np.uint64]
    interior: npt.NDArray[np.bool_]
    bits: int
    level: int  # finest quadtree level reached: == bits unless coarsened for max_ranges
    nodes: int  # quadtree nodes visited

    def __len__(self) -> int:
        return int(self.ranges.shape[0])

    @property
    def cells(self) -> int:
        """Number of grid cells covered."""
        if not len(self):
            return 0
        return int((self.ranges[:, 1] - self.ranges[:, 0]).sum(dtype=np.uint64)) + len(self)

    @property
    def interior_share(self) -> float:
        """Share of covered cells that lie in interior ranges."""
        total = self.cells
        if not total:
            return 0.0
        r = self.ranges[self.interior]
        inner = int((r[:, 1] - r[:, 0]).sum(dtype=np.uint64)) + len(r)
        return inner / total

    def merged(self) -> Covering:
        """The same cells with every pair of adjacent ranges merged (interior = all parts)."""
        return _merge_gaps(self, max_gap=0)

    def to_bits(self, bits: int) -> Covering:
        """The same cells expressed at a finer resolution (each cell becomes 4**(d) indices)."""
        kernel._check_bits(bits)
        if bits < self.bits:
            raise ValueError(f"can only refine: {self.bits} bits -> {bits} bits")
        shift = np.uint64(2 * (bits - self.bits))
        ranges = np.empty_like(self.ranges)
        ranges[:, 0] = self.ranges[:, 0] << shift
        ranges[:, 1] = ((self.ranges[:, 1] + np.uint64(1)) << shift) - np.uint64(1)
        return Covering(ranges, self.interior.copy(), bits, self.level, self.nodes)

    def contains(self, hs: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        return ranges_contain(self.ranges, hs)

    def blocks(self) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32], npt.NDArray[np.int64]]:
        """The covering as aligned square blocks: lower-left cells (x, y) and side exponent k
        (a block is 2**k x 2**k cells). Every Hilbert range is a union of such blocks."""
        return ranges_to_blocks(self.ranges, self.bits)

    def area_m2(self) -> float:
        """Area of the covered cells on the sphere (equal-area: exact per cell)."""
        _, y, k = self.blocks()
        side = np.left_shift(np.int64(1), k)
        dlon = np.radians(360.0 / (1 << self.bits)) * side
        lat0 = np.radians(y.astype(np.float64) * (180.0 / (1 << self.bits)) - 90.0)
        lat1 = np.radians((y.astype(np.float64) + side) * (180.0 / (1 << self.bits)) - 90.0)
        return float(EARTH_RADIUS_M**2 * np.sum(dlon * (np.sin(lat1) - np.sin(lat0))))


def ranges_contain(ranges: npt.ArrayLike, hs: npt.ArrayLike) -> npt.NDArray[np.bool_]:
    """For each index in hs, is it inside one of the sorted disjoint inclusive ranges?"""
    return ranges_lookup(ranges, hs) >= 0


def ranges_lookup(ranges: npt.ArrayLike, hs: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """For each index in hs, the row of the range holding it, or -1 (vectorised search)."""
    r = np.asarray(ranges, dtype=np.uint64).reshape(-1, 2)
    h = np.asarray(hs, dtype=np.uint64)
    row = np.searchsorted(r[:, 0], h, side="right").astype(np.int64) - 1
    hit = row >= 0
    hit[hit] = h[hit] <= r[row[hit], 1]
    return np.where(hit, row, -1)


def split_ranges(
    ranges: npt.ArrayLike, bits: int
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Cut sorted inclusive ranges into maximal aligned blocks, greedily from the left.

    A block is 4**k consecutive indices starting at a multiple of 4**k: one quadtree cell of
    2**k x 2**k grid cells. Returns (first index, k, row of the range it came from).
    """
    r = np.asarray(ranges, dtype=np.uint64).reshape(-1, 2)
    start, end = r[:, 0].copy(), r[:, 1].copy()
    owner = np.arange(len(r), dtype=np.int64)
    one = np.uint64(1)
    out_s, out_k, out_o = [], [], []
    while start.size:
        # alignment: k <= trailing zeros / 2 (start 0 is aligned at every level)
        low = start & (~start + one)
        _, e_low = np.frexp(low.astype(np.float64))
        k_align = np.where(start == 0, bits, (e_low - 1) // 2)
        # size: 4**k <= length (frexp of a rounded float can be one too high: fixed below)
        _, e_len = np.frexp((end - start + one).astype(np.float64))
        k = np.minimum(np.minimum(k_align, (e_len - 1) // 2), bits).astype(np.int64)
        too_big = start + (one << (2 * k).astype(np.uint64)) - one > end
        k[too_big] -= 1
        out_s.append(start)
        out_k.append(k)
        out_o.append(owner)
        nxt = start + (one << (2 * k).astype(np.uint64))
        more = (nxt <= end) & (nxt > start)  # nxt wraps only past the very top of the curve
        start, end, owner = nxt[more], end[more], owner[more]
    if not out_s:
        return np.empty(0, np.uint64), np.empty(0, np.int64), np.empty(0, np.int64)
    s_all, k_all, o_all = np.concatenate(out_s), np.concatenate(out_k), np.concatenate(out_o)
    order = np.lexsort((s_all, o_all))
    return s_all[order], k_all[order], o_all[order]


def ranges_to_blocks(
    ranges: npt.NDArray[np.uint64], bits: int
) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32], npt.NDArray[np.int64]]:
    """The ranges as aligned square blocks: lower-left cells (x, y) and side exponent k."""
    starts, k, _ = split_ranges(ranges, bits)
    x, y = kernel.decode_many(starts, bits)
    mask = ~(np.left_shift(np.uint32(1), k.astype(np.uint32)) - np.uint32(1))
    return x & mask, y & mask, k


def geometry_area_m2(geometry: Any) -> float:
    """Area on the sphere of a lon/lat geometry (cylindrical equal-area projection)."""
    geom = as_geometry(geometry)

    def project(coords: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        out = np.empty_like(coords)
        out[:, 0] = np.radians(coords[:, 0]) * EARTH_RADIUS_M
        out[:, 1] = np.sin(np.radians(coords[:, 1])) * EARTH_RADIUS_M
        return out

    return float(shapely.transform(geom, project).area)


def as_geometry(geometry: Any) -> Polygon | MultiPolygon:
    """A validated shapely Polygon or MultiPolygon from shapely or GeoJSON (geometry or Feature)."""
    if isinstance(geometry, Mapping):
        geometry = _from_geojson(geometry)
    if not isinstance(geometry, Polygon | MultiPolygon):
        kind = getattr(geometry, "geom_type", type(geometry).__name__)
        raise InvalidGeometry(f"expected a Polygon or MultiPolygon, got {kind}")
    if geometry.is_empty:
        raise InvalidGeometry("the geometry is empty")
    coords = shapely.get_coordinates(geometry)
    lon, lat = kernel.clamp_lonlat(coords[:, 0], coords[:, 1])
    if not (np.array_equal(lon, coords[:, 0]) and np.array_equal(lat, coords[:, 1])):
        geometry = shapely.set_coordinates(geometry, np.column_stack([lon, lat]))  # noise at the edge
    for p, poly in enumerate(_polygons(geometry)):
        for r, ring in enumerate([poly.exterior, *poly.interiors]):
            _check_ring(np.asarray(ring.coords)[:, :2], p, r)
    if not geometry.is_valid:
        raise InvalidGeometry(_explain(shapely.is_valid_reason(geometry)))
    if geometry.area <= 0.0:
        raise InvalidGeometry("the polygon has zero area")
    return geometry


def cover(
    geometry: Any, bits: int, max_ranges: int | None = None, *,
    max_nodes: int = DEFAULT_MAX_NODES,
) -> Covering:
    """Cover a Polygon / MultiPolygon (shapely or GeoJSON, lon/lat degrees) with Hilbert ranges.

    No false negatives: the index of every point inside the geometry is in a range.
    Interior ranges hold only inside cells. With `max_ranges=K` the result has at most K
    ranges: the smallest gaps between ranges are filled (an exact optimum for the extra
    cells, given the fine covering), and if even the fine covering is over the node budget,
    the descent stops at a coarser level first (like S2's RegionCoverer max_cells).
    """
    kernel._check_bits(bits)
    if max_ranges is not None and max_ranges < 1:
        raise ValueError(f"max_ranges must be >= 1, got {max_ranges}")
    lon, lat, ends = _flatten(as_geometry(geometry))
    return cover_flat(lon, lat, ends, bits, max_ranges, max_nodes=max_nodes)


def cover_flat(
    lon: npt.NDArray[np.float64], lat: npt.NDArray[np.float64], ends: npt.NDArray[np.int64],
    bits: int, max_ranges: int | None = None, *, max_nodes: int = DEFAULT_MAX_NODES,
) -> Covering:
    """`cover` of rings already flattened and trusted (valid, as stored by the fence service):
    the batch path of the nightly rebuild, which skips shapely. Same result as `cover`."""
    kernel._check_bits(bits)
    if max_ranges is not None and max_ranges < 1:
        raise ValueError(f"max_ranges must be >= 1, got {max_ranges}")
    level = bits
    while True:
        try:
            ranges, interior, nodes, _ = kernel.cover_rings(lon, lat, ends, bits, level, max_nodes)
            break
        except kernel.CoverBudgetExceeded as exc:
            if max_ranges is None or level <= 1:
                raise InvalidGeometry(
                    f"covering this geometry at {bits} bits needs more than {max_nodes:,} "
                    "quadtree nodes; use fewer bits or pass max_ranges"
                ) from exc
            level = max(1, level - 2)
    cov = Covering(ranges, interior, bits, level, nodes)
    if max_ranges is not None and len(cov) > max_ranges:
        cov = _coarsen(cov, max_ranges)
    return cov


def flatten_geojson(obj: Mapping[str, Any]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64],
                                                     npt.NDArray[np.int64]]:
    """(lon, lat, ring ends) of a stored GeoJSON Polygon / MultiPolygon, rings closed as shapely
    closes them: what `cover_flat` takes. No validation (see `as_geometry` for that)."""
    kind = obj.get("type")
    if kind not in ("Polygon", "MultiPolygon"):
        raise InvalidGeometry(f"expected a GeoJSON Polygon or MultiPolygon, got type {kind!r}")
    polys = [obj["coordinates"]] if kind == "Polygon" else obj["coordinates"]
    rings = []
    for rs in polys:
        for ring in rs:
            a = np.asarray(ring, dtype=np.float64)[:, :2]
            if len(a) and (a[0] != a[-1]).any():
                a = np.vstack([a, a[:1]])
            rings.append(a)
    coords = np.concatenate(rings)
    ends = np.cumsum([len(r) for r in rings], dtype=np.int64)
    return coords[:, 0].copy(), coords[:, 1].copy(), ends


def coarsen(cov: Covering, k: int) -> Covering:
    """The covering with at most k ranges that `cover(..., max_ranges=k)` gives for the same
    geometry, from any of its coverings with more ranges (at any resolution or budget): the
    smallest gaps are filled in the same order whatever was filled before, since filling a
    gap leaves the others as they were and `to_bits` scales every gap alike."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return _coarsen(cov, k) if len(cov) > k else cov


def _coarsen(cov: Covering, k: int) -> Covering:
    gaps = cov.ranges[1:, 0] - cov.ranges[:-1, 1] - np.uint64(1)
    n_fill = len(cov) - k
    # the n_fill smallest gaps, ties broken by position for determinism
    order = np.lexsort((np.arange(gaps.size), gaps))[:n_fill]
    fill = np.zeros(gaps.size, dtype=bool)
    fill[order] = True
    return _merge_where(cov, fill, gaps)


def _merge_gaps(cov: Covering, max_gap: int) -> Covering:
    if len(cov) < 2:
        return cov
    gaps = cov.ranges[1:, 0] - cov.ranges[:-1, 1] - np.uint64(1)
    return _merge_where(cov, gaps <= np.uint64(max_gap), gaps)


def _merge_where(
    cov: Covering, fill: npt.NDArray[np.bool_], gaps: npt.NDArray[np.uint64]
) -> Covering:
    """Merge range i with range i+1 wherever fill[i]; filling a real gap loses `interior`."""
    first = np.concatenate(([True], ~fill))
    starts = np.flatnonzero(first)
    last = np.concatenate((starts[1:] - 1, [len(cov) - 1]))
    ranges = np.stack([cov.ranges[starts, 0], cov.ranges[last, 1]], axis=1)
    interior = np.logical_and.reduceat(cov.interior, starts)
    widened = fill & (gaps > 0)
    if widened.any():
        group = np.cumsum(first) - 1  # group of each range
        interior[np.unique(group[1:][widened])] = False
    return Covering(ranges, interior, cov.bits, cov.level, cov.nodes)


def _polygons(geom: Polygon | MultiPolygon) -> list[Polygon]:
    return list(geom.geoms) if isinstance(geom, MultiPolygon) else [geom]


def _flatten(geom: Polygon | MultiPolygon) -> tuple[Any, Any, Any]:
    rings = [
        np.asarray(ring.coords, dtype=np.float64)[:, :2]
        for poly in _polygons(geom)
        for ring in (poly.exterior, *poly.interiors)
    ]
    coords = np.concatenate(rings)
    ends = np.cumsum([len(r) for r in rings], dtype=np.int64)
    return coords[:, 0].copy(), coords[:, 1].copy(), ends


def _check_ring(coords: npt.NDArray[np.float64], poly: int, ring: int) -> None:
    where = f"ring {ring} of polygon {poly}" + (" (exterior)" if ring == 0 else " (hole)")
    finite = np.isfinite(coords).all(axis=1)
    ok = finite & (np.abs(coords[:, 0]) <= 180.0) & (np.abs(coords[:, 1]) <= 90.0)
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        lon, lat = float(coords[i, 0]), float(coords[i, 1])
        raise InvalidGeometry(
            f"{where}: vertex {i} ({lon!r}, {lat!r}) is not a lon/lat coordinate "
            "(lon must be finite in [-180, 180], lat in [-90, 90])"
        )
    distinct = len(np.unique(coords, axis=0))
    if distinct < 3:
        raise InvalidGeometry(
            f"{where} has {distinct} distinct point{'s' if distinct != 1 else ''}; "
            "a ring needs at least 3"
        )
    d = coords - coords[0]
    far = d[np.argmax(np.abs(d).sum(axis=1))]
    if not (d[:, 0] * far[1] - d[:, 1] * far[0]).any():
        raise InvalidGeometry(f"{where}: all vertices lie on one line, so it has zero area")


def _explain(reason: str) -> str:
    # GEOS says e.g. "Self-intersection[9.52 47.13]"; say it in words with the place.
    name, _, rest = reason.partition("[")
    where = ""
    if rest:
        parts = rest.rstrip("]").split()
        if len(parts) >= 2:
            where = f" at lon={float(parts[0]):.7f}, lat={float(parts[1]):.7f}"
    return f"invalid polygon: {name.strip().lower()}{where}"


def _from_geojson(obj: Mapping[str, Any]) -> Any:
    kind = obj.get("type")
    if kind == "Feature":
        geometry = obj.get("geometry")
        if not isinstance(geometry, Mapping):
            raise InvalidGeometry("the Feature has no geometry")
        return _from_geojson(geometry)
    if kind not in ("Polygon", "MultiPolygon"):
        raise InvalidGeometry(f"expected a GeoJSON Polygon or MultiPolygon, got type {kind!r}")
    coords = obj.get("coordinates")
    polys = [coords] if kind == "Polygon" else coords
    if not isinstance(polys, list | tuple) or not polys:
        raise InvalidGeometry(f"a {kind} needs a non-empty 'coordinates' array")
    built = []
    for p, rings in enumerate(polys):
        if not isinstance(rings, list | tuple) or not rings:
            raise InvalidGeometry(f"polygon {p} has no rings")
        arrays = []
        for r, ring in enumerate(rings):
            try:
                arr = np.asarray(ring, dtype=np.float64)
            except (TypeError, ValueError):
                raise InvalidGeometry(f"ring {r} of polygon {p} is not an array of positions") from None
            if arr.ndim != 2 or arr.shape[1] < 2 or len(arr) == 0:
                raise InvalidGeometry(f"ring {r} of polygon {p} is not an array of [lon, lat] positions")
            arr = np.column_stack(kernel.clamp_lonlat(arr[:, 0], arr[:, 1]))
            _check_ring(arr, p, r)
            arrays.append(arr)
        built.append(Polygon(arrays[0], arrays[1:]))
    return built[0] if kind == "Polygon" else MultiPolygon(built)


def circle(lon: float, lat: float, radius_m: float, vertices: int = 64) -> Polygon:
    """A geodesic-ish circle (small-circle offsets on the sphere) as a lon/lat polygon."""
    ang = np.linspace(0.0, 2.0 * math.pi, vertices, endpoint=False)
    d = radius_m / EARTH_RADIUS_M
    la0, lo0 = math.radians(lat), math.radians(lon)
    la = np.arcsin(math.sin(la0) * math.cos(d) + math.cos(la0) * math.sin(d) * np.cos(ang))
    lo = lo0 + np.arctan2(
        np.sin(ang) * math.sin(d) * math.cos(la0), math.cos(d) - math.sin(la0) * np.sin(la)
    )
    return Polygon(np.column_stack([np.degrees(lo), np.degrees(la)]))


def cell_size_m(bits: int, lat: float = 0.0) -> tuple[float, float]:
    """Width and height in metres of one grid cell at `bits` bits per axis, at latitude lat."""
    kernel._check_bits(bits)
    per_deg = math.pi * EARTH_RADIUS_M / 180.0
    return (
        360.0 / (1 << bits) * per_deg * math.cos(math.radians(lat)),
        180.0 / (1 << bits) * per_deg,
    )
