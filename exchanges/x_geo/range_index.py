"""Hilbert ranges -> fences: the routing table of x-geo.

Trade-off: fences overlap (in the fleet-over-fences benchmark a point lies in ~20 fences),
so a flat table of elementary segments with the set of fences over each one grows like
ranges x overlap. Here every fence's ranges are cut into aligned blocks of the curve
(4**k consecutive indices = one quadtree cell, which is how the covering was built) and each
block is stored once per fence under the composite key (k, index >> 2k). Storage is linear
in the fences' blocks, and a fence's blocks are disjoint, so a point meets each fence at
most once. A query is one search per occupied level of each run for the whole batch, among
that level's distinct block indices (blocks of several fences on one cell share an entry),
with the batch's indices sorted so that each search starts where the previous one ended
(`kernel.match_sorted`): levels that hold a handful of blocks (pieces cut by a region's
edge) cost next to nothing.

Changes must be cheap (moving fences re-bind every second), so the table is a few sorted
runs, like an LSM tree: a change only marks the fence's old slot dead and queues the new
blocks; the next query sorts the queued blocks into a small run, and a run is merged into
the next older one once it reaches 1/FANOUT of its size (numpy's stable sort merges two
presorted runs in linear time) and the merge drops dead slots. A block is rewritten
O(log_FANOUT(table)) times over its life instead of once per change. A dead slot is taken
again by a later `add` once no run holds a block of it (counted per slot), so a fence that
moves every second for a month keeps using a handful of slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from exchanges.fence_binding import INDEX_BITS
from hilbert_c import kernel
from hilbert_c.covering import split_ranges

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
BOOL = npt.NDArray[np.bool_]

LEVEL_SHIFT = np.uint64(2 * INDEX_BITS)  # composite key: level << 52 | (index >> 2 * level)
BLOCK_MASK = (np.uint64(1) << LEVEL_SHIFT) - np.uint64(1)
FANOUT = 8


@dataclass(frozen=True)
class Matches:
    """Pairs (point, fence slot) of one routed batch, sorted by point."""

    point: I64  # index into the batch
    slot: I32  # fence slot; RangeIndex.fence_of_slot names it
    interior: BOOL  # the block lies wholly inside the fence: no exact check needed

    def __len__(self) -> int:
        return int(self.point.size)

    def take(self, idx: I64) -> Matches:
        return Matches(self.point[idx], self.slot[idx], self.interior[idx])


@dataclass(frozen=True)
class _Level:
    """The blocks of one level of a run: distinct block indices, each with its entries."""

    level: int
    shift: np.uint64  # 2 * level: a point's block index is h >> shift
    blocks: U64  # sorted, distinct
    first: I64  # entries of blocks[i] are the run's [first[i], first[i + 1])

    def lookup(self, h: U64) -> tuple[I64, I64, I64]:
        """For sorted indices h: (which h hit a block, first entry, number of entries)."""
        q = h >> self.shift
        if not h.size or q[0] > self.blocks[-1] or q[-1] < self.blocks[0]:
            return (np.empty(0, np.int64),) * 3
        hit, b = kernel.match_sorted(self.blocks, q)
        lo = self.first[b]
        return hit, lo, self.first[b + 1] - lo


@dataclass(frozen=True)
class _Run:
    keys: U64  # sorted composite keys
    slots: I32
    interior: BOOL
    levels: tuple[_Level, ...]

    @staticmethod
    def of(keys: U64, slots: I32, interior: BOOL, presorted: bool = False) -> _Run:
        if not presorted:
            order = np.argsort(keys, kind="stable")
            keys, slots, interior = keys[order], slots[order], interior[order]
        return _Run(keys, slots, interior, _levels(keys))

    def __len__(self) -> int:
        return int(self.keys.size)


def _levels(keys: U64) -> tuple[_Level, ...]:
    """Per level of sorted composite keys: its distinct blocks and where their entries are."""
    if not keys.size:
        return ()
    lv = keys >> LEVEL_SHIFT
    starts = np.flatnonzero(np.r_[True, lv[1:] != lv[:-1]])
    ends = np.r_[starts[1:], keys.size]
    out = []
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        blocks = keys[a:b] & BLOCK_MASK
        new = np.r_[True, blocks[1:] != blocks[:-1]]
        level = int(lv[a])
        out.append(_Level(level, np.uint64(2 * level), blocks[new],
                          np.r_[np.flatnonzero(new) + a, b].astype(np.int64)))
    return tuple(out)


def _blocks(ranges: U64, interior: BOOL) -> tuple[U64, BOOL]:
    starts, k, owner = split_ranges(ranges, INDEX_BITS)
    ku = k.astype(np.uint64)
    return (ku << LEVEL_SHIFT) | (starts >> (np.uint64(2) * ku)), interior[owner]


class RangeIndex:
    """Fences' Hilbert ranges (at INDEX_BITS), routed a whole batch at a time.

    Each `add` takes a slot no run refers to (a replaced fence's old slot is masked), so a
    query never sees half of an update. Not thread-safe: one owner (the x-geo core).
    """

    def __init__(self) -> None:
        self._slot_of: dict[str, int] = {}
        self._fence_of_slot: list[str | None] = []
        self._ranges: dict[int, tuple[U64, BOOL]] = {}  # live slot -> ranges, flags
        self._blocks: dict[int, tuple[U64, BOOL]] = {}  # live slot -> composite keys, flags
        self._alive = np.zeros(64, dtype=bool)
        self._in_runs = np.zeros(64, dtype=np.int64)  # slot -> its blocks held in runs
        self._free: list[int] = []  # dead slots no run refers to: taken again first
        self._runs: list[_Run] = []  # newest first
        self._queued: list[int] = []

    # -- changes ------------------------------------------------------------------------

    def add(self, fence_id: str, ranges: npt.ArrayLike, interior: npt.ArrayLike | None = None) -> None:
        """Bind (or re-bind) a fence to sorted, disjoint, inclusive ranges at INDEX_BITS."""
        r = np.array(ranges, dtype=np.uint64).reshape(-1, 2)
        flags = (np.zeros(len(r), dtype=bool) if interior is None
                 else np.array(interior, dtype=bool).reshape(-1))
        if flags.shape != (len(r),):
            raise ValueError(f"interior has {flags.size} flags for {len(r)} ranges")
        if len(r) and not ((r[:, 0] <= r[:, 1]).all() and (r[1:, 0] > r[:-1, 1]).all()):
            raise ValueError(f"ranges of fence {fence_id!r} are not sorted, disjoint and inclusive")
        if len(r) and int(r[-1, 1]) >= 1 << (2 * INDEX_BITS):
            raise ValueError(f"ranges of fence {fence_id!r} exceed the {INDEX_BITS}-bit curve")
        self.remove(fence_id, missing_ok=True)
        if self._free:
            slot = self._free.pop()
            self._fence_of_slot[slot] = fence_id
        else:
            slot = len(self._fence_of_slot)
            self._fence_of_slot.append(fence_id)
        self._slot_of[fence_id] = slot
        if slot >= self._alive.size:
            self._alive = np.concatenate([self._alive, np.zeros(self._alive.size, dtype=bool)])
            self._in_runs = np.concatenate([self._in_runs, np.zeros(self._in_runs.size, dtype=np.int64)])
        self._alive[slot] = True
        self._ranges[slot] = (r, flags)
        self._blocks[slot] = _blocks(r, flags)
        self._queued.append(slot)

    def remove(self, fence_id: str, missing_ok: bool = False) -> None:
        slot = self._slot_of.pop(fence_id, None)
        if slot is None:
            if missing_ok:
                return
            raise KeyError(f"fence {fence_id!r} is not bound")
        self._alive[slot] = False
        self._fence_of_slot[slot] = None
        del self._ranges[slot]
        del self._blocks[slot]
        if not self._in_runs[slot]:  # never flushed into a run (a stale queue entry is skipped)
            self._free.append(slot)

    # -- queries ------------------------------------------------------------------------

    def route(self, hs: npt.ArrayLike) -> Matches:
        """All (point, fence) pairs whose ranges hold the points' indices."""
        h_in = np.asarray(hs, dtype=np.uint64).reshape(-1)
        # sorted needles: numpy's search then starts from the previous answer (and the cache
        # stays warm); results are mapped back to batch positions at the end
        by_h = np.argsort(h_in)
        h = h_in[by_h]
        self._flush()
        pts: list[I64] = []
        sls: list[I32] = []
        ins: list[BOOL] = []
        for run in self._runs:
            for level in run.levels:
                point, idx, count = level.lookup(h)
                if not point.size:
                    continue
                if count.size and count.max() > 1:  # blocks shared by several fences
                    point = np.repeat(point, count)
                    idx = np.repeat(idx - (np.cumsum(count) - count), count) + np.arange(point.size)
                slot = run.slots[idx]
                live = self._alive[slot]
                if live.all():
                    pts.append(point)
                    sls.append(slot)
                    ins.append(run.interior[idx])
                else:
                    pts.append(point[live])
                    sls.append(slot[live])
                    ins.append(run.interior[idx[live]])
        if not pts:
            return Matches(np.empty(0, np.int64), np.empty(0, np.int32), np.empty(0, bool))
        point, slot, inner = by_h[np.concatenate(pts)], np.concatenate(sls), np.concatenate(ins)
        order = group_order(point, h.size)
        return Matches(point[order], slot[order], inner[order])

    def fence_of_slot(self, slots: npt.ArrayLike) -> list[str]:
        names = self._fence_of_slot
        return [names[s] or "" for s in np.asarray(slots).reshape(-1).tolist()]

    def fences(self) -> list[str]:
        return sorted(self._slot_of)

    def slot_count(self) -> int:
        """Slots taken so far (live, dead or free again): every slot is below it."""
        return len(self._fence_of_slot)

    def slot_of(self, fence_id: str) -> int:
        return self._slot_of[fence_id]

    def ranges_of(self, fence_id: str) -> tuple[U64, BOOL]:
        return self._ranges[self._slot_of[fence_id]]

    def __contains__(self, fence_id: object) -> bool:
        return fence_id in self._slot_of

    def __len__(self) -> int:
        return len(self._slot_of)

    def stats(self) -> dict[str, object]:
        self._flush()
        return {
            "fences": len(self._slot_of),
            "ranges": sum(len(r) for r, _ in self._ranges.values()),
            "blocks": sum(len(k) for k, _ in self._blocks.values()),
            "runs": [len(r) for r in self._runs],
            "slots": len(self._fence_of_slot), "free_slots": len(self._free),
            "levels": sorted({lv.level for r in self._runs for lv in r.levels}),
        }

    # -- maintenance --------------------------------------------------------------------

    def _flush(self) -> None:
        """Sort queued blocks into a new run, then merge runs that grew too close in size."""
        if self._queued:
            live = [s for s in dict.fromkeys(self._queued) if s in self._blocks]
            self._queued = []
            if live:
                keys = np.concatenate([self._blocks[s][0] for s in live])
                flags = np.concatenate([self._blocks[s][1] for s in live])
                slots = np.concatenate(
                    [np.full(len(self._blocks[s][0]), s, dtype=np.int32) for s in live])
                self._runs.insert(0, _Run.of(keys, slots, flags))
                self._in_runs += np.bincount(slots, minlength=self._in_runs.size)
        while len(self._runs) >= 2 and len(self._runs[0]) * FANOUT >= len(self._runs[1]):
            self._runs[0:2] = [self._merge(self._runs[0], self._runs[1])]

    def _merge(self, a: _Run, b: _Run) -> _Run:
        keys = np.concatenate([b.keys, a.keys])  # two sorted runs: a linear stable merge
        slots = np.concatenate([b.slots, a.slots])
        flags = np.concatenate([b.interior, a.interior])
        live = self._alive[slots]
        order = np.argsort(keys[live], kind="stable")  # two sorted runs: a linear merge
        if not live.all():  # dead slots' blocks dropped: a slot no run holds any more is free
            dropped = slots[~live]
            self._in_runs -= np.bincount(dropped, minlength=self._in_runs.size)
            gone = np.unique(dropped)
            self._free += gone[self._in_runs[gone] == 0].tolist()
        return _Run.of(keys[live][order], slots[live][order], flags[live][order], presorted=True)

    def compact(self) -> None:
        """Merge everything into one run without dead slots."""
        self._flush()
        while len(self._runs) >= 2:
            self._runs[0:2] = [self._merge(self._runs[0], self._runs[1])]
        if self._runs:
            empty = _Run.of(np.empty(0, np.uint64), np.empty(0, np.int32), np.empty(0, bool))
            self._runs[0] = self._merge(self._runs[0], empty)


def group_order(values: I64, bound: int) -> I64:
    """A stable order sorting non-negative ints (< bound). numpy's stable sort is a radix
    sort for 16-bit keys and a timsort (~5x slower on random data) for wider ones, so wider
    values are sorted as two 16-bit digits, least significant first."""
    if bound <= 1 << 16:
        out: I64 = np.argsort(values.astype(np.uint16), kind="stable")
        return out
    if bound <= 1 << 32:
        low = np.argsort((values & 0xFFFF).astype(np.uint16), kind="stable")
        return low[np.argsort((values[low] >> 16).astype(np.uint16), kind="stable")]
    return np.argsort(values, kind="stable")
