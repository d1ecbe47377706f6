"""x-ingress: the routing core of the shovel-like sidecar (no I/O).

Validated positions get their Hilbert index (one C call per batch) and are split by the
worldmap into one batch per x-geo region. x-ingress also remembers the region each object
was last sent to: when an object crosses into another region, the old region is told
(a handover notice with the new position), so its x-geo can make the fences there emit
LEAVE at once; without it the old region would never hear of the object again and its
fences would only see the object time out.

Trade-off: that memory is one small int per object in this process, so all positions of an
object must go through the same x-ingress (objects are spread over x-ingress instances by
the consistent-hash ring, like fences over x-fence workers).

Restarts: the memory is not persisted; it is re-derived. An object this process has not
seen yet (new, or seen before a restart) may have been in any region, so its first position
is also a notice to every other region (not gated: no worker waits for it). An x-geo that
never had the object forwards a notice that changes nothing; the one that had it lets its
fences LEAVE at once, as after a crossing. The cost is one notice per other region for each
object's first position after a start.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import hilbert_c as hk
from exchanges.batch import PositionBatch, RegionBatch
from exchanges.object_codes import ObjectCodes, carry, grow
from exchanges.range_index import INDEX_BITS
from ingress.worldmap import Worldmap


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
        self._objects = ObjectCodes()
        self._last_region = np.full(0, -1, dtype=np.int64)  # object code -> region index

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
        prev = carry(codes, region, self._last_region)  # region of each object just before

        crossed = (prev >= 0) & (prev != region)
        unknown = prev < 0 if self.announce_unknown else np.zeros(prev.size, bool)
        out = {}
        for ri, name in enumerate(self.worldmap.regions):
            here = region == ri
            notice = (crossed & (prev == ri)) | (unknown & ~here)
            rows = np.flatnonzero(here | notice)
            if rows.size:
                out[name] = RegionBatch(batch.take(rows), notice[rows], (crossed & here)[rows])
        return Routed(out)

    def region_of_object(self, object_id: str) -> str | None:
        c = self._objects.get(object_id)
        if c is None or self._last_region[c] < 0:
            return None
        return self.worldmap.regions[int(self._last_region[c])]
