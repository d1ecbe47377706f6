"""The ground truth for ENTER / LEAVE: shapely alone, update by update in time order.

Independent of the Hilbert path (no covering, no range index, no x-geo): an STRtree over the
fences gives bounding-box candidates, then the very predicate x-fence applies
(`shapely.contains_xy`: strictly inside, a point on the edge is out) decides. The benchmarks,
the tests and the demo compare what the pipeline emitted with this, event for event.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import shapely
from shapely.geometry.base import BaseGeometry

from fence.x_fence.events import ENTER, ENTERED, EXITED, LEAVE, visit_id

EventTuple = tuple[str, str, str, float, str]  # (event, fence_id, object_id, ts, reason)


def reference_events(names: Sequence[str], geometries: Sequence[BaseGeometry], object_ids: Sequence[str],
                     obj: npt.NDArray[np.integer[Any]], lon: npt.NDArray[np.float64],
                     lat: npt.NDArray[np.float64], ts: npt.NDArray[np.float64],
                     chunk: int = 100_000, inside: list[frozenset[int]] | None = None) -> list[EventTuple]:
    """Events of positions (obj[i] indexes object_ids), taken in the order given (sort them
    by ts per object first). Every object starts outside every fence, or, with `inside`
    (per object, the fence indexes it is in; updated here), where an earlier call left it."""
    geoms = np.array(list(geometries), dtype=object)
    tree = shapely.STRtree(geoms)
    if inside is None:
        inside = [frozenset()] * len(object_ids)
    events: list[EventTuple] = []
    for lo in range(0, len(obj), chunk):
        hi = min(lo + chunk, len(obj))
        x, y = lon[lo:hi], lat[lo:hi]
        pt, fi = tree.query(shapely.points(x, y))
        ok = shapely.contains_xy(geoms[fi], x[pt], y[pt])
        pt, fi = pt[ok], fi[ok]
        order = np.lexsort((fi, pt))
        pt, fi = pt[order], fi[order]
        ptr = np.searchsorted(pt, np.arange(hi - lo + 1))
        fence_lists = fi.tolist()
        for i, o in enumerate(obj[lo:hi].tolist()):
            now = frozenset(fence_lists[ptr[i]:ptr[i + 1]])
            before = inside[o]
            if now != before:
                oid, t = object_ids[o], float(ts[lo + i])
                events += [(ENTER, names[f], oid, t, ENTERED) for f in now - before]
                events += [(LEAVE, names[f], oid, t, EXITED) for f in before - now]
                inside[o] = now
    return events


def compare(got: Sequence[EventTuple], want: Sequence[EventTuple], show: int = 10) -> list[str]:
    """Empty if both are the same multiset; else the first differences, described."""
    g, w = sorted(got), sorted(want)
    if g == w:
        return []
    extra = Counter(g) - Counter(w)
    missing = Counter(w) - Counter(g)
    lines = [f"{len(g)} events, the reference has {len(w)}: "
             f"{sum(extra.values())} unexpected, {sum(missing.values())} missing"]
    lines += [f"  unexpected {e}" for e in sorted(extra)[:show]]
    lines += [f"  missing    {e}" for e in sorted(missing)[:show]]
    return lines


def visit_problems(events: Sequence[Any]) -> list[str]:
    """What is wrong with the visits of events (fence.x_fence.events.Event, in the order
    emitted): each ENTER opens a stay whose visit id hashes (fence, object, its ts); the next
    LEAVE of that (fence, object) carries the same id and inside_s = its ts - the ENTER's."""
    open_at: dict[tuple[str, str], Any] = {}
    bad = []
    for e in events:
        k = (e.fence_id, e.object_id)
        if e.event == ENTER:
            if e.visit_id != visit_id(e.fence_id, e.object_id, e.ts) or e.inside_s is not None:
                bad.append(f"ENTER {k} at {e.ts}: visit {e.visit_id}, inside_s {e.inside_s}")
            open_at[k] = e
            continue
        enter = open_at.pop(k, None)
        if enter is None:
            continue  # the stay began before these events
        if e.visit_id != enter.visit_id or e.inside_s != e.ts - enter.ts:
            bad.append(f"LEAVE {k} at {e.ts}: visit {e.visit_id} (ENTER's {enter.visit_id}), "
                       f"inside_s {e.inside_s} (expected {e.ts - enter.ts})")
    return bad
