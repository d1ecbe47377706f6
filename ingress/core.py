"""x-ingress: the routing core of the shovel-like sidecar (no I/O).

Validated positions get their Hilbert index (one C call per batch) and are split by the
worldmap into one batch per x-geo region. x-ingress also remembers the region each object
was last sent to: when an object crosses into another region, the old region is told
(a handover notice with the new position), so its x-geo can make the fences there emit
LEAVE at once; without it the old region would never hear of the object again and its
fences would only see the object time out.

It also remembers when each object entered its region, and gives every row its `gate`
(exchanges/x_geo/core.py: a position's is its object's entry into its region, a notice's the
entry into the region it left), so the workers apply one object's positions in time order.

Trade-off: that memory is one small int and one float per object in this process, so all positions of an
object must go through the same x-ingress (objects are spread over x-ingress instances by
the consistent-hash ring, like fences over x-fence workers).

Restarts: the memory is not persisted; it is re-derived. An object this process has not
seen yet (new, or seen before a restart) may have been in any region, with positions still
queued there (a busy or restarting x-geo). So its first position is *announced*: in its own
region it goes to every worker (a worker that had the object in a fence elsewhere hears of
it and LEAVEs), gated on its own ts; every other region gets a barrier notice that follows
the object's positions already queued there and, at the workers, only opens that gate. The
position is thus applied after what the object did before (in a region's order) and a
position still queued cannot turn stale behind it. The cost, for each object's first
position after a start: one copy per worker and one barrier per other region. With more
than two regions the first barrier through opens the gate (the workers keep one handover
time per object): exact for two regions, a residual race beyond.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

import hilbert_c as hk
from exchanges.batch import PositionBatch, RegionBatch
from exchanges.fence_binding import INDEX_BITS
from exchanges.object_codes import ObjectCodes, carry, distinct, grow
from exchanges.worldmap import Worldmap


def entries(codes: npt.NDArray[np.int64], came_in: npt.NDArray[np.bool_], ts: npt.NDArray[np.float64],
            memory: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per position: when its object entered the region it was in just before, and the
    region it is in now (its own ts where it `came_in`); memory takes each object's last."""
    if distinct(codes, memory.size):  # the common case: one position per object
        before = memory[codes]
        entry = np.where(came_in, ts, before)
        memory[codes] = entry
        return before, entry
    order = np.argsort(codes, kind="stable")  # each object's positions in batch (time) order
    c, ci = codes[order], came_in[order]
    m = c.size
    first = np.r_[True, c[1:] != c[:-1]]
    value = np.where(ci, ts[order], memory[c])
    source = np.maximum.accumulate(np.where(ci | first, np.arange(m), 0))  # last entry or group start
    entry_s = value[source]
    before_s = np.empty(m)
    before_s[first] = memory[c[first]]
    before_s[~first] = entry_s[:-1][~first[1:]]
    last = np.r_[first[1:], True]
    memory[c[last]] = entry_s[last]
    before, entry = np.empty(m), np.empty(m)
    before[order], entry[order] = before_s, entry_s
    return before, entry


@dataclass(frozen=True, eq=False)
class Routed:
    regions: dict[str, RegionBatch]

    @property
    def positions(self) -> dict[str, PositionBatch]:
        """Per region, its positions (without the notices)."""
        return {r: b.batch.take(np.flatnonzero(~b.notice))
                for r, b in self.regions.items() if not b.notice.all()}

    @property
    def handovers(self) -> dict[str, PositionBatch]:
        """Per region, the notices of objects that left it."""
        return {r: b.batch.take(np.flatnonzero(b.notice)) for r, b in self.regions.items() if b.notice.any()}


class XIngress:
    def __init__(self, worldmap: Worldmap, announce_unknown: bool = True) -> None:
        self.worldmap = worldmap
        self.announce_unknown = announce_unknown  # see the module's docstring (Restarts)
        self.forget_objects()

    def forget_objects(self) -> None:
        """Drop the memory of objects (each is announced again at its next position)."""
        self._objects = ObjectCodes()
        self._last_region = np.full(0, -1, dtype=np.int64)  # object code -> region index
        self._entry = np.zeros(0, dtype=np.float64)  # object code -> ts it entered it (0: unknown)

    def set_worldmap(self, worldmap: Worldmap) -> bool:
        """Take a newer map (an older or equal version is ignored). Objects keep their last
        region by name, so a split produces handovers for objects now routed elsewhere."""
        if worldmap.version <= self.worldmap.version:
            return False
        old = self.worldmap.regions
        remap = np.array([worldmap.regions.index(r) if r in worldmap.regions else -1 for r in old]
                         + [-1], dtype=np.int64)
        self._last_region = remap[self._last_region]  # -1 stays -1 (last entry)
        self.worldmap = worldmap
        return True

    def route(self, batch: PositionBatch) -> Routed:
        if len(batch) == 0:
            return Routed({})
        x, y = hk.lonlat_to_grid(batch.lon, batch.lat, INDEX_BITS)
        h = hk.encode_many(x, y, INDEX_BITS)
        batch = PositionBatch(batch.ids, batch.lon, batch.lat, batch.ts, h, batch.extra)
        region = self.worldmap.region_index(h)
        codes = self._objects.codes(batch.ids)
        self._last_region = grow(self._last_region, len(self._objects), -1)
        self._entry = grow(self._entry, len(self._objects), 0.0)
        prev = carry(codes, region, self._last_region)  # region of each object just before

        crossed = (prev >= 0) & (prev != region)
        unknown = (prev < 0) if self.announce_unknown and len(self.worldmap.regions) > 1 \
            else np.zeros(prev.size, bool)
        came_in = crossed | unknown
        before, entry = entries(codes, came_in, batch.ts, self._entry)
        out = {}
        for ri, name in enumerate(self.worldmap.regions):
            here = region == ri
            notice = (crossed & (prev == ri)) | (unknown & ~here)
            rows = np.flatnonzero(here | notice)
            if rows.size:
                announced = unknown[rows]
                gate = np.where(here, entry, before)[rows]  # a notice: the stay it ends
                out[name] = RegionBatch(batch.take(rows), notice[rows], gate,
                                        announced if announced.any() else None)
        return Routed(out)

    def region_of_object(self, object_id: str) -> str | None:
        c = self._objects.get(object_id)
        if c is None or self._last_region[c] < 0:
            return None
        return self.worldmap.regions[int(self._last_region[c])]
