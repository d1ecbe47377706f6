"""x-geo: the "special fanout" exchange of one region, routing on the Hilbert index.

Bindings are fences' Hilbert ranges (clipped to the region by whoever binds them); `route`
takes a whole batch of positions and returns, per x-fence worker, the positions it must
see with their candidate fences (and whether the covering block is interior, so x-fence
can skip the exact polygon test). Fences are spread over workers by a consistent-hash ring.

Trade-off: x-geo remembers, per object, the workers it routed the object to last time
(a bitmask, one int per object). A position whose candidates no longer include a worker
that had the object is still sent there, with no candidates: that is the seed's *control*
message, and it lets the worker emit LEAVE at once instead of after a timeout. The memory
costs O(objects) here, and lets the workers stay free of any global view.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from exchanges.batch import PositionBatch
from exchanges.contract import InvalidMessage
from exchanges.object_codes import ObjectCodes, carry, grow
from exchanges.range_index import INDEX_BITS, RangeIndex

MAX_WORKERS = 63  # worker sets are bitmasks in an int64


class Ring(Protocol):
    def node_for(self, key: str) -> str: ...


@dataclass(frozen=True, eq=False)
class FenceBinding:
    """A fence's ranges in this region, at INDEX_BITS (26 bits per axis)."""

    fence_id: str
    version: int
    ranges: npt.NDArray[np.uint64]
    interior: npt.NDArray[np.bool_]


@dataclass(frozen=True, eq=False)
class WorkerBatch:
    """What one x-fence worker receives: positions (CSR of candidates per position)."""

    worker: str
    positions: PositionBatch
    ptr: npt.NDArray[np.int64]  # candidates of position i: cand[ptr[i]:ptr[i+1]]
    fences: list[str]  # the fence ids this message mentions
    cand: npt.NDArray[np.int32]  # index into `fences`
    interior: npt.NDArray[np.bool_]

    def candidates(self, i: int) -> list[tuple[str, bool]]:
        lo, hi = int(self.ptr[i]), int(self.ptr[i + 1])
        return [(self.fences[int(c)], bool(f)) for c, f in zip(self.cand[lo:hi], self.interior[lo:hi],
                                                              strict=True)]

    def to_wire(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "positions": self.positions.to_wire(),
            "ptr": self.ptr.astype("<i8").tobytes(),
            "fences": self.fences,
            "cand": self.cand.astype("<i4").tobytes(),
            "interior": self.interior.astype(np.uint8).tobytes(),
        }

    @staticmethod
    def from_wire(d: dict[str, Any]) -> WorkerBatch:
        return WorkerBatch(
            d["worker"], PositionBatch.from_wire(d["positions"]),
            np.frombuffer(d["ptr"], "<i8").astype(np.int64), list(d["fences"]),
            np.frombuffer(d["cand"], "<i4").astype(np.int32),
            np.frombuffer(d["interior"], np.uint8).astype(bool),
        )


