"""Coarse cells for proximity ("roaming") subscriptions, and who owns them (pure).

A subscription follows a moving object with a radius; it matches the other objects that come
within that radius (issue 20, after the location-based pub/sub paper, seed 004). Positions are
matched where their cell is owned:
- the world is cut into cells of `360 / 2**level` by `180 / 2**level` degrees, `level` chosen
  so that a cell is at least the largest radius tall (`RoamGrid.for_radius`);
- cells are grouped into blocks of `4**block_bits` cells consecutive on the Hilbert curve
  (`hilbert_c`), and each block is a key of the workers' consistent-hash ring, so neighbouring
  cells mostly share a worker and a worker change moves whole blocks;
- an object's position goes to the owner of its own cell (as a publisher), and, when the object
  carries subscriptions, to the owners of every cell its largest circle's bounding box touches
  (as a subscriber): at most 3 x 3 cells at mid latitudes.

A pair (subscription, other object) is therefore seen by every worker that holds both, and
reported by one: the owner of the other object's cell (the paper's match filter, see
fence/x_fence/roaming.py).

Trade-off: a block of cells is the unit of spread, not an object, so a crowd in one block lands
on one worker; blocks are small (16 cells of ~600 m at the default) so a city still spreads.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from exchanges.subscriptions import MAX_RADIUS_M
from hilbert_c import kernel

EARTH_RADIUS_M = 6_371_008.8

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


def distances_m(lon0: F64 | float, lat0: F64 | float, lon1: F64, lat1: F64) -> F64:
    """Haversine distances between (lon0, lat0) and (lon1, lat1), element by element, metres."""
    p0, p1 = np.radians(lat0), np.radians(lat1)
    dl = np.radians(np.subtract(lon1, lon0))
    a = np.sin((p1 - p0) / 2) ** 2 + np.cos(p0) * np.cos(p1) * np.sin(dl / 2) ** 2
    out: F64 = 2 * EARTH_RADIUS_M * np.arcsin(np.sqrt(np.minimum(a, 1.0)))
    return out


@dataclass(frozen=True)
class RoamGrid:
    """The cells and the blocks that are the ring's keys."""

    level: int
    block_bits: int = 2

    def __post_init__(self) -> None:
        if not 4 <= self.level <= 24:
            raise ValueError(f"roam grid level must be in [4, 24], got {self.level}")
        if not 0 <= self.block_bits <= self.level - 2:
            raise ValueError(f"block_bits must be in [0, level - 2], got {self.block_bits}")

    @staticmethod
    def for_radius(max_radius_m: float, block_bits: int = 2) -> RoamGrid:
        """The finest grid whose cells are at least `max_radius_m` tall (and as wide, up to
        60 degrees of latitude; beyond, a circle's box spans more cells, which stays exact)."""
        if not 0 < max_radius_m <= MAX_RADIUS_M:
            raise ValueError(f"radius must be in (0, {MAX_RADIUS_M:.0f}] m, got {max_radius_m}")
        level = math.floor(math.log2(math.pi * EARTH_RADIUS_M / max_radius_m))
        return RoamGrid(min(level, 24), block_bits)

    @property
    def side(self) -> int:
        return 1 << self.level

    def cell_height_m(self) -> float:
        return math.pi * EARTH_RADIUS_M / self.side

    def cells(self, lon: F64, lat: F64) -> tuple[I64, I64]:
        """The cell (x, y) of each point; lon 180 and lat 90 fall in the last column / row."""
        side = self.side
        x = np.floor((np.asarray(lon, np.float64) + 180.0) * (side / 360.0)).astype(np.int64)
        y = np.floor((np.asarray(lat, np.float64) + 90.0) * (side / 180.0)).astype(np.int64)
        return np.clip(x, 0, side - 1), np.clip(y, 0, side - 1)

    def keys(self, x: I64, y: I64) -> I64:
        """The block (ring key) of each cell; x is taken around the antimeridian."""
        if x.size == 0:
            return np.zeros(0, np.int64)
        h = kernel.encode_many(np.mod(x, self.side).astype(np.uint32), y.astype(np.uint32), self.level)
        return (h >> np.uint64(2 * self.block_bits)).astype(np.int64)

    def point_keys(self, lon: F64, lat: F64) -> I64:
        return self.keys(*self.cells(lon, lat))

    def boxes(self, lon: F64, lat: F64, radius_m: F64) -> tuple[I64, I64, I64, I64]:
        """Per point, the cells (x0..x1, y0..y1, inclusive; x may run past the antimeridian,
        to be taken modulo the side) of the bounding box of its circle on the sphere. The box
        holds every point within the radius (haversine), with a margin for rounding."""
        lon = np.asarray(lon, np.float64)
        lat = np.asarray(lat, np.float64)
        ang = np.asarray(radius_m, np.float64) / EARTH_RADIUS_M
        dlat = np.degrees(ang) + 1e-9
        lat0, lat1 = lat - dlat, lat + dlat
        polar = (lat0 <= -90.0) | (lat1 >= 90.0)
        cos = np.cos(np.radians(lat))
        with np.errstate(divide="ignore", invalid="ignore"):
            s = np.where(cos > 0, np.sin(ang) / cos, 2.0)
        dlon = np.where(polar | (s >= 1.0), 180.0, np.degrees(np.arcsin(np.minimum(s, 1.0))) + 1e-9)
        side = self.side
        x0 = np.floor((lon - dlon + 180.0) * (side / 360.0)).astype(np.int64)
        x1 = np.floor((lon + dlon + 180.0) * (side / 360.0)).astype(np.int64)
        x1 = np.minimum(x1, x0 + side - 1)  # the whole circle of latitude at most
        y0 = np.clip(np.floor((lat0 + 90.0) * (side / 180.0)).astype(np.int64), 0, side - 1)
        y1 = np.clip(np.floor((lat1 + 90.0) * (side / 180.0)).astype(np.int64), 0, side - 1)
        return x0, x1, y0, y1

    def box_keys(self, lon: F64, lat: F64, radius_m: F64) -> tuple[I64, I64]:
        """(row, key) for every block a point's circle box touches, each pair once, by row.
        Computed per block, not per cell (a block is an aligned square of cells, and its key
        the Hilbert index at `level - block_bits` of the square: hilbert_c's curve has the same
        quadrant order at every order), so a box costs its blocks."""
        return self.keys_of_blocks(np.arange(np.asarray(lon).size, dtype=np.int64),
                                *self.block_boxes(lon, lat, radius_m))

    def block_boxes(self, lon: F64, lat: F64, radius_m: F64) -> tuple[I64, I64, I64, I64]:
        """`boxes` in blocks: bx0..bx1 (past the antimeridian as `boxes`, at most a whole
        circle of latitude), by0..by1, inclusive."""
        x0, x1, y0, y1 = self.boxes(lon, lat, radius_m)
        bb = self.block_bits
        bx0, bx1 = x0 >> bb, x1 >> bb  # floor division: x0 may be negative
        bx1 = np.minimum(bx1, bx0 + (self.side >> bb) - 1)
        return bx0, bx1, y0 >> bb, y1 >> bb

    def keys_of_blocks(self, rows: I64, bx0: I64, bx1: I64, by0: I64, by1: I64) -> tuple[I64, I64]:
        """(row, key) of every block of each row's block box, each pair once, by row."""
        nx, ny = bx1 - bx0 + 1, by1 - by0 + 1
        counts = nx * ny
        row = np.repeat(rows, counts)
        if row.size == 0:
            return row, np.zeros(0, np.int64)
        start = np.cumsum(counts) - counts
        k = np.arange(row.size, dtype=np.int64) - np.repeat(start, counts)
        nxr = np.repeat(nx, counts)
        bx = np.repeat(bx0, counts) + k % nxr
        by = np.repeat(by0, counts) + k // nxr
        bits = self.level - self.block_bits
        h = kernel.encode_many(np.mod(bx, 1 << bits).astype(np.uint32), by.astype(np.uint32), bits)
        return unique_pairs(row, h.astype(np.int64))


