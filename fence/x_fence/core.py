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
through the fence (exchanges/fence_def.py `crosses`): event `cross`. It is a pure function of
the two positions (no pair state), judged for fresh positions only (a redelivered position at
the object's last known ts gives none again).

Time comes from the positions (ts), never from this process's clock: a restarted worker
makes the same decisions, and the same inputs give the same event ids (a consumer can drop
a redelivered event by its id).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import shapely

from exchanges import filters
from exchanges.fence_def import FenceDef, crosses, hysteresis_zones
from exchanges.fence_events import (
    CODES,
    CROSSED,
    DWELLED,
    ENTERED,
    EVENT_SLOTS,
    EXITED,
    EXPIRED,
    FENCE_CHANGED,
    FENCE_DELETED,
    TIMEOUT,
    Event,
    visit_id,
)
from exchanges.object_codes import ObjectCodes, distinct, grow
from exchanges.worker_batch import WorkerBatch
from fence.x_fence import codec
from fence.x_fence.held import Held, pair_key
from fence.x_fence.shapes import Edges
from hilbert_c import kernel

_LOW = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]




@dataclass(frozen=True, eq=False)
class _Observations:
    """The fresh observations of one batch, per object (a "group", by ascending code)."""

    objs: I64  # object code of each group
    k: I64  # number of the group's last observation (0: only its stored state's ts)
    base: I64  # index in obs_ts of the group's observation number 0
    obs_ts: F64
    last: I64  # batch index of the group's last position
    pos_group: I64  # per position: its group, -1 if stale
    pos_seq: I64  # per position: its observation number, -1 if stale

    single: bool = False  # every object has one observation (number 1), newer than stored

    @staticmethod
    def single_of(obj: I64, ts: F64, order: I64) -> _Observations:
        """Distinct objects, each with one position newer than stored (order sorts obj)."""
        n = obj.size
        pos_group = np.empty(n, np.int64)
        pos_group[order] = np.arange(n)
        return _Observations(obj[order], np.ones(n, np.int64), np.arange(n) - 1, ts[order], order,
                             pos_group, np.ones(n, np.int64), single=True)

    def ts_of(self, group: I64, seq: I64) -> F64:
        out: F64 = self.obs_ts[self.base[group] + seq]
        return out


@dataclass(frozen=True, eq=False)
class _Pairs:
    """(group, fence, observation number) entries sorted in that order; a run of
    consecutive numbers of one (group, fence) is a stay inside the fence."""

    group: I64
    fence: I64
    seq: I64
    stored: npt.NDArray[np.bool_]  # the entry is the stored state (number 0, with its since)
    since: F64  # meaningful where stored
    run_start: npt.NDArray[np.bool_]
    run_end: npt.NDArray[np.bool_]


def _pair_order(group: I64, fence: I64, seq: I64, n_sorted: int, n_groups: int, n_fences: int,
                n_seq: int) -> I64:
    """Stable order by (group, fence, seq) when the first n_sorted entries are already in
    that order. One int64 key when it fits: sorting the rest and merging the two runs
    (timsort finds them) is ~10x cheaper than a three-key lexsort."""
    if n_groups * max(n_fences, 1) * n_seq >= 1 << 62:
        return np.lexsort((seq, fence, group))
    key = (group * n_fences + fence) * n_seq + seq
    order = np.r_[np.arange(n_sorted), np.argsort(key[n_sorted:]) + n_sorted]
    merged: I64 = order[np.argsort(key[order], kind="stable")]
    return merged


class Placement(Protocol):
    """Where fences and their objects belong (exchanges.hash_ring.HashRing)."""

    def masters(self, key: str) -> list[str]: ...

    def owners(self, key: str, members: Sequence[str]) -> list[str]: ...


def ttls(extra: Sequence[dict[str, Any] | None], rows: I64) -> F64:
    """The `ttl` of each of these positions (inf where it has none); ingress checked them."""
    if not extra:
        return np.full(rows.size, np.inf)
    out = np.full(rows.size, np.inf)
    for k, i in enumerate(rows.tolist()):
        e = extra[i]
        if e is not None and "ttl" in e:
            out[k] = float(e["ttl"])
    return out


def _name_rank(codes: I64, names: list[str]) -> I64:
    """For each code, the rank of its name among the names of the distinct codes given."""
    uniq, inv = np.unique(codes, return_inverse=True)
    strs = [names[c] for c in uniq.tolist()]
    rank = np.empty(uniq.size, np.int64)
    rank[sorted(range(len(strs)), key=strs.__getitem__)] = np.arange(uniq.size)
    out: I64 = rank[inv]
    return out


