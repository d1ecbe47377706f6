"""Hilbert ranges -> fences: the routing table of x-geo.

Trade-off: fences overlap (in the fleet-over-fences benchmark a point lies in ~20 fences),
so a flat table of elementary segments with the set of fences over each one grows like
ranges x overlap. Here every fence's ranges are cut into aligned blocks of the curve
(4**k consecutive indices = one quadtree cell, which is how the covering was built) and
each block is stored once per fence, in one sorted array per block size ("level").
Storage is linear in the fences' cells; a query is one vectorised `searchsorted` per
occupied level for the whole batch. A fence's blocks are disjoint, so a point meets each
fence at most once.

Changes go to a small delta index (rebuilt lazily, at the next query, so a burst of changes
costs one rebuild); removed or replaced fences are masked in the base until the delta
outgrows a share of the base and everything is compacted. Moving fences therefore cost
O(delta), not O(table), per change.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from hilbert_c.covering import split_ranges

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]

INDEX_BITS = 26  # bits per axis of the indices routed (positions are encoded at 26 bits)


@dataclass(frozen=True)
class Matches:
    """Pairs (point, fence) of one routed batch, sorted by point then by level found."""

    point: I64  # index into the batch
    slot: npt.NDArray[np.int32]  # fence slot; RangeIndex.fence_of_slot names it
    interior: npt.NDArray[np.bool_]  # the block lies wholly inside the fence: no exact check

    def __len__(self) -> int:
        return int(self.point.size)


@dataclass(frozen=True)
class _Levels:
    """Blocks of many fences: per level k, sorted unique keys (index >> 2k) and the CSR of
    (slot, interior) of the fences holding that block."""

    levels: tuple[int, ...]
    keys: tuple[U64, ...]
    ptr: tuple[I64, ...]
    slots: tuple[npt.NDArray[np.int32], ...]
    interior: tuple[npt.NDArray[np.bool_], ...]
    cells: int  # blocks stored

    @staticmethod
    def build(parts: Iterable[tuple[int, U64, npt.NDArray[np.bool_]]]) -> _Levels:
        """parts: (slot, ranges (N, 2) at INDEX_BITS, interior flags)."""
        all_k, all_key, all_slot, all_in = [], [], [], []
        for slot, ranges, interior in parts:
            if not len(ranges):
                continue
            starts, ks, owner = split_ranges(ranges, INDEX_BITS)
            all_k.append(ks)
            all_key.append(starts >> (2 * ks).astype(np.uint64))
            all_slot.append(np.full(ks.size, slot, dtype=np.int32))
            all_in.append(interior[owner])
        if not all_k:
            return _Levels((), (), (), (), (), 0)
        k = np.concatenate(all_k)
        key = np.concatenate(all_key)
        slot = np.concatenate(all_slot)
        inner = np.concatenate(all_in)
        order = np.lexsort((slot, key, k))
        k, key, slot, inner = k[order], key[order], slot[order], inner[order]
        levels, keys, ptrs, slots, inners = [], [], [], [], []
        bounds = np.flatnonzero(np.diff(k)) + 1
        for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, k.size], strict=True):
            lk = key[lo:hi]
            first = np.r_[True, lk[1:] != lk[:-1]]
            levels.append(int(k[lo]))
            keys.append(lk[first])
            ptrs.append(np.r_[np.flatnonzero(first), lk.size].astype(np.int64))
            slots.append(slot[lo:hi])
            inners.append(inner[lo:hi])
        return _Levels(tuple(levels), tuple(keys), tuple(ptrs), tuple(slots), tuple(inners), int(k.size))

    def query(self, hs: U64) -> tuple[I64, npt.NDArray[np.int32], npt.NDArray[np.bool_]]:
        pts, sls, ins = [], [], []
        for level, keys, ptr, slots, inner in zip(
            self.levels, self.keys, self.ptr, self.slots, self.interior, strict=True
        ):
            q = hs >> np.uint64(2 * level)
            pos = np.searchsorted(keys, q)
            pos_c = np.minimum(pos, keys.size - 1)
            hit = np.flatnonzero(keys[pos_c] == q)
            if not hit.size:
                continue
            b = pos_c[hit]
            counts = ptr[b + 1] - ptr[b]
            # expand each hit into its CSR run of fences
            point = np.repeat(hit, counts)
            starts = np.repeat(ptr[b], counts)
            offs = np.arange(point.size) - np.repeat(np.cumsum(counts) - counts, counts)
            idx = starts + offs
            pts.append(point)
            sls.append(slots[idx])
            ins.append(inner[idx])
        if not pts:
            return np.empty(0, np.int64), np.empty(0, np.int32), np.empty(0, bool)
        return np.concatenate(pts), np.concatenate(sls), np.concatenate(ins)


class RangeIndex:
    """Fences' Hilbert ranges (at INDEX_BITS), routed a whole batch at a time.

    Each `add` takes a new slot for the fence (a replaced fence's old slot is masked), so a
    query never sees half of an update. Not thread-safe: one owner (the x-geo core).
    """

    def __init__(self, compact_ratio: float = 0.125, compact_min_cells: int = 50_000) -> None:
        self._compact_ratio = compact_ratio
        self._compact_min = compact_min_cells
        self._slot_of: dict[str, int] = {}
        self._fence_of_slot: list[str | None] = []
        self._parts: dict[int, tuple[U64, npt.NDArray[np.bool_]]] = {}  # live slot -> ranges
        self._alive = np.zeros(0, dtype=bool)
        self._base = _Levels.build(())
        self._delta: _Levels | None = _Levels.build(())
        self._delta_slots: set[int] = set()

    # -- changes ------------------------------------------------------------------------

    def add(self, fence_id: str, ranges: npt.ArrayLike, interior: npt.ArrayLike | None = None) -> None:
        """Bind (or re-bind) a fence to sorted, disjoint, inclusive ranges at INDEX_BITS."""
        r = np.asarray(ranges, dtype=np.uint64).reshape(-1, 2)
        flags = (np.zeros(len(r), dtype=bool) if interior is None
                 else np.asarray(interior, dtype=bool).reshape(-1))
        if flags.shape != (len(r),):
            raise ValueError(f"interior has {flags.size} flags for {len(r)} ranges")
        if len(r) and not ((r[:, 0] <= r[:, 1]).all() and (r[1:, 0] > r[:-1, 1]).all()):
            raise ValueError(f"ranges of fence {fence_id!r} are not sorted, disjoint and inclusive")
        if len(r) and int(r[-1, 1]) >= 1 << (2 * INDEX_BITS):
            raise ValueError(f"ranges of fence {fence_id!r} exceed the {INDEX_BITS}-bit curve")
        self.remove(fence_id, missing_ok=True)
        slot = len(self._fence_of_slot)
        self._fence_of_slot.append(fence_id)
        self._slot_of[fence_id] = slot
        self._parts[slot] = (r, flags)
        self._alive = np.append(self._alive, True)
        self._delta_slots.add(slot)
        self._delta = None  # rebuilt at the next query

    def remove(self, fence_id: str, missing_ok: bool = False) -> None:
        slot = self._slot_of.pop(fence_id, None)
        if slot is None:
            if missing_ok:
                return
            raise KeyError(f"fence {fence_id!r} is not bound")
        self._alive[slot] = False
        self._fence_of_slot[slot] = None
        del self._parts[slot]
        if slot in self._delta_slots:
            self._delta_slots.discard(slot)
            self._delta = None

    # -- queries ------------------------------------------------------------------------

    def route(self, hs: npt.ArrayLike) -> Matches:
        """All (point, fence) pairs whose ranges hold the points' indices."""
        h = np.asarray(hs, dtype=np.uint64).reshape(-1)
        self._refresh()
        assert self._delta is not None
        p1, s1, i1 = self._base.query(h)
        keep = self._alive[s1] if s1.size else np.zeros(0, bool)
        p2, s2, i2 = self._delta.query(h)
        point = np.concatenate([p1[keep], p2])
        slot = np.concatenate([s1[keep], s2])
        inner = np.concatenate([i1[keep], i2])
        order = np.argsort(point, kind="stable")
        return Matches(point[order], slot[order], inner[order])

    def fence_of_slot(self, slots: npt.ArrayLike) -> list[str]:
        names = self._fence_of_slot
        return [names[int(s)] or "" for s in np.asarray(slots).reshape(-1)]

    def fences(self) -> list[str]:
        return sorted(self._slot_of)

    def ranges_of(self, fence_id: str) -> tuple[U64, npt.NDArray[np.bool_]]:
        return self._parts[self._slot_of[fence_id]]

    def __contains__(self, fence_id: object) -> bool:
        return fence_id in self._slot_of

    def __len__(self) -> int:
        return len(self._slot_of)

    def stats(self) -> dict[str, int]:
        self._refresh()
        assert self._delta is not None
        return {
            "fences": len(self._slot_of),
            "ranges": sum(len(r) for r, _ in self._parts.values()),
            "base_blocks": self._base.cells,
            "delta_blocks": self._delta.cells,
            "levels": len(set(self._base.levels) | set(self._delta.levels)),
            "dead_slots": len(self._fence_of_slot) - len(self._slot_of),
        }

    # -- maintenance --------------------------------------------------------------------

    def _refresh(self) -> None:
        if self._delta is not None:
            return
        delta = _Levels.build((s, *self._parts[s]) for s in sorted(self._delta_slots))
        if delta.cells > max(self._compact_min, self._compact_ratio * self._base.cells):
            self.compact()
        else:
            self._delta = delta

    def compact(self) -> None:
        """Fold the delta into a new base and forget dead slots (renumbering slots)."""
        live = sorted(self._slot_of.items(), key=lambda kv: kv[1])
        self._fence_of_slot = [fid for fid, _ in live]
        parts = [self._parts[slot] for _, slot in live]
        self._slot_of = {fid: i for i, (fid, _) in enumerate(live)}
        self._parts = dict(enumerate(parts))
        self._alive = np.ones(len(live), dtype=bool)
        self._base = _Levels.build((i, r, f) for i, (r, f) in enumerate(parts))
        self._delta_slots = set()
        self._delta = _Levels.build(())
