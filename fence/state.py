"""x-fence: the stateful fences of one worker, and the ENTER / LEAVE events they emit.

The seed keeps per fence `Objects` (who is inside, since when), `Inserts` / `Deletes`
(entering / leaving, versioned) and `Times` (last seen). Here they are whole-worker columns:
- inside pairs: one sorted uint64 array of keys `object_code << 32 | fence_code` with the
  `since` time of each pair (Objects); the events returned are the Inserts and Deletes;
- per object: last position time, lon, lat (Times, and what a moved fence is re-checked on).

Trade-off: a batch is applied with array operations, not a loop per (object, fence): the
positions of each object in the batch are numbered 1..k after its stored state (number 0),
the (object, fence, number) triples of "inside" are sorted, and a run of consecutive numbers
is a stay: a run starting after 0 is an ENTER, a run ending before k is a LEAVE. That makes
the cost of a batch O(pairs log pairs) in numpy, and the order of an object's positions
inside a batch exact. The exact polygon test runs only on candidates whose covering block is
not interior, for every fence at once (shapely's elementwise contains_xy).

Time comes from the positions (ts), never from this process's clock: a restarted worker
makes the same decisions, and the same inputs give the same event ids (a consumer can drop
a redelivered event by its id).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import shapely
from shapely.geometry.base import BaseGeometry

from exchanges.object_codes import ObjectCodes, grow
from exchanges.x_geo import WorkerBatch

ENTER, LEAVE = "enter", "leave"
ENTERED, EXITED, TIMEOUT, FENCE_CHANGED, FENCE_DELETED = (
    "entered", "exited", "timeout", "fence_changed", "fence_deleted")
_LOW = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)


@dataclass(frozen=True, eq=False)
class FenceDef:
    fence_id: str
    version: int
    geometry: BaseGeometry  # Polygon / MultiPolygon in lon/lat
    timeout_s: float
    name: str = ""


@dataclass(frozen=True)
class Event:
    event: str  # enter | leave
    fence_id: str
    object_id: str
    ts: float
    reason: str
    event_id: str

    def to_json(self) -> dict[str, Any]:
        return {"event": self.event, "fence_id": self.fence_id, "object_id": self.object_id,
                "ts": self.ts, "reason": self.reason, "event_id": self.event_id}


def event_id(fence_id: str, version: int, object_id: str, event: str, reason: str, ts: float) -> str:
    """Stable id: the same decision on the same input always gets the same id."""
    text = f"{fence_id}\x1f{version}\x1f{object_id}\x1f{event}\x1f{reason}\x1f{ts!r}"
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


class XFence:
    """The fences of one x-fence worker (no I/O; see exchanges.contract)."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self._objects = ObjectCodes()
        self._last_ts = np.zeros(0, np.float64)
        self._last_lon = np.zeros(0, np.float64)
        self._last_lat = np.zeros(0, np.float64)
        self._fence_code: dict[str, int] = {}
        self._fences: list[FenceDef | None] = []
        self._versions: dict[str, int] = {}  # also remembers deleted fences' last version
        self._timeout = np.zeros(0, np.float64)
        self._geoms = np.empty(0, dtype=object)
        self._keys = np.empty(0, np.uint64)  # sorted (object << 32 | fence)
        self._since = np.empty(0, np.float64)
        self.unknown_fence_candidates = 0
        self.stale_positions = 0

    # -- fences ---------------------------------------------------------------------------

    def define(self, fence: FenceDef, ts: float) -> list[Event]:
        """Create or replace a fence at time ts. Known objects seen within the timeout are
        re-checked against the new geometry: LEAVE / ENTER with reason fence_changed (ENTER
        `entered` for a new fence). An older version than the one known is ignored."""
        known = self._versions.get(fence.fence_id)
        if known is not None and fence.version <= known:
            return []
        if not fence.timeout_s > 0:
            raise ValueError(f"fence {fence.fence_id}: timeout_s must be > 0, got {fence.timeout_s}")
        self._versions[fence.fence_id] = fence.version
        shapely.prepare(fence.geometry)
        code = self._fence_code.get(fence.fence_id)
        replacing = code is not None
        if code is None:
            code = len(self._fences)
            self._fence_code[fence.fence_id] = code
            self._fences.append(None)
            self._timeout = grow(self._timeout, code + 1, 0.0)
            self._geoms = grow(self._geoms, code + 1, None)
        self._fences[code] = fence
        self._timeout[code] = fence.timeout_s
        self._geoms[code] = fence.geometry

        old_mask = (self._keys & _LOW) == np.uint64(code)
        old_objs = (self._keys[old_mask] >> _SHIFT).astype(np.int64)
        old_since = self._since[old_mask]
        n = len(self._objects.ids)
        recent = np.flatnonzero(ts - self._last_ts[:n] <= fence.timeout_s)
        inside = recent[shapely.contains_xy(fence.geometry, self._last_lon[recent], self._last_lat[recent])]
        leaving = np.setdiff1d(old_objs, inside)
        entering = np.setdiff1d(inside, old_objs)
        reason = FENCE_CHANGED if replacing else ENTERED
        events = [self._event(LEAVE, code, int(o), ts, FENCE_CHANGED) for o in leaving]
        events += [self._event(ENTER, code, int(o), ts, reason) for o in entering]
        # new pairs of this fence: stayers keep their since
        stay_since = dict(zip(old_objs.tolist(), old_since.tolist(), strict=True))
        since = np.array([stay_since.get(int(o), ts) for o in inside], dtype=np.float64)
        self._replace_pairs(~old_mask, inside, np.full(inside.size, code, np.int64), since)
        return events

    def drop(self, fence_id: str, version: int, ts: float) -> list[Event]:
        """Delete a fence: LEAVE fence_deleted for everyone inside. Idempotent."""
        known = self._versions.get(fence_id)
        if known is not None and version < known:
            return []
        self._versions[fence_id] = version
        code = self._fence_code.pop(fence_id, None)
        if code is None:
            return []
        mask = (self._keys & _LOW) == np.uint64(code)
        events = [self._event(LEAVE, code, int(o), ts, FENCE_DELETED)
                  for o in (self._keys[mask] >> _SHIFT).astype(np.int64)]
        self._keys, self._since = self._keys[~mask], self._since[~mask]
        self._fences[code] = None
        self._geoms[code] = None
        return events

    # -- positions --------------------------------------------------------------------------

    def route(self, wb: WorkerBatch) -> list[Event]:
        """Apply a batch routed by x-geo: ENTER / LEAVE (exited) events, in time order."""
        pos = wb.positions
        n = len(pos)
        if n == 0:
            return []
        obj = self._codes(pos.ids)
        # candidate pairs, exact test on boundary blocks, unknown fences dropped
        counts = np.diff(wb.ptr)
        c_pos = np.repeat(np.arange(n), counts)
        fmap = np.array([self._fence_code.get(f, -1) for f in wb.fences], dtype=np.int64)
        c_fence = fmap[wb.cand] if wb.cand.size else np.empty(0, np.int64)
        known = c_fence >= 0
        self.unknown_fence_candidates += int((~known).sum())
        c_pos, c_fence, c_in = c_pos[known], c_fence[known], wb.interior[known]
        check = np.flatnonzero(~c_in)
        if check.size:
            ok = shapely.contains_xy(self._geoms[c_fence[check]], pos.lon[c_pos[check]],
                                     pos.lat[c_pos[check]])
            keep = np.ones(c_pos.size, bool)
            keep[check] = ok
            c_pos, c_fence = c_pos[keep], c_fence[keep]

        # order each object's positions by time; drop positions older than what is known
        order = np.lexsort((np.arange(n), pos.ts, obj))
        fresh = pos.ts[order] >= self._last_ts[obj[order]]
        self.stale_positions += int((~fresh).sum())
        order = order[fresh]
        if not order.size:
            return []
        o_sorted = obj[order]
        first = np.r_[True, o_sorted[1:] != o_sorted[:-1]]
        group_start = np.flatnonzero(first)
        sizes = np.diff(np.r_[group_start, order.size])
        seq_sorted = np.arange(order.size) - np.repeat(group_start, sizes) + 1
        seq = np.zeros(n, np.int64)  # 0 = dropped
        seq[order] = seq_sorted
        objs = o_sorted[group_start]  # objects of this batch
        group_of = np.full(len(self._objects.ids), -1, dtype=np.int64)
        group_of[objs] = np.arange(objs.size)

        def position(o: npt.NDArray[np.int64], s: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
            """Batch index of object o's s-th position (s >= 1)."""
            at: npt.NDArray[np.int64] = order[group_start[group_of[o]] + s - 1]
            return at

        # stored pairs of these objects are "number 0"
        lo = np.searchsorted(self._keys, objs.astype(np.uint64) << _SHIFT)
        hi = np.searchsorted(self._keys, (objs.astype(np.uint64) + np.uint64(1)) << _SHIFT)
        n_st = (hi - lo).astype(np.int64)
        stored = np.repeat(lo.astype(np.int64) - (np.cumsum(n_st) - n_st), n_st) + np.arange(int(n_st.sum()))
        s_obj = (self._keys[stored] >> _SHIFT).astype(np.int64)
        s_fence = (self._keys[stored] & _LOW).astype(np.int64)
        s_since = self._since[stored]

        live = seq[c_pos] > 0
        e_obj = np.concatenate([s_obj, obj[c_pos[live]]])
        e_fence = np.concatenate([s_fence, c_fence[live]])
        e_seq = np.concatenate([np.zeros(s_obj.size, np.int64), seq[c_pos[live]]])
        e_since = np.concatenate([s_since, pos.ts[c_pos[live]]])
        srt = np.lexsort((e_seq, e_fence, e_obj))
        e_obj, e_fence, e_seq, e_since = e_obj[srt], e_fence[srt], e_seq[srt], e_since[srt]
        same = (e_obj[1:] == e_obj[:-1]) & (e_fence[1:] == e_fence[:-1])
        cont = same & (e_seq[1:] == e_seq[:-1] + 1)
        run_start = np.r_[True, ~cont]
        run_end = np.r_[~cont, True]
        k = sizes[group_of[e_obj]]

        events: list[Event] = []
        ent = np.flatnonzero(run_start & (e_seq > 0))
        for f, o, t in zip(e_fence[ent], e_obj[ent], pos.ts[position(e_obj[ent], e_seq[ent])],
                           strict=True):
            events.append(self._event(ENTER, int(f), int(o), float(t), ENTERED))
        lev = np.flatnonzero(run_end & (e_seq < k))
        for f, o, t in zip(e_fence[lev], e_obj[lev], pos.ts[position(e_obj[lev], e_seq[lev] + 1)],
                           strict=True):
            events.append(self._event(LEAVE, int(f), int(o), float(t), EXITED))

        # final state: runs that reach the object's last position; since = the run's first
        start_idx = np.maximum.accumulate(np.where(run_start, np.arange(e_obj.size), 0))
        final = run_end & (e_seq == k)
        f_since = e_since[start_idx[final]]
        keep_mask = np.ones(self._keys.size, bool)
        keep_mask[stored] = False
        self._replace_pairs(keep_mask, e_obj[final], e_fence[final], f_since)

        last = order[np.r_[group_start[1:] - 1, order.size - 1]]  # each object's last position
        self._last_ts[objs] = pos.ts[last]
        self._last_lon[objs] = pos.lon[last]
        self._last_lat[objs] = pos.lat[last]
        events.sort(key=lambda e: (e.ts, e.object_id, e.fence_id, e.event))
        return events

    def expire(self, now: float) -> list[Event]:
        """LEAVE (timeout) for every pair whose object was silent longer than the fence's
        timeout; the event's ts is last seen + timeout, so it does not depend on when we look."""
        if not self._keys.size:
            return []
        objs = (self._keys >> _SHIFT).astype(np.int64)
        fences = (self._keys & _LOW).astype(np.int64)
        due_at = self._last_ts[objs] + self._timeout[fences]
        due = due_at < now
        if not due.any():
            return []
        events = [self._event(LEAVE, int(f), int(o), float(t), TIMEOUT)
                  for o, f, t in zip(objs[due], fences[due], due_at[due], strict=True)]
        self._keys, self._since = self._keys[~due], self._since[~due]
        events.sort(key=lambda e: (e.ts, e.object_id, e.fence_id))
        return events

    # -- state for `geofence inspect fence` -------------------------------------------------

    def fences(self) -> list[str]:
        return sorted(self._fence_code)

    def fence(self, fence_id: str) -> FenceDef | None:
        code = self._fence_code.get(fence_id)
        return None if code is None else self._fences[code]

    def occupants(self, fence_id: str) -> list[dict[str, Any]]:
        code = self._fence_code.get(fence_id)
        if code is None:
            raise KeyError(f"fence {fence_id!r} is not on worker {self.worker}")
        mask = (self._keys & _LOW) == np.uint64(code)
        objs = (self._keys[mask] >> _SHIFT).astype(np.int64)
        return [{"object_id": self._objects.ids[o], "since": float(s), "last_seen": float(self._last_ts[o])}
                for o, s in zip(objs, self._since[mask], strict=True)]

    def fences_of(self, object_id: str) -> list[str]:
        code = self._objects.get(object_id)
        if code is None:
            return []
        lo, hi = np.searchsorted(self._keys, [np.uint64(code) << _SHIFT, np.uint64(code + 1) << _SHIFT])
        return sorted(self._fence_ids(self._keys[lo:hi]))

    def stats(self) -> dict[str, int]:
        return {"fences": len(self._fence_code), "objects": len(self._objects.ids),
                "inside_pairs": int(self._keys.size),
                "unknown_fence_candidates": self.unknown_fence_candidates,
                "stale_positions": self.stale_positions}

    # -- internals ------------------------------------------------------------------------

    def _fence_ids(self, keys: npt.NDArray[np.uint64]) -> list[str]:
        out = []
        for f in (keys & _LOW).astype(np.int64):
            d = self._fences[int(f)]
            if d is not None:
                out.append(d.fence_id)
        return out

    def _codes(self, ids: list[str]) -> npt.NDArray[np.int64]:
        codes = self._objects.codes(ids)
        m = len(self._objects)
        self._last_ts = grow(self._last_ts, m, -np.inf)
        self._last_lon = grow(self._last_lon, m, np.nan)
        self._last_lat = grow(self._last_lat, m, np.nan)
        return codes

    def _replace_pairs(self, keep: npt.NDArray[np.bool_], objs: npt.NDArray[np.int64],
                       fences: npt.NDArray[np.int64], since: npt.NDArray[np.float64]) -> None:
        new = (objs.astype(np.uint64) << _SHIFT) | fences.astype(np.uint64)
        order = np.argsort(new)
        new, since = new[order], since[order]
        kept, kept_since = self._keys[keep], self._since[keep]
        at = np.searchsorted(kept, new)
        self._keys = np.insert(kept, at, new)
        self._since = np.insert(kept_since, at, since)

    def _event(self, kind: str, fence: int, obj: int, ts: float, reason: str) -> Event:
        d = self._fences[fence]
        assert d is not None
        oid = self._objects.ids[obj]
        eid = event_id(d.fence_id, d.version, oid, kind, reason, ts)
        return Event(kind, d.fence_id, oid, ts, reason, eid)