class XFence:
    """The fences of one x-fence worker (no I/O; see exchanges.contract)."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self._objects = ObjectCodes()
        self._last_ts = np.zeros(0, np.float64)
        self._last_lon = np.zeros(0, np.float64)
        self._last_lat = np.zeros(0, np.float64)
        self._ttl = np.zeros(0, np.float64)  # per object: the TTL of its latest position (inf: none)
        self._fence_code: dict[str, int] = {}
        self._fences: list[FenceDef | None] = []
        self._fence_names: list[str] = []  # by code, kept after a drop (codes are not reused)
        self._id_prefix: list[str] = []  # by code: "fence_id \x1f version \x1f" of event ids
        self._versions: dict[str, int] = {}  # also remembers deleted fences' last version
        self._timeout = np.zeros(0, np.float64)
        self._version_of = np.zeros(0, np.int64)  # by code: the version defined
        self._changed_at = np.zeros(0, np.float64)  # by code: its change time (re-check events)
        self._created = np.zeros(0, bool)  # by code: that version created the fence (not a replace)
        # by code, while a change is in transition (not every region it was sent to has
        # forwarded it yet): the replaced version's geometry, and the regions still to come
        self._prev: dict[int, FenceDef] = {}
        self._pending: dict[int, set[str]] = {}
        self._geoms = np.empty(0, dtype=object)
        # by code: the hysteresis band (metres; 0: none) and, with one, the fence shrunk and grown
        # by it (exchanges/fence_def.py `hysteresis_zones`)
        self._hyst = np.zeros(0, np.float64)
        self._inner = np.empty(0, dtype=object)
        self._outer = np.empty(0, dtype=object)
        # by code: the fence's filter on the positions' fields (FenceDef.where; () for none)
        self._where: list[tuple[filters.Clause, ...]] = []
        self._has_where = np.zeros(0, bool)
        self._dwell = np.zeros(0, np.float64)  # by code: dwell_s (0: none)
        self._cross = np.zeros(0, bool)  # by code: the fence detects CROSS
        # the inside pairs whose stay has not reached its fence's dwell time yet (no ENTER was
        # emitted: their LEAVE is silent); sorted keys, a subset of _keys
        self._unconfirmed = np.empty(0, np.uint64)
        self._edges = Edges()
        self._keys = np.empty(0, np.uint64)  # sorted (object << 32 | fence)
        self._since = np.empty(0, np.float64)
        self._ho_ts = np.zeros(0, np.float64)  # per object: the latest handover notice applied
        self._held = Held()  # positions waiting for a gate, in arrival order (fence/x_fence/held.py)
        self.unknown_fence_candidates = 0
        self.stale_positions = 0
        self.held_positions = 0
        self.holds_expired = 0
        self.rechecks = 0
        self.rechecks_superseded = 0
        # What changed since the last `changes` (the journal's record):
        # objects whose row or pairs changed, fences defined or dropped, the held positions.
        self._dirty_objs: list[I64] = []
        self._dirty_fences: set[int] = set()
        self._dirty_versions: set[str] = set()  # ids of fences with no code (deleted unseen)
        self._held_dirty = False

    # -- fences ---------------------------------------------------------------------------

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

    def _end_transitions(self) -> None:
        """Forget the replaced version of the fences that every region has forwarded the
        change through, once no held row (waiting for a handover notice, routed before its
        region's copy of the change) carries that version any more."""
        done = [c for c, waiting in self._pending.items() if not waiting]
        if not done:
            return
        held = self._held.fence_versions()
        for c in done:
            prev = self._prev.get(c)
            if prev is not None and (self._fence_names[c], prev.version) in held:
                continue
            del self._pending[c]
            if self._prev.pop(c, None) is not None:
                self._dirty_fences.add(c)

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

    def _clear_slot(self, code: int) -> None:
        """Fence `code` is gone (its slot stays, unused: codes are not reused)."""
        self._fences[code] = None
        self._geoms[code] = None
        self._hyst[code] = 0.0
        self._inner[code] = self._outer[code] = None
        self._where[code], self._has_where[code] = (), False
        self._dwell[code] = 0.0
        self._cross[code] = False
        self._prev.pop(code, None)
        self._pending.pop(code, None)
        self._edges.drop(code)

    def _new_slot(self, fence_id: str) -> int:
        """A new fence code for `fence_id` (codes are never reused)."""
        code = len(self._fences)
        self._fence_code[fence_id] = code
        self._fences.append(None)
        self._fence_names.append(fence_id)
        self._id_prefix.append("")
        self._timeout = grow(self._timeout, code + 1, 0.0)
        self._version_of = grow(self._version_of, code + 1, 0)
        self._changed_at = grow(self._changed_at, code + 1, 0.0)
        self._created = grow(self._created, code + 1, False)
        self._geoms = grow(self._geoms, code + 1, None)
        self._hyst = grow(self._hyst, code + 1, 0.0)
        self._inner = grow(self._inner, code + 1, None)
        self._outer = grow(self._outer, code + 1, None)
        self._where.append(())
        self._has_where = grow(self._has_where, code + 1, False)
        self._dwell = grow(self._dwell, code + 1, 0.0)
        self._cross = grow(self._cross, code + 1, False)
        return code

    def _install(self, code: int, fence: FenceDef, changed_at: float, created: bool) -> None:
        """Fence `code` is `fence`, changed at `changed_at` (its slot exists)."""
        self._fences[code] = fence
        self._id_prefix[code] = f"{fence.fence_id}\x1f{fence.version}\x1f"
        self._timeout[code] = fence.timeout_s
        self._version_of[code] = fence.version
        self._changed_at[code] = changed_at
        self._created[code] = created
        self._geoms[code] = fence.geometry
        self._edges.put(code, fence.geometry)
        self._hyst[code] = fence.hysteresis_m
        self._inner[code], self._outer[code] = (hysteresis_zones(fence.geometry, fence.hysteresis_m)
                                                if fence.hysteresis_m else (None, None))
        self._where[code], self._has_where[code] = fence.where, bool(fence.where)
        self._dwell[code] = fence.dwell_s
        self._cross[code] = fence.cross

    # -- positions --------------------------------------------------------------------------

    def route(self, wb: WorkerBatch, received_at: float = 0.0) -> list[Event]:
        """Apply a batch routed by x-geo: ENTER / LEAVE (exited) events, in time order.

        A position older than the object's last known one is dropped (stale). Positions of
        one object with the same ts are one observation, and what they say is united: so an
        observation at the object's last known ts can add fences, never remove one.

        A notice (a handover: the object left a region; or a barrier: x-ingress announcing
        an object it had not seen since its start, see ingress/core.py) only opens gates:
        the region the object went to sends its first position there to every worker, and
        that position decides what the object is in (applied in one batch with the notice
        that opens it, see `_with_opened`). A gated position waits (held here) until
        the notice of the region its object came from was applied (see exchanges.x_geo),
        then is applied with the others of its object in time order; a row behind a held
        row of the same object and region waits with it. `received_at` (the caller's clock)
        bounds that wait: `expire` applies a position held HOLD_S anyway.
        """
        if len(wb.positions) == 0:
            return []
        codes = self._codes(wb.positions.ids)
        if wb.gate is not None or (self._held and wb.origin is not None):
            blocked = self._blocked(wb, codes)
            if blocked.any():
                rows = np.flatnonzero(blocked)
                self._held.add(wb.take(rows), codes[rows], received_at)
                self.held_positions += int(rows.size)
                self._held_dirty = True
                keep = np.flatnonzero(~blocked)
                wb, codes = wb.take(keep), codes[keep]
        events = self._route(*self._with_opened(wb, codes))
        if self._pending:
            self._end_transitions()
        return events

    # Longest wait for a handover notice. The notice always comes (x-ingress sends it with the
    # position it gates); only a backlog delays it, and a saturated pipeline runs a backlog of
    # tens of seconds: giving up sooner would apply positions out of order.
    HOLD_S = 300.0

    def _blocked(self, wb: WorkerBatch, codes: I64) -> npt.NDArray[np.bool_]:
        """Positions whose gate is not open yet. The gate alone keeps an object's order:
        the positions of one stay in a region share their gate, so they wait together, and
        nothing later can pass them: a later stay's gate (or notice's) is a later entry,
        which needs a later notice than the one they wait for."""
        blocked: npt.NDArray[np.bool_] = wb.gates() > self._ho_ts[codes]
        if wb.origin is None or not (blocked.any() or self._held):
            return blocked
        # A region's rows of an object stay in order: a row behind a held one of the same
        # region waits too (a notice behind a held position of its region may not open it),
        # as does a row behind a blocked one of its region in this batch.
        ordered = wb.origin != 0
        rows = np.flatnonzero(ordered & (blocked | np.isin(codes, self._held.codes())))
        if not rows.size:
            return blocked
        keys = pair_key(codes[rows], wb.origin[rows])
        waits = blocked[rows] | np.isin(keys, self._held.pair_keys())
        # within each (object, region) in batch order: from its first waiting row on
        order = np.lexsort((rows, keys))
        k, w = keys[order], waits[order]
        start = np.r_[True, k[1:] != k[:-1]]
        count = np.cumsum(w)
        base = np.maximum.accumulate(np.where(start, count - w, 0))
        blocked[rows[order]] = (count - base) > 0
        return blocked

    def _release(self, now: float | None) -> list[Event]:
        """Apply the held positions whose gate opened (with `now`: also those held HOLD_S),
        all in one batch, so each object's are taken in time order."""
        ready, codes = self._ready(now)
        if ready is None:
            return []
        events = self._route(*self._with_opened(ready, codes))
        if self._pending:
            self._end_transitions()
        return events

    def _with_opened(self, wb: WorkerBatch, codes: I64) -> tuple[WorkerBatch, I64]:
        """`wb` and, behind it, the held rows its notices open (and those these open in
        turn), to be routed as one batch: a notice and the position it opens (the object's
        position in the region it went to: the same instant) are then one observation, which
        unites what each says. Routed apart, a notice judged against a fence's new version
        and the position routed with its old one would LEAVE and ENTER at one instant."""
        parts, part_codes = [wb], [codes]
        while self._held and parts[-1].notice is not None and parts[-1].notice.any():
            last, last_codes = parts[-1], part_codes[-1]
            assert last.notice is not None
            np.maximum.at(self._ho_ts, last_codes[last.notice], last.positions.ts[last.notice])
            ready, ready_codes = self._ready(None)
            if ready is None:
                break
            parts.append(ready)
            part_codes.append(ready_codes)
        if len(parts) == 1:
            return wb, codes
        return WorkerBatch.concat(parts), np.concatenate(part_codes)

    def _ready(self, now: float | None) -> tuple[WorkerBatch | None, I64]:
        """Take out the held rows whose gate is open (with `now`: also those held HOLD_S),
        each region's rows of an object in order; with their object codes."""
        ready, codes, expired = self._held.ready(self._ho_ts, now, self.HOLD_S)
        if ready is not None:
            self.holds_expired += expired
            self._held_dirty = True
        return ready, codes

    def _route(self, wb: WorkerBatch, codes: I64) -> list[Event]:
        """Ordinary rows and re-check rows, in row order (each object's rows are in order)."""
        rc = wb.recheck
        if rc is None or not (rc >= 0).any():
            return self._route_positions(wb, codes)
        is_rc = rc >= 0
        cuts = np.flatnonzero(is_rc[1:] != is_rc[:-1]) + 1
        events: list[Event] = []
        for lo, hi in zip(np.r_[0, cuts].tolist(), np.r_[cuts, is_rc.size].tolist(), strict=True):
            part = wb if (lo, hi) == (0, is_rc.size) else wb.take(np.arange(lo, hi))
            apply = self._apply_rechecks if is_rc[lo] else self._route_positions
            events += apply(part, codes[lo:hi])
        return events

    def _apply_rechecks(self, wb: WorkerBatch, codes: I64) -> list[Event]:
        """Re-check rows (every row one): each decides its object against the current
        version of its fence (see the module's docstring, "Fence changes"). A row for a
        version this worker no longer has (replaced again, or deleted) is superseded: the
        newer change brings its own. A row older than the object's last known position is
        stale, as any position."""
        n = len(wb.positions)
        ts = wb.positions.ts
        code_of = np.fromiter((self._fence_code.get(f, -1) for f in wb.fences), np.int64, len(wb.fences))
        rc = wb.rechecks()
        f = code_of[rc]
        ok = f >= 0
        ok[ok] = wb.fence_versions()[rc[ok]] == self._version_of[f[ok]]
        self.rechecks_superseded += int(n - np.count_nonzero(ok))
        fresh_row = ok & (ts >= self._last_ts[codes])
        self.stale_positions += int(np.count_nonzero(ok & ~fresh_row))
        rows = np.flatnonzero(fresh_row)
        if not rows.size:
            return []
        self.rechecks += int(rows.size)
        # one decision per (object, fence): the latest row (two regions may both have had it)
        key = (codes[rows].astype(np.uint64) << _SHIFT) | f[rows].astype(np.uint64)
        order = np.lexsort((ts[rows], key))
        rows, key = rows[order], key[order]
        last = np.r_[key[1:] != key[:-1], True]
        rows, key = rows[last], key[last]
        obj, fc, t = codes[rows], f[rows], ts[rows]
        newer = t > self._last_ts[obj]  # a position this worker was not sent
        self._last_ts[obj[newer]] = t[newer]
        self._last_lon[obj[newer]] = wb.positions.lon[rows[newer]]
        self._last_lat[obj[newer]] = wb.positions.lat[rows[newer]]
        self._dirty_objs.append(obj)
        inside = np.diff(wb.ptr)[rows] > 0  # the row's candidate: the fence's new ranges hold it
        row_interior = wb.interior[np.minimum(wb.ptr[rows], wb.interior.size - 1)] if wb.interior.size \
            else np.zeros(rows.size, bool)
        at = np.searchsorted(self._keys, key)
        there = at < self._keys.size
        there[there] = self._keys[at[there]] == key[there]
        w = np.flatnonzero(inside & self._has_where[fc])
        if w.size:  # a filter: a position that fails it is outside
            inside[w] = self._passes(fc[w], rows[w], wb.positions.extra)
        band = self._hyst[fc] > 0
        exact = np.flatnonzero(inside & ~row_interior & ~band)
        if exact.size:
            inside[exact] = self._contains(fc[exact], wb.positions.lon[rows[exact]],
                                           wb.positions.lat[rows[exact]])
        h = np.flatnonzero(inside & band)
        if h.size:  # a band: inside if past it inward, or within it and inside before
            zone = self._zones(fc[h], wb.positions.lon[rows[h]], wb.positions.lat[rows[h]])
            inside[h] = (zone == 2) | ((zone == 1) & there[h])
        # an object silent longer than the timeout before the change is not entered (one
        # inside stays, if the new geometry holds it, until the timer LEAVEs it)
        enter = inside & ~there & (t >= self._changed_at[fc] - self._timeout[fc])
        leave = ~inside & there
        shown_in, shown_out, dwelled = enter, leave, np.empty(0, np.int64)
        if self._dwell_on():
            shown_in, shown_out = enter.copy(), leave.copy()
            e, lv, stay = np.flatnonzero(enter), np.flatnonzero(leave), np.flatnonzero(inside & there)
            keep_in, keep_out = self._dwell_filter(key[e], key[lv])
            shown_in[e[~keep_in]] = False
            shown_out[lv[~keep_out]] = False
            dwelled = stay[self._dwelled(key[stay], t[stay], self._since[at[stay]])]
        created = self._created[fc]
        new_in, changed_in = shown_in & created, shown_in & ~created
        n_in, n_out = int(new_in.sum()), int(shown_out.sum())
        kinds = np.r_[np.zeros(n_in, np.int8), np.ones(n_out, np.int8), np.full(dwelled.size, 2, np.int8)]
        events = self._events(kinds,
                              np.r_[fc[new_in], fc[shown_out], fc[dwelled]],
                              np.r_[obj[new_in], obj[shown_out], obj[dwelled]],
                              np.r_[t[new_in], t[shown_out], t[dwelled]], (ENTERED, FENCE_CHANGED),
                              dated=True, since=np.r_[np.full(n_in, np.nan), self._since[at[shown_out]],
                                                      self._since[at[dwelled]]])
        if changed_in.any():
            events += self._events(np.zeros(int(changed_in.sum()), np.int8), fc[changed_in], obj[changed_in],
                                   t[changed_in], (FENCE_CHANGED, FENCE_CHANGED), dated=True)
            events.sort(key=lambda e: (e.ts, e.object_id, e.fence_id, e.event))
        self._replace_sorted(at[leave], key[enter], np.maximum(t[enter], self._changed_at[fc[enter]]))
        return events

    def _route_positions(self, wb: WorkerBatch, codes: I64) -> list[Event]:
        pos = wb.positions
        if len(pos) == 0:
            return []
        if wb.notice is not None and wb.notice.any():  # the region it came from is done with it
            np.maximum.at(self._ho_ts, codes[wb.notice], pos.ts[wb.notice])
            self._dirty_objs.append(codes[wb.notice])
            keep = np.flatnonzero(~wb.notice)  # a notice opens gates, and says nothing more
            wb, codes = wb.take(keep), codes[keep]
            pos = wb.positions
            if len(pos) == 0:
                return []
        obs = self._observations(codes, pos.ts)
        self._dirty_objs.append(obs.objs)
        cands = self._candidates(wb)
        crossed = self._crossed(wb, obs, codes, *cands) if wb.prev is not None else []
        c_pos, c_fence, b_pos, b_fence = self._inside(wb, obs, *cands)
        if obs.objs.size == 0:
            return crossed
        stored_at = self._stored_pairs(obs.objs)
        if b_pos.size:  # hysteresis: band positions inside where the state before them was
            kept = self._band(obs, stored_at, c_pos, c_fence, b_pos, b_fence)
            c_pos, c_fence = np.r_[c_pos, b_pos[kept]], np.r_[c_fence, b_fence[kept]]
        if obs.single and self.single_observation_path:
            events = self._apply_single(obs, stored_at, c_pos, c_fence)
        else:
            events = self._apply_runs(obs, stored_at, c_pos, c_fence)
        self._last_ts[obs.objs] = pos.ts[obs.last]
        self._last_lon[obs.objs] = pos.lon[obs.last]
        self._last_lat[obs.objs] = pos.lat[obs.last]
        self._ttl[obs.objs] = ttls(pos.extra, obs.last)
        if crossed:
            events = sorted(events + crossed, key=lambda e: (e.ts, e.object_id, e.fence_id, e.event))
        return events

    def _candidates(self, wb: WorkerBatch) -> tuple[I64, I64]:
        """Each candidate's position row and fence code (-1: a fence not defined here)."""
        c_pos = np.repeat(np.arange(len(wb.positions)), np.diff(wb.ptr))
        if not wb.fences:
            return c_pos, np.empty(0, np.int64)
        code = self._fence_code.get
        fmap = np.fromiter((code(f, -1) for f in wb.fences), np.int64, len(wb.fences))
        return c_pos, fmap[wb.cand]

    def _crossed(self, wb: WorkerBatch, obs: _Observations, codes: I64, c_pos: I64, c_fence: I64
                 ) -> list[Event]:
        """CROSS events of the batch (see the module's docstring, "Cross"): per fresh position
        and candidate fence that detects CROSS, with the position before it known."""
        if not c_fence.size or not self._cross.any():
            return []
        prev = wb.previous()
        at = np.flatnonzero((c_fence >= 0) & self._cross[np.maximum(c_fence, 0)] & (obs.pos_seq[c_pos] >= 1)
                            & np.isfinite(prev[c_pos, 0]))
        if not at.size:
            return []
        _, once = np.unique(c_pos[at] * len(self._fences) + c_fence[at], return_index=True)  # (two regions)
        p, f = c_pos[at[once]], c_fence[at[once]]
        x, y = wb.positions.lon[p], wb.positions.lat[p]
        hit = crosses(self._geoms[f], prev[p, 0], prev[p, 1], x, y)
        w = np.flatnonzero(hit & self._has_where[f])
        if w.size:  # a fence's filter on the position's fields, as for ENTER
            hit[w] = self._passes(f[w], p[w], wb.positions.extra)
        p, f = p[hit], f[hit]
        return self._events(np.full(p.size, 3, np.int8), f, codes[p], wb.positions.ts[p], (ENTERED, EXITED),
                            dated=True)

    # The common batch (each object once, newer than what is stored) is a set difference
    # per object; any other is numbered observations and runs. Both give the same result:
    # the flag lets the tests run the general path on every batch.
    single_observation_path = True

    def _apply_single(self, obs: _Observations, stored_at: I64, c_pos: I64, c_fence: I64) -> list[Event]:
        """One new observation per object: ENTER what it is in and was not, LEAVE the reverse."""
        new = (obs.objs[obs.pos_group[c_pos]].astype(np.uint64) << _SHIFT) | c_fence.astype(np.uint64)
        new.sort()
        if new.size > 1 and (new[1:] == new[:-1]).any():  # said twice (e.g. two regions)
            new = np.unique(new)
        old = self._keys[stored_at]
        j = np.minimum(np.searchsorted(old, new), max(old.size - 1, 0))
        stays = old[j] == new if old.size else np.zeros(new.size, bool)
        kept = np.zeros(old.size, bool)
        kept[j[stays]] = True
        entering, leaving = new[~stays], old[~kept]
        group_in = np.searchsorted(obs.objs, (entering >> _SHIFT).astype(np.int64))
        since = np.empty(new.size)
        since[stays] = self._since[stored_at[j[stays]]]
        since[~stays] = np.maximum(obs.obs_ts[group_in], self._changed_at[(entering & _LOW).astype(np.int64)])
        left_since = self._since[stored_at[~kept]]
        dwelled, d_since = np.empty(0, np.uint64), np.empty(0)
        if self._dwell_on():
            keep_in, keep_out = self._dwell_filter(entering, leaving)
            entering, group_in = entering[keep_in], group_in[keep_in]
            leaving, left_since = leaving[keep_out], left_since[keep_out]
            dwelled, d_since = new[stays], since[stays]
            group_d = np.searchsorted(obs.objs, (dwelled >> _SHIFT).astype(np.int64))
            reached = self._dwelled(dwelled, obs.obs_ts[group_d], d_since)
            dwelled, d_since, group_d = dwelled[reached], d_since[reached], group_d[reached]
        else:
            group_d = np.empty(0, np.int64)
        group_out = np.searchsorted(obs.objs, (leaving >> _SHIFT).astype(np.int64))
        groups = np.r_[group_in, group_out, group_d]
        events = self._events(
            np.r_[np.zeros(entering.size, np.int8), np.ones(leaving.size, np.int8),
                  np.full(dwelled.size, 2, np.int8)],
            np.r_[entering & _LOW, leaving & _LOW, dwelled & _LOW].astype(np.int64),
            obs.objs[groups],
            obs.obs_ts[groups],  # the one observation of each object
            (ENTERED, EXITED), dated=True,
            since=np.r_[np.full(entering.size, np.nan), left_since, d_since],
        )
        self._replace_sorted(stored_at, new, since)
        return events

    def _apply_runs(self, obs: _Observations, stored_at: I64, c_pos: I64, c_fence: I64) -> list[Event]:
        """Any batch: a run of consecutive observation numbers of one (object, fence) is a
        stay inside; a run starting after number 0 is an ENTER, one ending before the
        object's last observation a LEAVE."""
        pairs = self._pairs(obs, stored_at, c_pos, c_fence)
        enter = pairs.run_start & ((pairs.seq > 0) | ~pairs.stored)
        leave = pairs.run_end & (pairs.seq < obs.k[pairs.group])
        final = pairs.run_end & (pairs.seq == obs.k[pairs.group])
        # each run's stay began at its first entry: the stored since, or that observation
        run_start = pairs.run_start[: pairs.group.size]  # (no pairs: one spurious start)
        run_of = np.cumsum(run_start) - 1
        starts = np.flatnonzero(run_start)
        run_since = pairs.since[starts]
        fresh = ~pairs.stored[starts]
        run_since[fresh] = np.maximum(obs.ts_of(pairs.group[starts[fresh]], pairs.seq[starts[fresh]]),
                                      self._changed_at[pairs.fence[starts[fresh]]])
        e_in, e_out, e_d = np.flatnonzero(enter), np.flatnonzero(leave), np.empty(0, np.int64)
        f_at = np.flatnonzero(final)
        # final state: the runs reaching the object's last observation, since their first
        new_keys = ((obs.objs[pairs.group[f_at]].astype(np.uint64) << _SHIFT)
                    | pairs.fence[f_at].astype(np.uint64))
        if self._dwell_on():  # per run: confirmed at its start, or at its first observation past the dwell
            r_fence = pairs.fence[starts]
            r_key = (obs.objs[pairs.group[starts]].astype(np.uint64) << _SHIFT) | r_fence.astype(np.uint64)
            d = self._dwell[r_fence]
            waiting = np.where(pairs.stored[starts], self._unconfirmed_of(r_key), d > 0)
            cand = np.flatnonzero(waiting[run_of] & (pairs.seq >= 1))
            lasted = obs.ts_of(pairs.group[cand], pairs.seq[cand]) - run_since[run_of[cand]]
            cand = cand[lasted >= d[run_of[cand]]]
            e_d = cand[np.r_[True, run_of[cand][1:] != run_of[cand][:-1]]] if cand.size else cand
            confirmed = ~waiting
            confirmed[run_of[e_d]] = True
            e_in = e_in[~waiting[run_of[e_in]]]  # (an ENTER starts a fresh run: waiting iff a dwell)
            e_out = e_out[confirmed[run_of[e_out]]]
            self._unconfirm(self._keys[stored_at], new_keys[~confirmed[run_of[f_at]]])
        at = np.r_[e_in, e_out, e_d]
        events = self._events(
            np.r_[np.zeros(e_in.size, np.int8), np.ones(e_out.size, np.int8), np.full(e_d.size, 2, np.int8)],
            pairs.fence[at], obs.objs[pairs.group[at]],
            obs.ts_of(pairs.group[at], pairs.seq[at] + np.r_[np.zeros(e_in.size, np.int64),
                                                          np.ones(e_out.size, np.int64),
                                                          np.zeros(e_d.size, np.int64)]),
            (ENTERED, EXITED), dated=True,
            since=np.r_[np.full(e_in.size, np.nan), run_since[run_of[e_out]], run_since[run_of[e_d]]],
        )
        self._replace_sorted(stored_at, new_keys, run_since[run_of[f_at]])
        return events

    def _observations(self, obj: I64, ts: F64) -> _Observations:
        """Number each object's fresh observations 1..k after its stored state (number 0);
        an observation at the last known ts is number 0 itself."""
        n = obj.size
        if distinct(obj, len(self._objects)):
            order = np.argsort(obj)
            if (ts[order] > self._last_ts[obj[order]]).all():
                return _Observations.single_of(obj, ts, order)
        else:
            order = np.lexsort((ts, obj))
        fresh = ts[order] >= self._last_ts[obj[order]]
        if not fresh.all():
            self.stale_positions += int(n - np.count_nonzero(fresh))
            order = order[fresh]
        o, t = obj[order], ts[order]
        m = o.size
        if m == 0:
            none = np.full(n, -1, np.int64)
            return _Observations(*(np.empty(0, np.int64),) * 3, np.empty(0), np.empty(0, np.int64),
                                 none, none)
        new_obj = np.ones(m, bool)
        new_obj[1:] = o[1:] != o[:-1]
        new_obs = new_obj.copy()
        new_obs[1:] |= t[1:] != t[:-1]
        group = np.cumsum(new_obj) - 1
        obs_idx = np.cumsum(new_obs) - 1
        starts = np.flatnonzero(new_obj)
        ends = np.r_[starts[1:] - 1, m - 1]
        objs = o[starts]
        base = obs_idx[starts] - (t[starts] > self._last_ts[objs])
        seq = obs_idx - base[group]
        pos_group = np.full(n, -1, np.int64)
        pos_seq = np.full(n, -1, np.int64)
        pos_group[order] = group
        pos_seq[order] = seq
        return _Observations(objs, seq[ends], base, t[new_obs], order[ends], pos_group, pos_seq,
                             single=bool((seq == 1).all()))

    def _inside(self, wb: WorkerBatch, obs: _Observations, c_pos: I64, c_fence: I64
                ) -> tuple[I64, I64, I64, I64]:
        """Candidate (position, fence code) pairs of fresh positions that pass the exact
        test (skipped on interior blocks), and those in a fence's hysteresis band (decided
        by `_band`); candidates of unknown fences are counted, dropped. A candidate x-geo
        routed with the version of its fence replaced last (a region that had not applied the
        change yet) is judged as that version: its filter, its band or its geometry (its
        interior flags hold for it); one routed with any other version than the current, by
        the current version exactly."""
        keep = c_fence >= 0
        self.unknown_fence_candidates += c_fence.size - int(np.count_nonzero(keep))
        none = np.empty(0, np.int64)
        if not c_fence.size:
            return c_pos, c_fence, none, none
        keep &= obs.pos_seq[c_pos] >= 0  # stale positions have no observation
        f = np.maximum(c_fence, 0)
        interior = wb.interior
        old = np.zeros(c_fence.size, bool)  # judged as the version replaced last
        if wb.versions is not None:  # candidates routed with another version than defined here
            said = wb.versions[wb.cand]
            other = np.flatnonzero(keep & (said != 0) & (said != self._version_of[f]))
            if other.size:
                kept = self._prev
                old[other] = np.fromiter((c in kept and kept[c].version == v for c, v in
                                          zip(c_fence[other].tolist(), said[other].tolist(), strict=True)),
                                         bool, other.size)
                interior = interior.copy()
                interior[other[~old[other]]] = False  # blocks of a version gone: the current one, exactly
        o = np.flatnonzero(keep & old)
        prev = [self._prev[c] for c in c_fence[o].tolist()]
        filtered = self._has_where[f] & ~old
        filtered[o] = [bool(d.where) for d in prev]
        w = np.flatnonzero(keep & filtered)
        if w.size:  # a fence's filter: a position that fails it is outside (past any band)
            keep[w] = self._passes(c_fence[w], c_pos[w], wb.positions.extra, old[w])
        banded = (self._hyst[f] > 0) & ~old
        banded[o] = [d.hysteresis_m > 0 for d in prev]
        banded &= keep
        b_pos, b_fence = none, none
        if banded.any():  # judged by zone (x-geo covers the grown fence)
            at = np.flatnonzero(banded)
            zone = self._zones(c_fence[at], wb.positions.lon[c_pos[at]], wb.positions.lat[c_pos[at]], old[at])
            keep[at] = zone == 2
            b_pos, b_fence = c_pos[at[zone == 1]], c_fence[at[zone == 1]]
        exact = keep & ~interior & ~banded
        at = np.flatnonzero(exact & ~old)
        if at.size:
            keep[at] = self._contains(c_fence[at], wb.positions.lon[c_pos[at]], wb.positions.lat[c_pos[at]])
        at = np.flatnonzero(exact & old)
        if at.size:  # rare: only positions in flight across a change
            geoms = np.array([self._prev[c].geometry for c in c_fence[at].tolist()], dtype=object)
            keep[at] = shapely.contains_xy(geoms, wb.positions.lon[c_pos[at]], wb.positions.lat[c_pos[at]])
        return c_pos[keep], c_fence[keep], b_pos, b_fence

    def _passes(self, fences: I64, rows: I64, extra: Sequence[Mapping[str, Any] | None],
                old: npt.NDArray[np.bool_] | None = None) -> npt.NDArray[np.bool_]:
        """Per (fence with a filter, position row): whether the row's fields pass the filter
        (exchanges/filters.py; one call per fence of the batch); `old`: of the version
        replaced last."""
        out = np.ones(fences.size, bool)
        was = old if old is not None else np.zeros(fences.size, bool)
        for code, o in {(c, bool(b)) for c, b in zip(fences.tolist(), was.tolist(), strict=True)}:
            at = np.flatnonzero((fences == code) & (was == o))
            fields = [extra[r] if extra else None for r in rows[at].tolist()]
            out[at] = filters.matches(self._prev[code].where if o else self._where[code], fields)
        return out

    def _zones(self, fences: I64, x: F64, y: F64, old: npt.NDArray[np.bool_] | None = None
               ) -> npt.NDArray[np.int8]:
        """Per (fence with a band, point): 2 past the band inward (in `inner`), 1 within the
        band, 0 past it outward (not in `outer`); `old`: by the version replaced last."""
        inner, outer = self._inner[fences], self._outer[fences]
        if old is not None and old.any():
            inner, outer = inner.copy(), outer.copy()
            for i in np.flatnonzero(old).tolist():
                d = self._prev[int(fences[i])]
                inner[i], outer[i] = hysteresis_zones(d.geometry, d.hysteresis_m)
        zone: npt.NDArray[np.int8] = shapely.contains_xy(outer, x, y).astype(np.int8)
        maybe = np.flatnonzero(zone)
        if maybe.size:
            zone[maybe] += shapely.contains_xy(inner[maybe], x[maybe], y[maybe])
        return zone

    def _band(self, obs: _Observations, stored_at: I64, c_pos: I64, c_fence: I64, b_pos: I64,
              b_fence: I64) -> npt.NDArray[np.bool_]:
        """Which band candidates are inside: those whose object was inside the fence at its
        observation before, through a chain of consecutive observations within the band back
        to one past it inward or to the stored state (number 0). An observation with no
        candidate for the fence was past the band outward (x-geo covers the grown fence)."""
        s_keys = self._keys[stored_at]
        s_fence = (s_keys & _LOW).astype(np.int64)
        s = np.flatnonzero(np.isin(s_fence, b_fence))  # the anchors of the fences with band candidates
        i = np.flatnonzero(np.isin(c_fence, b_fence))
        group = np.r_[np.searchsorted(obs.objs, (s_keys[s] >> _SHIFT).astype(np.int64)),
                      obs.pos_group[c_pos[i]], obs.pos_group[b_pos]]
        fence = np.r_[s_fence[s], c_fence[i], b_fence]
        seq = np.r_[np.zeros(s.size, np.int64), obs.pos_seq[c_pos[i]], obs.pos_seq[b_pos]]
        anchor = np.r_[np.ones(s.size + i.size, bool), np.zeros(b_pos.size, bool)]
        order = np.lexsort((~anchor, seq, fence, group))  # an observation said twice: anchor first
        g, f, q, a = group[order], fence[order], seq[order], anchor[order]
        same = np.r_[False, (g[1:] == g[:-1]) & (f[1:] == f[:-1])]
        start = ~(same & ((q - np.r_[0, q[:-1]]) <= 1))  # a new chain of consecutive observations
        chain = np.cumsum(start) - 1
        anchors = np.cumsum(a)
        before = np.r_[0, anchors][np.flatnonzero(start)][chain]  # anchors before each chain began
        inside = anchors - before > 0
        out = np.zeros(b_pos.size, bool)
        mine = order >= s.size + i.size
        out[order[mine] - s.size - i.size] = inside[mine]
        return out

    def _contains(self, fences: I64, x: F64, y: F64) -> npt.NDArray[np.bool_]:
        """shapely.contains_xy(fence, x, y) elementwise: in C, and by shapely where C is unsure."""
        verdict = self._edges.locate(fences, x, y)
        unsure = np.flatnonzero(verdict == kernel.PIP_UNSURE)
        if unsure.size:
            verdict[unsure] = shapely.contains_xy(self._geoms[fences[unsure]], x[unsure], y[unsure])
        out: npt.NDArray[np.bool_] = verdict == kernel.PIP_IN
        return out

    def _stored_pairs(self, objs: I64) -> I64:
        """Indices in the pair table of the pairs of these objects (sorted codes)."""
        lo = np.searchsorted(self._keys, objs.astype(np.uint64) << _SHIFT)
        hi = np.searchsorted(self._keys, (objs.astype(np.uint64) + np.uint64(1)) << _SHIFT)
        n_st = hi - lo
        at: I64 = np.repeat(lo - (np.cumsum(n_st) - n_st), n_st) + np.arange(int(n_st.sum()))
        return at

    def _pairs(self, obs: _Observations, stored_at: I64, c_pos: I64, c_fence: I64) -> _Pairs:
        """The stored pairs of the batch's objects (number 0) and the inside candidates,
        sorted by (object, fence, number), one entry per (object, fence, observation)."""
        objs = obs.objs
        n_stored = stored_at.size
        s_keys = self._keys[stored_at]
        s_group = np.searchsorted(objs, (s_keys >> _SHIFT).astype(np.int64))
        group = np.r_[s_group, obs.pos_group[c_pos]]
        fence = np.r_[(s_keys & _LOW).astype(np.int64), c_fence]
        seq = np.r_[np.zeros(n_stored, np.int64), obs.pos_seq[c_pos]]
        order = _pair_order(group, fence, seq, n_stored, objs.size, len(self._fences),
                            int(obs.k.max()) + 1)
        group, fence, seq = group[order], fence[order], seq[order]
        stored = order < n_stored
        since = self._since[stored_at[np.minimum(order, n_stored - 1)]] if n_stored else np.zeros(order.size)
        same_pair = (group[1:] == group[:-1]) & (fence[1:] == fence[:-1])
        dup = same_pair & (seq[1:] == seq[:-1])
        if dup.any():  # one observation said twice (or at the stored ts): keep the first
            keep = np.r_[True, ~dup]
            group, fence, seq, stored, since = group[keep], fence[keep], seq[keep], stored[keep], since[keep]
            same_pair = (group[1:] == group[:-1]) & (fence[1:] == fence[:-1])
        cont = same_pair & (seq[1:] == seq[:-1] + 1)
        return _Pairs(group, fence, seq, stored, since, np.r_[True, ~cont], np.r_[~cont, True])

    def expire(self, now: float) -> list[Event]:
        """LEAVE for every pair whose object was silent longer than the fence's timeout
        (reason timeout) or than its own TTL, when that is shorter (reason expired: the `ttl`
        of the object's latest position sent here; a re-check row, which carries no extra
        fields, keeps the TTL it had); the event's ts is last seen + that time, so it does not
        depend on when we look.
        Positions held longer than HOLD_S for a handover notice are applied first."""
        held = self._release(now) if self._held else []
        if not self._keys.size:
            return held
        objs = (self._keys >> _SHIFT).astype(np.int64)
        fences = (self._keys & _LOW).astype(np.int64)
        ttl, timeout = self._ttl[objs], self._timeout[fences]
        due_at = self._last_ts[objs] + np.minimum(timeout, ttl)
        due = due_at < now
        if not due.any():
            return held
        silent = due & self._unconfirmed_of(self._keys)  # stays never reported
        self._unconfirm(self._keys[silent])
        events = []
        told = due & ~silent
        for mine, reason in ((told & (ttl < timeout), EXPIRED), (told & ~(ttl < timeout), TIMEOUT)):
            if mine.any():
                events += self._events(np.ones(int(mine.sum()), np.int8), fences[mine], objs[mine],
                                       due_at[mine], (ENTERED, reason), since=self._since[mine])
        events.sort(key=lambda e: (e.ts, e.object_id, e.fence_id, e.event))
        self._keys, self._since = self._keys[~due], self._since[~due]
        self._dirty_objs.append(objs[due])
        return held + events

    # -- handover (`geofence worker add / remove / hot`) -----------------------------------

    def _given(self, ring: Placement) -> tuple[list[int], list[int], npt.NDArray[np.bool_]]:
        """Under `ring`: the fences defined here that go to other workers whole (this worker
        is not among their masters), those that go in part (hot fences: their definition goes
        along, as a master that joins needs it), and the inside pairs whose new owner is
        another worker."""
        whole: list[int] = []
        hot: list[tuple[str, int]] = []
        for name, code in self._fence_code.items():
            masters = ring.masters(name)
            if self.worker not in masters:
                whole.append(code)
            elif len(masters) > 1:
                hot.append((name, code))
        pair_fence = (self._keys & _LOW).astype(np.int64)
        given = np.isin(pair_fence, whole)
        for name, code in hot:  # (few)
            at = np.flatnonzero(pair_fence == code)
            if at.size:
                ids, objs = self._objects.ids, (self._keys[at] >> _SHIFT).astype(np.int64)
                owners = ring.owners(name, [ids[o] for o in objs.tolist()])
                given[at] = np.array([w != self.worker for w in owners], bool)
        return sorted(whole), sorted(c for _, c in hot), given

    def export(self, ring: Placement, gates: bool = True) -> dict[str, Any]:
        """What `ring` (the new one) gives to other workers, as plain data: the definitions of
        the fences that leave this worker or are hot (with a change in transition), the inside
        pairs whose owner changes (who is inside since when), and those objects' rows (last
        position, handover time). Changes nothing: the state stays here until `forget` (the
        handover is abandoned, it goes on here). `gates`: with every object's handover time
        (a worker that joins needs them once)."""
        whole, hot, sel = self._given(ring)
        codes = sorted(whole + hot)
        objs, p_obj = np.unique((self._keys[sel] >> _SHIFT).astype(np.int64), return_inverse=True)
        at = {c: i for i, c in enumerate(codes)}
        p_fence = np.array([at[int(c)] for c in (self._keys[sel] & _LOW).astype(np.int64)], np.int64)
        gated = np.flatnonzero(self._ho_ts[: len(self._objects)] > 0) if gates else np.empty(0, np.int64)
        return {
            "format": codec.FORMAT, "from": self.worker,
            "fences": [[self._fence_names[c], self._stored(c)] for c in codes],
            "versions": {self._fence_names[c]: self._versions[self._fence_names[c]] for c in codes},
            # fences given away whole (the others are hot: only some of their objects move)
            "whole": [self._fence_names[c] for c in whole],
            "ids": [self._objects.ids[o] for o in objs.tolist()],
            **{name: codec.pack_array(getattr(self, f"_{name}")[objs], "<f8") for name in codec.ROWS},
            "pair_object": codec.pack_array(p_obj.astype(np.int64), "<i8"),
            "pair_fence": codec.pack_array(p_fence, "<i8"),
            "since": codec.pack_array(self._since[sel], "<f8"),
            "unconfirmed": codec.pack_array(self._unconfirmed_of(self._keys[sel]), "u1"),
            # every object's latest handover notice: notices go to every worker, and a new
            # one never saw those before it joined (its gates would wait for them)
            "gate_ids": [self._objects.ids[o] for o in gated.tolist()],
            "gate_ts": codec.pack_array(self._ho_ts[gated], "<f8"),
        }

    def take(self, data: dict[str, Any], ring: Placement) -> int:
        """Install, of what another worker's `export` gave, this worker's share under `ring`
        (the new one): the fences it is a master of that it does not have at that version, and
        the inside pairs it owns; the same state again changes nothing. Each object keeps the
        newer of its two rows (positions it was sent here, or there). Returns the number of
        inside pairs taken."""
        codec.check_format(data, "handover")
        gate_ids = [str(i) for i in data["gate_ids"]]
        gate_ts = codec.unpack_array(data["gate_ts"], "<f8", np.float64)
        if gate_ts.size != len(gate_ids):
            raise ValueError("x-fence handover: handover times do not match their ids")
        if gate_ids:
            gated = self._codes(gate_ids)
            self._ho_ts[gated] = np.maximum(self._ho_ts[gated], gate_ts)
            self._dirty_objs.append(gated)
        p_obj = codec.unpack_array(data["pair_object"], "<i8", np.int64)
        p_fence = codec.unpack_array(data["pair_fence"], "<i8", np.int64)
        since = codec.unpack_array(data["since"], "<f8", np.float64)
        waiting = (codec.unpack_array(data["unconfirmed"], "u1", bool) if "unconfirmed" in data
                   else np.zeros(since.size, bool))
        if not (p_obj.size == p_fence.size == since.size == waiting.size):
            raise ValueError("x-fence handover: the pairs' columns differ in length")
        if p_fence.size and not (p_fence.min() >= 0 and p_fence.max() < len(data["fences"])
                                 and p_obj.min() >= 0 and p_obj.max() < len(data["ids"])):
            raise ValueError("x-fence handover: a pair names no exported fence or object")
        theirs = {name: codec.unpack_row(data, name, len(data["ids"])) for name in codec.ROWS}
        if any(v.size != len(data["ids"]) for v in theirs.values()):
            raise ValueError("x-fence handover: object rows do not match the ids")
        codes = np.full(len(data["fences"]), -1, np.int64)
        pick = np.zeros(p_obj.size, bool)
        replaced: list[int] = []  # fences new here: any pair of theirs here is a former take's
        for i, (name, stored) in enumerate(data["fences"]):
            name = str(name)
            if self.worker not in ring.masters(name):
                continue
            version = int(data["versions"][name])
            code = self._fence_code.get(name)
            if code is None or self._version_of[code] < version:
                if code is None:
                    code = self._new_slot(name)
                    replaced.append(code)
                self._put_stored(code, codec.unpack_fence(stored))
                self._fence_code[name] = code
                self._dirty_fences.add(code)
            elif self._version_of[code] > version:
                continue  # (a newer change reached this worker: never so after a drain)
            self._versions[name] = max(self._versions.get(name, 0), version)
            codes[i] = code
            at = np.flatnonzero(p_fence == i)
            if at.size:
                owners = ring.owners(name, [str(data["ids"][o]) for o in p_obj[at].tolist()])
                pick[at] = np.array([w == self.worker for w in owners], bool)
        used = np.unique(p_obj[pick])
        ids = [str(data["ids"][i]) for i in used.tolist()]
        objs = self._codes(ids) if ids else np.empty(0, np.int64)
        theirs = {name: v[used] for name, v in theirs.items()}
        newer = theirs["last_ts"] > self._last_ts[objs]
        for name in ("last_ts", "last_lon", "last_lat", "ttl"):
            getattr(self, f"_{name}")[objs[newer]] = theirs[name][newer]
        self._ho_ts[objs] = np.maximum(self._ho_ts[objs], theirs["ho_ts"])
        local = np.searchsorted(used, p_obj[pick])  # each pair's object among `used`
        keys = (objs[local].astype(np.uint64) << _SHIFT) | codes[p_fence[pick]].astype(np.uint64)
        since = since[pick]
        stale = np.isin((self._keys & _LOW).astype(np.int64), replaced) | np.isin(self._keys, keys)
        self._unconfirm(self._keys[stale], keys[waiting[pick]])
        order = np.argsort(keys, kind="stable")
        self._merge_pairs(self._keys[~stale], self._since[~stale], keys[order], since[order])
        self._dirty_objs.append(objs)
        return int(keys.size)

    def forget(self, ring: Placement) -> int:
        """Let go, with no event, of what `ring` gives to other workers (their new owners
        have the state and decide from now on): the fences this worker is no master of, and
        a hot fence's objects another master owns. Returns how many fences went whole."""
        whole, _, given = self._given(ring)
        if not given.any() and not whole:
            return 0
        self._dirty_objs.append((self._keys[given] >> _SHIFT).astype(np.int64))
        self._unconfirm(self._keys[given])
        self._keys, self._since = self._keys[~given], self._since[~given]
        for code in whole:
            del self._fence_code[self._fence_names[code]]
            self._clear_slot(code)
            self._dirty_fences.add(code)
        return len(whole)

    # -- state for `geofence inspect fence` -------------------------------------------------

    def fences(self) -> list[str]:
        return sorted(self._fence_code)

    def fence(self, fence_id: str) -> FenceDef | None:
        code = self._fence_code.get(fence_id)
        return None if code is None else self._fences[code]

    def counts(self) -> dict[str, int]:
        """How many objects are inside each fence that has any (the live map's colours); a stay
        not past its fence's dwell time is not counted (it has had no ENTER)."""
        keys = self._keys[~self._unconfirmed_of(self._keys)] if self._unconfirmed.size else self._keys
        codes, n = np.unique((keys & _LOW).astype(np.int64), return_counts=True)
        out = {}
        for code, k in zip(codes.tolist(), n.tolist(), strict=True):
            d = self._fences[code]
            if d is not None:
                out[d.fence_id] = k
        return out

    def occupants(self, fence_id: str) -> list[dict[str, Any]]:
        code = self._fence_code.get(fence_id)
        if code is None:
            raise KeyError(f"fence {fence_id!r} is not on worker {self.worker}")
        mask = (self._keys & _LOW) == np.uint64(code)
        objs = (self._keys[mask] >> _SHIFT).astype(np.int64)
        waiting = self._unconfirmed_of(self._keys[mask]).tolist()
        # confirmed: its ENTER was emitted (False while a stay has not reached the dwell time)
        return [{"object_id": self._objects.ids[o], "since": float(s), "last_seen": float(self._last_ts[o]),
                 "confirmed": not w}
                for o, s, w in zip(objs.tolist(), self._since[mask].tolist(), waiting, strict=True)]

    def last_seen(self, object_id: str) -> float | None:
        """The time of the object's last position this worker was sent (it is sent an
        object's positions while they are in one of its fences' ranges; elsewhere, the
        object is in none of its fences and this time goes stale)."""
        code = self._objects.get(object_id)
        return None if code is None or not np.isfinite(self._last_ts[code]) else float(self._last_ts[code])

    def fences_of(self, object_id: str) -> list[str]:
        code = self._objects.get(object_id)
        if code is None:
            return []
        lo, hi = np.searchsorted(self._keys, [np.uint64(code) << _SHIFT, np.uint64(code + 1) << _SHIFT])
        keys = self._keys[lo:hi]
        return sorted(self._fence_ids(keys[~self._unconfirmed_of(keys)]))  # stays reported (ENTER emitted)

    def stats(self) -> dict[str, int]:
        return {"fences": len(self._fence_code), "objects": len(self._objects.ids),
                "inside_pairs": int(self._keys.size),
                "unknown_fence_candidates": self.unknown_fence_candidates,
                "stale_positions": self.stale_positions, "held_positions": self.held_positions,
                "held_now": len(self._held), "holds_expired": self.holds_expired,
                "rechecks": self.rechecks, "rechecks_superseded": self.rechecks_superseded}

    # -- persistence (the formats: fence/x_fence/codec.py) --------------------------------

    def state(self) -> dict[str, Any]:
        """The whole state as plain data (what a snapshot holds), without side effects."""
        n = len(self._objects)
        return {
            "format": codec.FORMAT, "worker": self.worker, "ids": list(self._objects.ids),
            **{name: codec.pack_array(getattr(self, f"_{name}")[:n], "<f8") for name in codec.ROWS},
            "fences": [self._stored(c) for c in range(len(self._fences))], "names": list(self._fence_names),
            "codes": dict(self._fence_code), "versions": dict(self._versions),
            "keys": codec.pack_array(self._keys, "<u8"), "since": codec.pack_array(self._since, "<f8"),
            "unconfirmed": codec.pack_array(self._unconfirmed, "<u8"),
            "held": self._held.pack(), "stats": {k: getattr(self, k) for k in codec.STATS},
        }

    def snapshot(self) -> dict[str, Any]:
        """The whole state; also clears what `changes` would report (the snapshot has it)."""
        data = self.state()
        self._clean()
        return data

    @classmethod
    def restore(cls, data: dict[str, Any]) -> XFence:
        """The core a snapshot describes (ValueError if it is of another format or damaged)."""
        codec.check_format(data, "snapshot")
        x = cls(str(data["worker"]))
        ids = list(data["ids"])
        x._objects.codes(ids)
        if x._objects.ids != ids:
            raise ValueError("x-fence snapshot: object ids repeat")
        n = len(ids)
        for name in codec.ROWS:
            values = codec.unpack_row(data, name, n)
            if values.size != n:
                raise ValueError(f"x-fence snapshot: {name} has {values.size} rows for {n} objects")
            setattr(x, f"_{name}", values)
        for code, (name, d) in enumerate(zip(data["names"], data["fences"], strict=True)):
            x._new_slot(name)
            if d is None:
                del x._fence_code[name]  # dropped: the slot stays, unused
            else:
                x._put_stored(code, codec.unpack_fence(d))
                x._fence_code[name] = code
        x._versions = {str(k): int(v) for k, v in data["versions"].items()}
        x._keys = codec.unpack_array(data["keys"], "<u8", np.uint64)
        x._since = codec.unpack_array(data["since"], "<f8", np.float64)
        if x._keys.size != x._since.size or (x._keys.size > 1 and (x._keys[1:] <= x._keys[:-1]).any()):
            raise ValueError("x-fence snapshot: inside pairs are not sorted and unique")
        if "unconfirmed" in data:
            x._unconfirmed = codec.unpack_array(data["unconfirmed"], "<u8", np.uint64)
            if not np.isin(x._unconfirmed, x._keys).all():
                raise ValueError("x-fence snapshot: an unconfirmed stay is not an inside pair")
        x._held = Held.unpack(data["held"])
        x._set_stats(data["stats"])
        return x

    def changes(self, n_persisted: int) -> dict[str, Any] | None:
        """What changed since the last call (None: nothing), as one journal record.
        `n_persisted` is the number of object ids the journal already holds; the record
        carries the ids after them."""
        n = len(self._objects)
        if (not self._dirty_objs and not self._dirty_fences and not self._dirty_versions
                and not self._held_dirty and n == n_persisted):
            return None
        objs = np.unique(np.concatenate(self._dirty_objs)) if self._dirty_objs else np.empty(0, np.int64)
        fences = np.array(sorted(self._dirty_fences), np.int64)
        take = np.zeros(self._keys.size, bool)
        if objs.size:
            take[self._stored_pairs(objs)] = True
        if fences.size:
            take |= np.isin((self._keys & _LOW).astype(np.int64), fences)
        names = {*(self._fence_names[c] for c in fences.tolist()), *self._dirty_versions}
        record = {
            "n0": n_persisted, "new_ids": self._objects.ids[n_persisted:n],
            "objs": codec.pack_array(objs, "<i8"),
            **{name: codec.pack_array(getattr(self, f"_{name}")[objs], "<f8") for name in codec.ROWS},
            "fences": [[c, self._fence_names[c], self._stored(c)] for c in fences.tolist()],
            "versions": {f: self._versions[f] for f in names},
            "keys": codec.pack_array(self._keys[take], "<u8"),
            "since": codec.pack_array(self._since[take], "<f8"),
            "unconfirmed": codec.pack_array(self._unconfirmed_of(self._keys[take]), "u1"),
            "held": self._held.pack() if self._held_dirty else None,
            "stats": {k: getattr(self, k) for k in codec.STATS},
        }
        self._clean()
        return record

    def apply(self, record: dict[str, Any]) -> None:
        """Replay one record of `changes` (in journal order)."""
        n0 = int(record["n0"])
        if n0 > len(self._objects):
            raise ValueError(f"x-fence journal: a record starts at object {n0}, "
                             f"the state has {len(self._objects)}")
        new_ids = list(record["new_ids"])[len(self._objects) - n0:]  # a replayed record's ids are known
        if new_ids:
            self._codes(new_ids)
        objs = codec.unpack_array(record["objs"], "<i8", np.int64)
        for name in codec.ROWS:
            getattr(self, f"_{name}")[objs] = codec.unpack_row(record, name, objs.size)
        fences = []
        for code, name, d in record["fences"]:
            if code > len(self._fences):
                raise ValueError(f"x-fence journal: fence code {code} after {len(self._fences)} codes")
            if code == len(self._fences):
                self._new_slot(name)
                del self._fence_code[name]
            if d is None:
                if self._fence_code.get(name) == code:
                    del self._fence_code[name]
                self._clear_slot(code)
            else:
                self._put_stored(code, codec.unpack_fence(d))
                self._fence_code[name] = code
            fences.append(code)
        self._versions.update({str(k): int(v) for k, v in record["versions"].items()})
        keys = self._keys
        drop = (np.isin((keys >> _SHIFT).astype(np.int64), objs)
                | np.isin((keys & _LOW).astype(np.int64), fences))
        new_keys = codec.unpack_array(record["keys"], "<u8", np.uint64)
        new_since = codec.unpack_array(record["since"], "<f8", np.float64)
        waiting = (codec.unpack_array(record["unconfirmed"], "u1", bool) if "unconfirmed" in record
                   else np.zeros(new_keys.size, bool))
        self._unconfirm(keys[drop], new_keys[waiting])
        order = np.argsort(new_keys, kind="stable")
        self._merge_pairs(keys[~drop], self._since[~drop], new_keys[order], new_since[order])
        if record["held"] is not None:
            self._held = Held.unpack(record["held"])
        self._set_stats(record["stats"])
        self._clean()

    def _stored(self, code: int) -> dict[str, Any] | None:
        d = self._fences[code]
        if d is None:
            return None
        stored = codec.StoredFence(d, float(self._changed_at[code]), bool(self._created[code]),
                                   self._prev.get(code), frozenset(self._pending.get(code, ())))
        return codec.pack_fence(stored)

    def _put_stored(self, code: int, f: codec.StoredFence) -> None:
        """Install a stored fence in slot `code` (its slot exists), with its transition."""
        self._install(code, f.fence, f.changed_at, f.created)
        self._pending.pop(code, None)
        if f.prev is None:
            self._prev.pop(code, None)
        else:
            self._prev[code] = f.prev
            if f.pending:
                self._pending[code] = set(f.pending)

    def _set_stats(self, stats: dict[str, Any]) -> None:
        for k, v in stats.items():
            if k in codec.STATS:
                setattr(self, k, int(v))

    def _clean(self) -> None:
        self._dirty_objs, self._dirty_fences, self._dirty_versions, self._held_dirty = [], set(), set(), False

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
        self._ttl = grow(self._ttl, m, np.inf)
        self._ho_ts = grow(self._ho_ts, m, 0.0)
        return codes

    def _dwell_on(self) -> bool:
        """Whether any fence has a dwell time or any stay waits for one (else no dwell work)."""
        return bool(self._unconfirmed.size) or bool(self._dwell.any())

    def _unconfirmed_of(self, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.bool_]:
        """Per pair key: whether its stay is unconfirmed (not past its fence's dwell time)."""
        u = self._unconfirmed
        if not u.size or not keys.size:
            return np.zeros(keys.size, bool)
        at = np.minimum(np.searchsorted(u, keys), u.size - 1)
        out: npt.NDArray[np.bool_] = u[at] == keys
        return out

    def _unconfirm(self, drop: npt.NDArray[np.uint64], add: npt.NDArray[np.uint64] | None = None) -> None:
        """The unconfirmed set without `drop` (any keys) and with `add`."""
        u = self._unconfirmed
        if drop.size and u.size:
            u = u[~np.isin(u, drop)]
        if add is not None and add.size:
            u = np.union1d(u, add)
        self._unconfirmed = u

    def _dwell_filter(self, entering: npt.NDArray[np.uint64], leaving: npt.NDArray[np.uint64]
                      ) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
        """Which ENTERs and LEAVEs of these pairs are emitted: an ENTER into a fence with a
        dwell time waits (its stay is unconfirmed), the LEAVE of an unconfirmed stay is silent."""
        wait = self._dwell[(entering & _LOW).astype(np.int64)] > 0
        silent = self._unconfirmed_of(leaving)
        self._unconfirm(leaving[silent], entering[wait])
        return ~wait, ~silent

    def _dwelled(self, keys: npt.NDArray[np.uint64], ts: F64, since: F64) -> npt.NDArray[np.bool_]:
        """Of pairs still inside, seen inside at ts: the unconfirmed ones whose stay has now
        lasted their fence's dwell time (ENTER `dwelled`; they are confirmed)."""
        reached = self._unconfirmed_of(keys)
        dwell = self._dwell[(keys[reached] & _LOW).astype(np.int64)]
        reached[reached] = ts[reached] - since[reached] >= dwell
        self._unconfirm(keys[reached])
        return reached

    def _replace_sorted(self, drop: I64, new: npt.NDArray[np.uint64], since: F64) -> None:
        """Drop the pairs at indices `drop`, add `new` (sorted keys)."""
        if drop.size == self._keys.size:  # every stored pair was replaced
            self._keys, self._since = new, since
            return
        keep = np.ones(self._keys.size, bool)
        keep[drop] = False
        self._merge_pairs(self._keys[keep], self._since[keep], new, since)

    def _merge_pairs(self, kept: npt.NDArray[np.uint64], kept_since: F64,
                     new: npt.NDArray[np.uint64], since: F64) -> None:
        keys = np.concatenate([kept, new])
        order = np.argsort(keys, kind="stable")  # two sorted runs: a linear merge
        self._keys, self._since = keys[order], np.concatenate([kept_since, since])[order]

    def _events(self, kind: npt.NDArray[np.int8], fence: I64, obj: I64, ts: F64,
                reasons: tuple[str, str], dated: bool = False, since: F64 | None = None) -> list[Event]:
        """Events (kind 0 = ENTER with reasons[0], 1 = LEAVE with reasons[1], 2 = ENTER `dwelled`
        with its inside_s) ordered by
        (ts, object_id, fence_id, event), with their stable ids (a hash of `ts`). `dated`:
        `ts` are the times of the positions decided from, and an event is dated no earlier
        than its fence's change time (a position routed just after its region applied a
        change may be older than the change: its event must not precede the re-check's).
        `since`: per LEAVE, when its stay began (NaN for an ENTER: the stay begins at the
        event); the visit id hashes it, and a LEAVE's inside_s is the time since."""
        if not kind.size:
            return []
        shown = np.maximum(ts, self._changed_at[fence]) if dated else ts
        began = shown if since is None else np.where(np.isnan(since), shown, since)
        order = np.lexsort((kind, _name_rank(fence, self._fence_names),
                            _name_rank(obj, self._objects.ids), ts, shown))
        kind, ts, shown, began = kind[order], ts[order], shown[order], began[order]
        f_codes, names, oids = fence[order].tolist(), self._fence_names, self._objects.ids
        object_ids = [oids[o] for o in obj[order].tolist()]
        # event_id()'s text is fence prefix + object id + a tail per (kind, ts): the events
        # of a batch share a few instants, so each tail (and its float repr) is made once
        instants, at = np.unique(ts, return_inverse=True)
        reasons_of = (*reasons, DWELLED, CROSSED)  # 2: the ENTER of a stay past its dwell time, 3: CROSS
        tails = [f"\x1f{CODES[k]}\x1f{reasons_of[k]}\x1f{t!r}" for k in range(4) for t in instants.tolist()]
        prefix, blake2b = self._id_prefix, hashlib.blake2b
        ids = [blake2b((prefix[f] + o + tails[i]).encode(), digest_size=16).hexdigest()
               for f, o, i in zip(f_codes, object_ids, (kind.astype(np.int64) * instants.size + at).tolist(),
                                  strict=True)]
        inside = (shown - began).tolist()
        new, out = object.__new__, []
        s_event, s_fence, s_object, s_ts, s_reason, s_id, s_pos, s_visit, s_inside = EVENT_SLOTS
        columns = (kind.tolist(), f_codes, object_ids, shown.tolist(), ts.tolist(), ids, began.tolist(),
                   inside)
        for k, f, o, t, d, i, b, n in zip(*columns, strict=True):
            e = new(Event)
            s_event(e, CODES[k])
            s_fence(e, names[f])
            s_object(e, o)
            s_ts(e, t)
            s_reason(e, reasons_of[k])
            s_id(e, i)
            s_pos(e, d)
            s_visit(e, visit_id(names[f], o, b) if k != 3 else "")  # (a CROSS is no stay)
            s_inside(e, n if k in (1, 2) else None)
            out.append(e)
        return out
