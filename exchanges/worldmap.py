"""The worldmap: which part of the Hilbert curve each x-geo region owns.

Trade-off: a region owns a set of intervals of the curve, not a set of tiles. Routing a
position is then one `searchsorted` over the interval starts for a whole batch, splitting a
region (scale out) is cutting one interval at an index, and a fence's covering is divided
between regions by cutting its ranges at the interval starts. Because the curve keeps
neighbouring cells close, an interval is a compact area, so most fences fall in one region.

The map is a value: every change returns a new map with version + 1. A map covers the whole
curve: interval i is [starts[i], starts[i+1] - 1] and belongs to regions[owner[i]].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

import hilbert_c as hk
from exchanges.fence_binding import INDEX_BITS

U64 = npt.NDArray[np.uint64]
TOP = (1 << (2 * INDEX_BITS)) - 1  # last index of the curve
# The local stack's service area (lon_min, lat_min, lon_max, lat_max): Liechtenstein, the
# demo's OSM extract, and the benchmark's 20 km box around it. The default map splits it.
AREA = (9.40, 47.00, 9.70, 47.30)


@dataclass(frozen=True, eq=False)
class Worldmap:
    version: int
    regions: tuple[str, ...]
    starts: U64  # sorted, starts[0] == 0
    owner: npt.NDArray[np.int64]  # region index of each interval

    def __post_init__(self) -> None:
        s = self.starts
        if not s.size or int(s[0]) != 0 or not (s[1:] > s[:-1]).all() or int(s[-1]) > TOP:
            raise ValueError("interval starts must be sorted, unique, begin at 0 and stay on the curve")
        if self.owner.shape != s.shape or (self.owner < 0).any() or (self.owner >= len(self.regions)).any():
            raise ValueError("every interval needs the index of a known region")
        if len(set(self.regions)) != len(self.regions):
            raise ValueError(f"region names repeat: {self.regions}")

    @staticmethod
    def single(region: str) -> Worldmap:
        return Worldmap(1, (region,), np.zeros(1, np.uint64), np.zeros(1, np.int64))

    @staticmethod
    def balanced(regions: list[str], sample: npt.ArrayLike, version: int = 1) -> Worldmap:
        """Consecutive intervals holding equal shares of a sample of indices (e.g. bindings)."""
        h = np.sort(np.asarray(sample, dtype=np.uint64))
        if len(regions) < 1:
            raise ValueError("at least one region")
        cuts = [int(h[len(h) * i // len(regions)]) for i in range(1, len(regions))] if h.size else []
        starts = np.unique(np.array([0, *cuts], dtype=np.uint64))
        if starts.size != len(regions):
            raise ValueError("the sample is too small to split between these regions")
        return Worldmap(version, tuple(regions), starts, np.arange(len(regions), dtype=np.int64))

    @staticmethod
    def over_area(regions: list[str], bbox: tuple[float, float, float, float] | None = None,
                  version: int = 1) -> Worldmap:
        """Equal shares of an area (lon_min, lat_min, lon_max, lat_max; default the local
        stack's AREA) for each region: the map `geofence up` stores when there is none."""
        x0, y0, x1, y1 = AREA if bbox is None else bbox
        lon, lat = np.meshgrid(np.linspace(x0, x1, 256), np.linspace(y0, y1, 256))
        gx, gy = hk.lonlat_to_grid(lon.ravel(), lat.ravel(), INDEX_BITS)
        return Worldmap.balanced(regions, hk.encode_many(gx, gy, INDEX_BITS), version)

    # -- lookups ----------------------------------------------------------------------------

    def region_index(self, hs: npt.ArrayLike) -> npt.NDArray[np.int64]:
        i = np.searchsorted(self.starts, np.asarray(hs, dtype=np.uint64), side="right") - 1
        out: npt.NDArray[np.int64] = self.owner[i]
        return out

    def region_of(self, h: int) -> str:
        return self.regions[int(self.region_index(np.array([h], np.uint64))[0])]

    def intervals(self, region: str) -> U64:
        """The (N, 2) inclusive intervals a region owns (adjacent ones merged)."""
        r = self.regions.index(region)
        ends = np.r_[self.starts[1:] - np.uint64(1), np.uint64(TOP)].astype(np.uint64)
        mine = self.owner == r
        s, e = self.starts[mine], ends[mine]
        if s.size > 1:
            join = s[1:] == e[:-1] + np.uint64(1)
            keep_s = np.r_[True, ~join]
            keep_e = np.r_[~join, True]
            s, e = s[keep_s], e[keep_e]
        return np.stack([s, e], axis=1) if s.size else np.empty((0, 2), np.uint64)

    def clip(
        self, ranges: npt.ArrayLike, interior: npt.ArrayLike
    ) -> dict[str, tuple[U64, npt.NDArray[np.bool_]]]:
        """A fence's ranges divided between the regions that own them (pieces keep their flag)."""
        start, end, flag, _, owner = self.cut(ranges, interior)
        out = {}
        for ri in np.unique(owner).tolist():
            sel = owner == ri
            out[self.regions[ri]] = (np.stack([start[sel], end[sel]], axis=1).astype(np.uint64), flag[sel])
        return out

    def cut(self, ranges: npt.ArrayLike, interior: npt.ArrayLike) -> tuple[
            U64, U64, npt.NDArray[np.bool_], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Every range cut at each interval start strictly inside it: (piece start, piece end,
        flag, the row each piece comes from, its owner region index), pieces in row order.
        Vectorised over any number of ranges, so a batch of fences is cut in one call."""
        r = np.asarray(ranges, dtype=np.uint64).reshape(-1, 2)
        f = np.asarray(interior, dtype=bool).reshape(-1)
        lo = np.searchsorted(self.starts, r[:, 0], side="right")  # >= 1: starts[0] == 0
        n_cuts = np.searchsorted(self.starts, r[:, 1], side="right") - lo
        if not n_cuts.any():  # the usual case: no range crosses a boundary
            return (r[:, 0].copy(), r[:, 1].copy(), f.copy(), np.arange(len(r), dtype=np.int64),
                    self.owner[lo - 1])
        # Only the crossing ranges are expanded; every other range is its own single piece.
        first = np.arange(len(r)) + np.r_[0, np.cumsum(n_cuts)[:-1]]  # where each row's pieces begin
        total = len(r) + int(n_cuts.sum())
        p_start = np.empty(total, np.uint64)
        p_end = np.empty(total, np.uint64)
        row = np.empty(total, np.int64)
        at = np.empty(total, np.int64)  # the interval each piece lies in
        p_start[first], row[first], at[first] = r[:, 0], np.arange(len(r)), lo - 1
        p_end[first + n_cuts] = r[:, 1]
        crossing = np.flatnonzero(n_cuts)
        m = n_cuts[crossing]
        src = np.repeat(crossing, m)
        k = np.arange(src.size) - np.repeat(np.cumsum(m) - m, m)  # 0 for a row's first cut
        cut = lo[src] + k  # the interval whose start makes the cut
        dst = first[src] + k + 1  # the piece the cut begins
        p_start[dst], row[dst], at[dst] = self.starts[cut], src, cut
        p_end[dst - 1] = self.starts[cut] - np.uint64(1)
        return p_start, p_end, f[row], row, self.owner[at]

    # -- changes ----------------------------------------------------------------------------

    def split(self, region: str, at: int, new_region: str) -> Worldmap:
        """Scale out: the part of `region`'s interval containing `at`, from `at` to that
        interval's end, goes to `new_region` (a new or existing region)."""
        r = self.regions.index(region)
        i = int(np.searchsorted(self.starts, np.uint64(at), side="right") - 1)
        if int(self.owner[i]) != r:
            raise ValueError(f"index {at} is not in region {region!r}")
        if int(self.starts[i]) == at:
            raise ValueError(f"index {at} already starts an interval: nothing to split")
        regions = self.regions if new_region in self.regions else (*self.regions, new_region)
        starts = np.insert(self.starts, i + 1, np.uint64(at))
        owner = np.insert(self.owner, i + 1, regions.index(new_region))
        return Worldmap(self.version + 1, regions, starts, owner)

    def join(self, region: str, into: str) -> Worldmap:
        """Scale in: everything `region` owns goes to `into`; `region` disappears."""
        r, t = self.regions.index(region), self.regions.index(into)
        owner = np.where(self.owner == r, t, self.owner)
        keep = np.r_[True, owner[1:] != owner[:-1]]  # merge neighbours with the same owner
        regions = tuple(x for x in self.regions if x != region)
        remap = np.array([regions.index(x) if x != region else -1 for x in self.regions])
        return Worldmap(self.version + 1, regions, self.starts[keep], remap[owner[keep]])

    def vacate(self, region: str, into: str) -> Worldmap:
        """The first step of a live scale in: everything `region` owns goes to `into`, but
        `region` stays listed (owning nothing), so x-ingress still tells it when an object it
        last routed there moves on (a handover notice), as for any crossing. `drop` ends it."""
        r, t = self.regions.index(region), self.regions.index(into)
        if r == t:
            raise ValueError(f"region {region!r} cannot be joined into itself")
        owner = np.where(self.owner == r, t, self.owner)
        keep = np.r_[True, owner[1:] != owner[:-1]]
        return Worldmap(self.version + 1, self.regions, self.starts[keep], owner[keep])

    def drop(self, region: str) -> Worldmap:
        """Remove a region that owns nothing (after `vacate`)."""
        r = self.regions.index(region)
        if (self.owner == r).any():
            raise ValueError(f"region {region!r} still owns part of the curve: vacate it first")
        regions = tuple(x for x in self.regions if x != region)
        remap = np.array([regions.index(x) if x != region else -1 for x in self.regions])
        return Worldmap(self.version + 1, regions, self.starts, remap[self.owner])

    def balanced_cut(self, region: str, sample: npt.ArrayLike) -> int:
        """Where to split `region` so each side holds about half of `sample` (indices, e.g.
        the starts of the ranges bound there): the sample's median inside the region's
        largest-sample interval, moved off an interval start. ValueError if there is no such
        point (a region with nothing bound is split in the middle of its largest interval)."""
        spans = self.intervals(region)
        if not len(spans):
            raise ValueError(f"region {region!r} owns no part of the curve")
        h = np.sort(np.asarray(sample, dtype=np.uint64))
        counts = [int(np.count_nonzero((h >= s) & (h <= e))) for s, e in spans]
        s, e = (int(x) for x in spans[int(np.argmax(counts))])
        inside = h[(h > np.uint64(s)) & (h <= np.uint64(e))]
        at = int(inside[len(inside) // 2]) if inside.size else s + (e - s + 1) // 2
        if not s < at <= e:
            raise ValueError(f"region {region!r}'s interval [{s}, {e}] is too small to split")
        return at

    # -- persistence ------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "bits": INDEX_BITS, "regions": list(self.regions),
                "intervals": [[int(s), self.regions[int(o)]]
                              for s, o in zip(self.starts, self.owner, strict=True)]}

    @staticmethod
    def from_json(d: dict[str, Any]) -> Worldmap:
        if d.get("bits") != INDEX_BITS:
            raise ValueError(f"worldmap is for {d.get('bits')} bits per axis, we route at {INDEX_BITS}")
        regions = tuple(d["regions"])
        starts = np.array([int(s) for s, _ in d["intervals"]], dtype=np.uint64)
        owner = np.array([regions.index(r) for _, r in d["intervals"]], dtype=np.int64)
        return Worldmap(int(d["version"]), regions, starts, owner)
