"""CROSS on x-geo (a fence's `cross`, exchanges/x_geo/core.py): the segment from each object's
position before (its row before in the batch, else the latest remembered here:
exchanges/x_geo/latest.py) to the new one, tested against the bounding boxes of the fences that
detect CROSS, all at once per batch. A fence whose box the segment meets becomes a candidate of
the new position (never a block's interior), which then carries the previous position to the
worker (WorkerBatch.prev) for the exact test.

Trade-off: only segments within one region are tested (a segment whose ends are in two regions
has its first end in the other region's memory), and none longer than `CROSS_MAX_SEGMENT_DEG`
on either axis; the boxes are a coarse filter (the worker decides on the polygon), tested as
rows x fences booleans, at most 4,000,000 per step.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from exchanges.batch import PositionBatch
from exchanges.fence_options.cross import CROSS_MAX_SEGMENT_DEG
from exchanges.x_geo.latest import LatestPositions
from exchanges.x_geo.range_index import Matches


def with_crossings(batch: PositionBatch, codes: npt.NDArray[np.int64], notice: npt.NDArray[np.bool_] | None,
                   m: Matches, slots: npt.NDArray[np.int32], box: npt.NDArray[np.float64],
                   latest: LatestPositions, slot_count: int
                   ) -> tuple[Matches, npt.NDArray[np.float64] | None]:
    """CROSS tests: each position whose object's position before it in this region is
    known (its row before in the batch, else the latest remembered) gets as candidates
    the fences that detect CROSS whose bounding box the segment between the two meets
    (not already candidates; never a block's interior). `slots` and `box`: the fences that
    detect CROSS (their slots, their boxes as columns x0, y0, x1, y1). Returns the matches and,
    when any segment met a box, each position's previous one (lon, lat, ts; NaN: none)."""
    n = len(batch)
    if not slots.size:
        return m, None
    order = np.argsort(codes, kind="stable")  # an object's rows are in time order
    c = codes[order]
    after = np.flatnonzero(np.r_[False, c[1:] == c[:-1]])
    before = np.full(n, -1, np.int64)
    before[order[after]] = order[after - 1]
    prev = np.full((n, 3), np.nan)
    inner = np.flatnonzero(before >= 0)
    if notice is not None:  # a notice's position is in another region: not a segment here
        inner = inner[~notice[before[inner]]]
    b = before[inner]
    prev[inner] = np.column_stack([batch.lon[b], batch.lat[b], batch.ts[b]])
    first = np.flatnonzero(before < 0)
    first = first[codes[first] < latest.present.size]
    first = first[latest.present[codes[first]]]
    o = codes[first]
    prev[first] = np.column_stack([latest.lon[o], latest.lat[o], latest.ts[o]])
    ok = np.isfinite(prev[:, 0]) & (prev[:, 2] < batch.ts)
    if notice is not None:
        ok &= ~notice
    rows = np.flatnonzero(ok)
    x0, x1 = np.minimum(prev[rows, 0], batch.lon[rows]), np.maximum(prev[rows, 0], batch.lon[rows])
    y0, y1 = np.minimum(prev[rows, 1], batch.lat[rows]), np.maximum(prev[rows, 1], batch.lat[rows])
    short = (x1 - x0 <= CROSS_MAX_SEGMENT_DEG) & (y1 - y0 <= CROSS_MAX_SEGMENT_DEG)
    rows, x0, x1, y0, y1 = rows[short], x0[short], x1[short], y0[short], y1[short]
    points, hit_slots = [np.empty(0, np.int64)], [np.empty(0, np.int32)]
    step = max(1, 4_000_000 // slots.size)  # rows x fences booleans per step
    for lo in range(0, rows.size, step):
        s = slice(lo, lo + step)
        i, j = np.nonzero((x0[s, None] <= box[:, 2]) & (x1[s, None] >= box[:, 0])
                          & (y0[s, None] <= box[:, 3]) & (y1[s, None] >= box[:, 1]))
        points.append(rows[lo + i])
        hit_slots.append(slots[j])
    p, sl = np.concatenate(points), np.concatenate(hit_slots)
    if not p.size:
        return m, None
    # a position already a candidate (in the fence's ranges) keeps its match; the worker
    # needs the position before all the same
    width = np.int64(slot_count)
    new = ~np.isin(p * width + sl, m.point.astype(np.int64) * width + m.slot)
    p, sl = p[new], sl[new]
    if not p.size:
        return m, prev
    point = np.r_[m.point, p]
    at = np.argsort(point, kind="stable")
    merged = Matches(point[at], np.r_[m.slot, sl].astype(m.slot.dtype)[at],
                     np.r_[m.interior, np.zeros(p.size, bool)][at])
    return merged, prev
