"""x-geo: the "special fanout" exchange of one region, routing on the Hilbert index.

Bindings are fences' Hilbert ranges (clipped to the region by whoever binds them); `route`
takes a whole batch of positions and returns, per x-fence worker, the positions it must
see with their candidate fences (and whether the covering block is interior, so x-fence
can skip the exact polygon test). Fences are spread over workers by a consistent-hash ring.

Trade-off: x-geo remembers, per object, the workers it routed the object to last time
(a bitmask, one int per object). A position whose candidates no longer include a worker
that had the object is still sent there, with no candidates: that is the seed's *control*
message, and it lets the worker emit LEAVE at once instead of after a timeout. The memory
costs O(objects) here, and lets the workers stay free of any global view. A handover notice
(the object went to another region) is the same: a position with no candidates here. Given
to `route` with the batch it came from, it is taken in time order with the positions; told
afterwards (`objects_left`), it can only follow them.
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


def dense_numbers(values: npt.NDArray[np.int32], bound: int) -> tuple[npt.NDArray[np.int64],
                                                                      npt.NDArray[np.int32]]:
    """(distinct values sorted, each value's number among them): np.unique with
    return_inverse, in linear time through a scratch array when the bound is not much
    larger than the input (numpy's unique sorts)."""
    if bound > 4 * values.size + 1024:
        uniq, inv = np.unique(values, return_inverse=True)
        return uniq.astype(np.int64), inv.astype(np.int32).reshape(-1)
    present = np.zeros(bound, dtype=bool)
    present[values] = True
    distinct = np.flatnonzero(present)
    number = np.empty(bound, dtype=np.int32)
    number[distinct] = np.arange(distinct.size, dtype=np.int32)
    return distinct, number[values]


def worker_sets(point: npt.NDArray[np.int64], worker: npt.NDArray[np.int64], n: int) -> npt.NDArray[np.int64]:
    """Per position of a batch of n, the bitmask of the workers of its matches (matches
    sorted by point)."""
    out = np.zeros(n, dtype=np.int64)
    if point.size:
        starts = np.flatnonzero(np.r_[True, point[1:] != point[:-1]])
        out[point[starts]] = np.bitwise_or.reduceat(np.left_shift(np.int64(1), worker), starts)
    return out


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

    @staticmethod
    def concat(batches: Sequence[WorkerBatch]) -> WorkerBatch:
        """One batch holding the positions of several for the same worker (e.g. what several
        regions routed, and their handover notices). The fence lists are appended, not
        merged: a fence named by two of the batches is named twice (in-process use; a
        message for the wire is better built by one x-geo)."""
        if not batches:
            raise ValueError("nothing to concatenate")
        if len(batches) == 1:
            return batches[0]
        worker = batches[0].worker
        if any(b.worker != worker for b in batches):
            raise ValueError(f"batches for different workers: {sorted({b.worker for b in batches})}")
        fences: list[str] = []
        cands, ptrs, offset = [], [np.zeros(1, np.int64)], 0
        for b in batches:
            cands.append(b.cand.astype(np.int32) + np.int32(len(fences)))
            fences += b.fences
            ptrs.append(b.ptr[1:] + offset)
            offset += int(b.ptr[-1])
        return WorkerBatch(
            worker, PositionBatch.concat([b.positions for b in batches]), np.concatenate(ptrs),
            fences, np.concatenate(cands), np.concatenate([b.interior for b in batches]),
        )

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

    def compact(self) -> None:
        """Fold pending binding changes into the routing table now (after a bulk of
        add_binding), instead of in the next route."""
        self._index.compact()

    def recover(self, bindings: Iterable[FenceBinding]) -> None:
        """Rebuild from durable bindings; what objects were routed where is not recovered
        (the first position of each object after a restart re-establishes it)."""
        self.create()
        for b in bindings:
            self.add_binding(b)
        self._index.compact()

    def route(self, batch: PositionBatch, left: PositionBatch | None = None) -> dict[str, WorkerBatch]:
        """Per worker: the positions it must see and their candidate fences on it.

        `left` are the handover notices x-ingress computed from the same batch (positions,
        in the region they went to, of objects that left this one): as `objects_left`, but
        taken in time order with the positions, which matters only for an object that is
        both here and gone within the batch (it crossed back and forth): its worker must
        hear of the exit between its positions, not after them.
        """
        codes = self._objects.codes(batch.ids)
        if left is None or not len(left):
            return self._route(batch, codes)
        if self._crossed_back(codes, left.ids):
            merged = PositionBatch.concat([batch, left])
            order = np.argsort(merged.ts, kind="stable")  # an object's own updates are in time order
            notice = np.r_[np.zeros(len(batch), bool), np.ones(len(left), bool)][order]
            merged = merged.take(order)
            return self._route(merged, self._objects.codes(merged.ids), no_match=notice)
        out = self._route(batch, codes)
        for worker, wb in self.objects_left(left.ids, left.ts, left.lon, left.lat, left.h).items():
            out[worker] = WorkerBatch.concat([out[worker], wb]) if worker in out else wb
        return out

    def _route(self, batch: PositionBatch, codes: npt.NDArray[np.int64],
               no_match: npt.NDArray[np.bool_] | None = None) -> dict[str, WorkerBatch]:
        """route() for positions whose object codes are known; positions flagged no_match
        (handover notices) get no candidates here."""
        n = len(batch)
        if n == 0:
            return {}
        m = self._index.route(batch.h)
        if no_match is not None:
            m = m.take(np.flatnonzero(~no_match[m.point]))
        w_of_match = self._worker_of_slot[m.slot]
        now = worker_sets(m.point, w_of_match, n)
        self._last_mask = grow(self._last_mask, len(self._objects), 0)
        targets = now | carry(codes, now, self._last_mask)
        out = {}
        local = np.empty(n, np.int64)
        for wi, worker in enumerate(self.workers):
            pts = np.flatnonzero(targets & (1 << wi))
            if not pts.size:
                continue
            sel = np.flatnonzero(w_of_match == wi)  # in point order, as m is
            local[pts] = np.arange(pts.size)
            ptr = np.zeros(pts.size + 1, dtype=np.int64)
            np.cumsum(np.bincount(local[m.point[sel]], minlength=pts.size), out=ptr[1:])
            slots, cand = dense_numbers(m.slot[sel], self._index.slot_count())
            out[worker] = WorkerBatch(
                worker, batch.take(pts), ptr, self._index.fence_of_slot(slots), cand, m.interior[sel],
            )
        return out

    def _crossed_back(self, codes: npt.NDArray[np.int64], left_ids: Sequence[str]) -> bool:
        """Has an object of these notices also a position (codes) in the batch?"""
        table = self._objects.table
        gone = [c for c in map(table.get, left_ids) if c is not None]
        if not gone or not codes.size:
            return False
        here = np.zeros(len(self._objects), bool)
        here[codes] = True
        return bool(here[np.array(gone, np.int64)].any())

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
