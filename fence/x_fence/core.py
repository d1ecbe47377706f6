"""x-fence: the stateful fences of one worker, and the ENTER / LEAVE events they emit.

The seed keeps per fence `Objects` (who is inside, since when), `Inserts` / `Deletes`
(entering / leaving, versioned) and `Times` (last seen). Here they are whole-worker columns:
- inside pairs: one sorted uint64 array of keys `object_code << 32 | fence_code` with the
  `since` time of each pair (Objects); the events returned are the Inserts and Deletes;
- per object: last position time, lon, lat (Times, and what a moved fence is re-checked on).

Trade-off: a batch is applied with array operations, not a loop per (object, fence): the
observations of each object in the batch (its positions, those with one ts counting as one)
are numbered 1..k after its stored state (number 0), the (object, fence, number) triples of
"inside" are sorted, and a run of consecutive numbers is a stay: a run starting after 0 is
an ENTER, a run ending before k is a LEAVE. That keeps the order of an object's positions
inside a batch exact. The common batch, one new observation per object, skips the
numbering: its ENTERs and LEAVEs are the set differences between the stored pairs and the
new ones (one sort of the new pairs, one search in the stored ones).

The exact polygon test runs only on candidates whose covering block is not interior, for
all fences at once, in C (`kernel.points_in_polygons`: GEOS's crossing rule and orientation
filter, so its answers are shapely's contains_xy), and by shapely itself for the rare point
C cannot decide (on or within rounding of an edge) and for fences that are not valid
polygons.

Fence changes. A definition alone decides nothing for objects: this worker's last position
of an object is current only while the object is in one of its fences' ranges (x-geo routes
it here then), and anywhere else it may be far behind. Each x-geo region that binds (or
bound) the fence applies the change and sends, right behind the definition, a *re-check*
row per object whose latest position there is in the fence's old or new ranges
(exchanges.x_geo.core.XGeo.change). A re-check decides the object against the new geometry:
ENTER (reason `entered` for a new fence, `fence_changed` for a replaced one) or LEAVE
`fence_changed`, at the ts of that position: the one the decision comes from, as for every
position (the change's own time would put the event after positions routed behind it, whose
events it precedes). An object last seen more than `timeout_s` before the change is not
entered (one inside that the new geometry holds stays until the timer LEAVEs it). Positions
that a region routed before it
applied the change carry the old binding's version and are judged as that version (kept for
the latest replaced one: its geometry, hysteresis band and filter): so every position is judged against the
fence as its region had it, and each object is decided at its region's change from its
latest position there, whatever order the regions' streams reach this worker in.

Dwell. A fence with `dwell_s` reports a stay only once the object has been inside that long:
its ENTER waits (the pair is inside, *unconfirmed*: a sorted key set beside the pair table),
the first observation inside at `since + dwell_s` or later emits ENTER reason `dwelled` and
confirms it, and the LEAVE of a stay never confirmed is silent. Within a batch this is per
run (a stay): its first observation past the dwell time. The set is part of the state: the
journal records, snapshots and handovers carry it with the pairs.

Cross. x-geo sends, with a position, the object's position before it in the region when the
segment between the two meets the bounding box of a fence that detects CROSS (the fence is a
candidate then, even if the position is outside its ranges). Both ends outside and the segment
through the fence (exchanges/fence_options/cross.py `crosses`): event `cross`. It is a pure function of
the two positions (no pair state), judged for fresh positions only (a redelivered position at
the object's last known ts gives none again).

Time comes from the positions (ts), never from this process's clock: a restarted worker
makes the same decisions, and the same inputs give the same event ids (a consumer can drop
a redelivered event by its id).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import shapely

from exchanges.fence_def import FenceDef
from exchanges.fence_events import (
    ENTERED,
    FENCE_DELETED,
    Event,
)
from fence.x_fence.gates import Gates
from fence.x_fence.handover import Handover
from fence.x_fence.persistence import Persistence
from fence.x_fence.queries import Queries
from fence.x_fence.table import _LOW, _SHIFT, Placement

__all__ = ["Placement", "XFence"]


class XFence(Persistence, Handover, Queries, Gates):
    """The fences of one x-fence worker (no I/O; see exchanges.contract)."""

    def define(self, fence: FenceDef, ts: float, regions: Sequence[str] = (),
               region: str = "") -> list[Event]:
        """Create or replace a fence at time ts (an older version than the one known is
        ignored). Who is inside it is decided by the re-check rows that follow the definition
        (see the module's docstring, "Fence changes"), not here: no events. `regions` are the
        regions the change was sent to, `region` the one this copy came through: until every
        one has forwarded it, positions routed with the replaced version may still come, and
        its geometry is kept for them."""
        known = self._versions.get(fence.fence_id)
        code = self._fence_code.get(fence.fence_id)
        if known is not None and fence.version <= known:
            if fence.version == known and code is not None and region in self._pending.get(code, ()):
                self._pending[code].discard(region)
                self._dirty_fences.add(code)
                self._end_transitions()
            return []
        if not fence.timeout_s > 0:
            raise ValueError(f"fence {fence.fence_id}: timeout_s must be > 0, got {fence.timeout_s}")
        self._versions[fence.fence_id] = fence.version
        shapely.prepare(fence.geometry)
        replacing = code is not None
        if code is None:
            code = self._new_slot(fence.fence_id)
        else:
            old = self._fences[code]
            if old is not None:
                self._prev[code] = old
        self._install(code, fence, ts, created=not replacing)
        self._pending[code] = set(regions) - {region}
        self._end_transitions()
        self._dirty_fences.add(code)
        return []

    def drop(self, fence_id: str, version: int, ts: float) -> list[Event]:
        """Delete a fence: LEAVE fence_deleted for everyone inside, at ts (the delete's time)
        or, for an object seen inside after it (routed by a region that had not applied the
        delete yet), at its last position's time: never before what the object did. Idempotent."""
        known = self._versions.get(fence_id)
        if known is not None and version < known:
            return []
        self._versions[fence_id] = version
        code = self._fence_code.pop(fence_id, None)
        if code is None:
            self._dirty_versions.add(fence_id)
            return []
        mask = (self._keys & _LOW) == np.uint64(code)
        silent = self._unconfirmed_of(self._keys[mask])  # stays never reported
        self._unconfirm(self._keys[mask][silent])
        told = np.flatnonzero(mask)[~silent]
        objs = (self._keys[told] >> _SHIFT).astype(np.int64)
        events = self._events(np.ones(objs.size, np.int8), np.full(objs.size, code, np.int64), objs,
                              np.maximum(ts, self._last_ts[objs]), (ENTERED, FENCE_DELETED),
                              since=self._since[told])
        self._keys, self._since = self._keys[~mask], self._since[~mask]
        self._clear_slot(code)
        self._dirty_fences.add(code)
        return events