def unique_pairs(a: I64, b: I64) -> tuple[I64, I64]:
    """The distinct (a, b) pairs, sorted by a then b."""
    if a.size == 0:
        return a, b
    order = np.lexsort((b, a))
    a, b = a[order], b[order]
    keep = np.ones(a.size, bool)
    keep[1:] = (a[1:] != a[:-1]) | (b[1:] != b[:-1])
    return a[keep], b[keep]


class BlockOwners:
    """Block key -> worker number, through a ring lookup per block first met (cached)."""

    def __init__(self, grid: RoamGrid, workers: list[str],
                 node_for_many: Callable[[list[str]], list[str]]) -> None:
        self.grid = grid
        self.workers = list(workers)
        self._number = {w: i for i, w in enumerate(self.workers)}
        self._node_for_many = node_for_many
        self._cache: dict[int, int] = {}

    def ring_key(self, key: int) -> str:
        return f"roam/{self.grid.level}/{self.grid.block_bits}/{key}"

    SMALL = 256  # keys looked up one by one below this (np.unique's fixed cost is ~40 us)

    def of(self, keys: I64) -> I64:
        """The worker number owning each key."""
        if keys.size == 0:
            return np.zeros(0, np.int64)
        cache = self._cache
        if keys.size < self.SMALL:
            ks = keys.reshape(-1).tolist()
            self._fill([k for k in set(ks) if k not in cache])
            return np.fromiter((cache[k] for k in ks), np.int64, len(ks))
        # distinct keys by a sort (np.unique hashes on numpy 2.4: several times slower)
        flat = keys.reshape(-1)
        order = np.argsort(flat, kind="stable")
        srt = flat[order]
        first = np.ones(srt.size, bool)
        first[1:] = srt[1:] != srt[:-1]
        uniq = srt[first]
        inv = np.empty(srt.size, np.int64)
        inv[order] = np.cumsum(first) - 1
        u = uniq.tolist()
        self._fill([k for k in u if k not in cache])
        owners = np.fromiter((cache[k] for k in u), np.int64, len(u))
        return owners[inv]

    # A circle's box over more blocks than this reaches every worker: with a handful of workers
    # such a box touches all of them anyway, and it bounds what one position costs the router
    # and the workers whatever its radius or latitude (a box near a pole spans every longitude).
    WIDE_BLOCKS = 256

    def box_workers(self, lon: F64, lat: F64, radius_m: F64) -> tuple[I64, I64]:
        """(row, worker number) for every worker a point's circle box reaches, each pair once,
        by row: the owners of the blocks the box touches, or every worker for a box over more
        than WIDE_BLOCKS blocks. The one rule by which the router sends a subscriber's row and
        a worker keeps a subscriber's position (exchanges/roam_routing.py, fence/x_fence/
        roaming.py): the two must agree, or a worker would hold a position it gets no news of."""
        lon, lat = np.asarray(lon, np.float64), np.asarray(lat, np.float64)
        bx0, bx1, by0, by1 = self.grid.block_boxes(lon, lat, radius_m)
        wide = (bx1 - bx0 + 1) * (by1 - by0 + 1) > self.WIDE_BLOCKS
        narrow = np.flatnonzero(~wide)
        row, key = self.grid.keys_of_blocks(narrow, bx0[narrow], bx1[narrow], by0[narrow], by1[narrow])
        wr = np.flatnonzero(wide)
        if not wr.size:
            return unique_pairs(row, self.of(key))
        nw = len(self.workers)
        return unique_pairs(np.concatenate([row, np.repeat(wr, nw)]),
                            np.concatenate([self.of(key), np.tile(np.arange(nw, dtype=np.int64), wr.size)]))

    def _fill(self, missing: list[int]) -> None:
        """Ring lookups for the blocks not met before."""
        if missing:
            for k, w in zip(missing, self._node_for_many([self.ring_key(k) for k in missing]), strict=True):
                self._cache[k] = self._number[w]