class XGeo:
    """The routing core of one x-geo instance (no I/O; see exchanges.contract)."""

    def __init__(self, region: str, workers: Sequence[str], ring: Ring) -> None:
        if not workers or len(workers) > MAX_WORKERS or len(set(workers)) != len(workers):
            raise ValueError(f"1..{MAX_WORKERS} distinct workers, got {list(workers)}")
        self.region = region
        self.workers = list(workers)
        self._worker_index = {w: i for i, w in enumerate(self.workers)}
        self._ring = ring
        self.create()

    # -- contract -------------------------------------------------------------------------

    def create(self) -> None:
        self._index = RangeIndex()
        self._versions: dict[str, int] = {}  # bound fences, and the last version of removed ones
        self._worker_of_slot = np.zeros(0, dtype=np.int64)
        self._objects = ObjectCodes()
        self._last_mask = np.zeros(0, dtype=np.int64)  # object code -> workers routed to last

    def delete(self) -> None:
        self.create()

    def validate(self, batch: PositionBatch) -> None:
        if len(batch) and (batch.h >= np.uint64(1 << (2 * INDEX_BITS))).any():
            raise InvalidMessage(f"a Hilbert index is beyond the {INDEX_BITS}-bit curve")
        if not (np.isfinite(batch.ts).all()):
            raise InvalidMessage("a timestamp is not a finite number")

    def add_binding(self, binding: FenceBinding) -> None:
        """Bind or re-bind a fence; an older version than the one known is ignored."""
        known = self._versions.get(binding.fence_id)
        if known is not None and binding.version < known:
            return
        self._versions[binding.fence_id] = binding.version
        self._index.add(binding.fence_id, binding.ranges, binding.interior)
        slot = self._index.slot_of(binding.fence_id)
        if slot >= self._worker_of_slot.size:
            grown = np.zeros(max(64, 2 * slot + 2), dtype=np.int64)
            grown[: self._worker_of_slot.size] = self._worker_of_slot
            self._worker_of_slot = grown
        self._worker_of_slot[slot] = self._worker_index[self._ring.node_for(binding.fence_id)]

    def remove_bindings(self, bindings: Iterable[tuple[str, int]]) -> None:
        """Unbind (fence_id, version) pairs; idempotent, and a stale version is ignored."""
        for fence_id, version in bindings:
            known = self._versions.get(fence_id)
            if known is not None and version < known:
                continue
            self._versions[fence_id] = version
            self._index.remove(fence_id, missing_ok=True)

    def recover(self, bindings: Iterable[FenceBinding]) -> None:
        """Rebuild from durable bindings; what objects were routed where is not recovered
        (the first position of each object after a restart re-establishes it)."""
        self.create()
        for b in bindings:
            self.add_binding(b)
        self._index.compact()

    def route(self, batch: PositionBatch) -> dict[str, WorkerBatch]:
        """Per worker: the positions it must see and their candidate fences on it."""
        n = len(batch)
        if n == 0:
            return {}
        m = self._index.route(batch.h)
        w_of_match = self._worker_of_slot[m.slot]
        bit = np.left_shift(np.int64(1), w_of_match)
        now = np.zeros(n, dtype=np.int64)
        np.bitwise_or.at(now, m.point, bit)
        codes = self._objects.codes(batch.ids)
        self._last_mask = grow(self._last_mask, len(self._objects), 0)
        targets = now | carry(codes, now, self._last_mask)
        out = {}
        for wi, worker in enumerate(self.workers):
            pts = np.flatnonzero(targets & (1 << wi))
            if not pts.size:
                continue
            sel = np.flatnonzero(w_of_match == wi)
            local = np.searchsorted(pts, m.point[sel])
            ptr = np.zeros(pts.size + 1, dtype=np.int64)
            np.cumsum(np.bincount(local, minlength=pts.size), out=ptr[1:])
            slots, cand = np.unique(m.slot[sel], return_inverse=True)
            out[worker] = WorkerBatch(
                worker, batch.take(pts), ptr, self._index.fence_of_slot(slots),
                cand.astype(np.int32).reshape(-1), m.interior[sel],
            )
        return out

    def objects_left(self, ids: Sequence[str], ts: npt.ArrayLike, lon: npt.ArrayLike,
                     lat: npt.ArrayLike, h: npt.ArrayLike) -> dict[str, WorkerBatch]:
        """Objects handed over to another region (told by x-ingress): the workers that had
        them get their new position with no candidates from this region, and we forget them."""
        table = self._objects.table
        keep = [i for i, o in enumerate(ids) if o in table and self._last_mask[table[o]]]
        if not keep:
            return {}
        pos = PositionBatch(list(ids), np.asarray(lon, np.float64), np.asarray(lat, np.float64),
                            np.asarray(ts, np.float64), np.asarray(h, np.uint64)).take(keep)
        codes = np.array([table[o] for o in pos.ids], dtype=np.int64)
        masks = self._last_mask[codes]
        self._last_mask[codes] = 0
        out = {}
        for wi, worker in enumerate(self.workers):
            pts = np.flatnonzero(masks & (1 << wi))
            if pts.size:
                out[worker] = WorkerBatch(worker, pos.take(pts), np.zeros(pts.size + 1, np.int64),
                                          [], np.empty(0, np.int32), np.empty(0, bool))
        return out

    # -- state for `geofence inspect geo` ---------------------------------------------------

    def fences(self) -> list[str]:
        return self._index.fences()

    def worker_of(self, fence_id: str) -> str:
        return self.workers[int(self._worker_of_slot[self._index.slot_of(fence_id)])]

    def objects(self) -> dict[str, list[str]]:
        """Objects currently routed to some worker, and to which."""
        masks = self._last_mask[: len(self._objects)]
        return {self._objects.ids[c]: [w for i, w in enumerate(self.workers) if int(masks[c]) & (1 << i)]
                for c in np.flatnonzero(masks).tolist()}

    def stats(self) -> dict[str, object]:
        tracked = int(np.count_nonzero(self._last_mask))
        return {"region": self.region, "objects": tracked, **self._index.stats()}

    # -- internals ------------------------------------------------------------------------
