"""Proximity ("roaming") subscriptions on an x-fence worker: `nearby` when another object comes
within a subscription's radius, `faraway` when it leaves it (pure: arrays in, events out).

Semantics (fence/reference.py `roam_events` applies the same, by brute force): a pair
(subscription s on object a, another object b) is *near* while both have a position, b passes
s's filter (`match`, a glob on b's id, and `where`, on the extra fields of b's latest position)
and their distance on the sphere (haversine) is at most s's radius. Every position update of a
or b, in stream order, that changes whether the pair is near is one event dated by that update:
`nearby` when it becomes near, `faraway` when it stops. The state is a function of the latest
positions alone (as Tile38's NEARBY ... FENCE NODWELL ROAM), so any worker holding both
positions can tell what an update changed without a history of its own.

Who reports (the paper's match filter): the owner of b's cell (exchanges/roam_cells.py), after
the update for `nearby` and before it for `faraway`. That worker holds what it needs:
- for `nearby`, a's circle touches b's cell, so a's rows come to the owner of that cell
  (exchanges/roam_routing.py) and it holds a's latest position;
- for `faraway`, a's circle touched b's old cell before the update, so the same holds then, and
  the update itself comes to the owner of the old cell (a's or b's old position is routed too).
Every worker drops the positions it no longer needs (`_keep`), so a position held is the
object's latest: the router sends a worker every row of an object whose cell or circle touches
one of its blocks, including the row that takes it away.

A batch is evaluated at once, row by row in C: a pair touched at row k uses the other object's
position as of k (the new position of its latest row before k, or where it was before its first
row, or the one held). A row costs the positions near its object's old and new places, never
the distance between them: a jump is two places, not a swept area (hilbert_c/proximity.c), and
a box too wide to search cell by cell (a large radius, near a pole) is read by rows of cells.

Trade-off: candidates come from a grid of cells half the routing's, searched in C (the cells of
each mover's boxes, haversine against the largest radius), at the price of a distance per
position in a circle's box. The held positions stay filed by cell across batches
(fence/x_fence/roam_index.py): a batch sorts its own places, never the held ones.

Beside this module: the events and their ids (roam_events.py), the router's messages decoded
(roam_rows.py: Rows, mark_of) and the index of held positions (roam_index.py); the names
callers use are importable from here too (`__all__`).
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from exchanges.fence_options import filters
from exchanges.hash_ring import HashRing
from exchanges.roam_cells import BlockOwners, RoamGrid, distances_m
from exchanges.subscriptions import Subscription, is_point_object
from exchanges.tenancy import name_of, tenant_of
from fence.x_fence.roam_events import RoamEvent, fields_key, pair_event_id, roam_event_id, update_key
from fence.x_fence.roam_index import CellFiles
from fence.x_fence.roam_rows import Rows, mark_of
from hilbert_c import kernel

__all__ = ["SLICE_ROWS", "RoamEvent", "RoamMatcher", "Rows", "fields_key", "mark_of", "matcher_of",
           "pair_event_id", "roam_event_id", "snapshot_of", "step", "update_key"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]
# A worker applies a run of rows this many at a time, giving its event loop back between
# slices: a slice's cost is bounded by the positions near its rows, its events by the pairs
# they change (a crowd landing on subscribers: thousands), and heartbeats and `inspect` wait
# for one slice at most (fence/x_fence/sidecar.py, bench/adversarial.py).
SLICE_ROWS = 128


class _Filter:
    """One (tenant, match, where) shared by subscriptions; per object slot whether it passes.
    An object of another tenant than the subscription's never does (exchanges/tenancy.py)."""

    def __init__(self, tenant: str, match: str, where: tuple[filters.Clause, ...]) -> None:
        self.tenant, self.match, self.where = tenant, match, where
        self.passes = np.zeros(0, bool)

    def by_id(self, ids: Sequence[str]) -> list[bool]:
        """Whether each id matches; a fixed point's synthetic subscriber never does."""
        tenant, match = self.tenant, self.match
        return [not is_point_object(i) and tenant_of(i) == tenant
                and (match == "*" or fnmatch.fnmatchcase(name_of(i), match)) for i in ids]

    def grow(self, ids: Sequence[str], start: int, cap: int) -> None:
        p = np.zeros(cap, bool)
        p[: self.passes.size] = self.passes[: cap]
        if not self.where:
            p[start:len(ids)] = self.by_id(ids[start:])
        self.passes = p

    def of(self, ids: Sequence[str], extras: Sequence[Mapping[str, Any] | None]) -> B:
        return np.array(self.by_id(ids), bool) & filters.matches(self.where, extras)


class RoamMatcher:
    """One worker's share of the proximity subscriptions: the positions it holds (objects in
    its blocks, subscribers whose circles touch them) and the subscriptions themselves."""

    def __init__(self, grid: RoamGrid, owners: BlockOwners, me: int) -> None:
        self.grid, self.owners, self.me = grid, owners, me
        self.ring: Any = None  # the ring as the router sent it (to_dict), kept for snapshots
        self.mark: tuple[int, int] = (0, 0)  # the last router message applied (roam_routing.RoamStream)
        self._index = RoamGrid(min(grid.level + 1, 24), 0)  # candidates: cells half the routing's
        self.work = (0, 0)  # index searches, entries looked at (hilbert_c/proximity.c): the cost so far
        self._reset()

    def _reset(self) -> None:
        self._slot: dict[str, int] = {}
        self._ids: list[str] = []
        cap = 1024
        self._lon = np.full(cap, np.nan)
        self._lat = np.full(cap, np.nan)
        self._rmax = np.zeros(cap)
        # per slot, for the held positions: owned by this worker and the index cell, valid
        # while `_known` (a position set clears it): a segment computes them for its movers only
        self._own = np.zeros(cap, bool)
        self._cell = np.zeros(cap, np.int64)
        self._known = np.zeros(cap, bool)
        # the held positions sorted by index cell, both ways, kept across batches (roam_index.py)
        self._files = CellFiles(self._index.side, cap)
        self._extra: list[Mapping[str, Any] | None] = []
        self._subs: dict[str, Subscription] = {}
        self._radii: dict[str, dict[str, float]] = {}  # object -> its subscriptions' radii
        self._r_max: float | None = None
        self._filters: dict[tuple[str, str, tuple[filters.Clause, ...]], _Filter] = {}
        self._csr: tuple[I64, I64, F64, I64, list[str]] | None = None  # by subscriber slot

    # -- definitions -------------------------------------------------------------------------

    def add(self, sub: Subscription) -> None:
        old = self._subs.get(sub.id)
        self._subs[sub.id] = sub
        if old is not None:
            self._radii[old.object].pop(sub.id, None)
        self._radii.setdefault(sub.object, {})[sub.id] = sub.radius_m
        self._r_max = None
        key = sub.filter_key
        if key not in self._filters:
            f = _Filter(*key)
            f.grow(self._ids, 0, self._lon.size)
            if f.where:  # from the fields of the positions held
                f.passes[: len(self._ids)] = f.of(self._ids, self._extra)
            self._filters[key] = f
        self._csr = None
        self._set_rmax(self._slot_of(sub.object))
        if old is not None and old.object != sub.object:
            self._set_rmax(self._slot_of(old.object))

    def remove(self, sub_id: str) -> Subscription | None:
        sub = self._subs.pop(sub_id, None)
        if sub is not None:
            self._radii[sub.object].pop(sub_id, None)
            self._r_max = None
            self._csr = None
            self._set_rmax(self._slot_of(sub.object))
        return sub

    def subscriptions(self) -> list[Subscription]:
        return sorted(self._subs.values(), key=lambda s: s.id)

    def _set_rmax(self, slot: int) -> None:
        self._rmax[slot] = max(self._radii.get(self._ids[slot], {}).values(), default=0.0)

    def max_radius(self) -> float:
        if self._r_max is None:
            self._r_max = max((s.radius_m for s in self._subs.values()), default=0.0)
        return self._r_max

    # -- state -------------------------------------------------------------------------------

    def held(self) -> dict[str, tuple[float, float]]:
        """Object -> the position this worker holds."""
        n = len(self._ids)
        at = np.flatnonzero(~np.isnan(self._lon[:n]))
        return {self._ids[i]: (float(self._lon[i]), float(self._lat[i])) for i in at.tolist()}

    def near_pairs(self) -> set[tuple[str, str]]:
        """(subscription, object) pairs near now whose report falls to this worker."""
        return {(sub.id, self._ids[b]) for sub in self._subs.values() for b in self._near(sub)}

    def _near(self, sub: Subscription) -> dict[int, float]:
        """The slots near `sub` now whose report falls to this worker, with their distances."""
        s = self._slot.get(sub.object)
        n = len(self._ids)
        if s is None or np.isnan(self._lon[s]):
            return {}
        at = np.flatnonzero(~np.isnan(self._lon[:n]))
        f = self._filters[sub.filter_key]
        at = at[f.passes[at] & (at != s)]
        d = distances_m(self._lon[s], self._lat[s], self._lon[at], self._lat[at])
        near = d <= sub.radius_m
        at, d = at[near], d[near]
        own = self._owned(self._lon[at], self._lat[at])
        return dict(zip(at[own].tolist(), d[own].tolist(), strict=True))

    # -- definitions in the stream -----------------------------------------------------------

    def put(self, sub: Subscription, ts: float,
            at: tuple[float, float, Mapping[str, Any] | None] | None = None, seq: int = 0) -> list[RoamEvent]:
        """A subscription defined or changed at `ts` in the stream; `at` is its object's latest
        position as the router knows it (None: not seen yet). The pairs near now (this
        worker's share) that were not under the old definition are `nearby`, those no longer
        near `faraway`, dated `ts`; `seq` (the stored change's number) tells two changes at
        one ts apart in the event ids. The same definition again changes nothing."""
        old = self._subs.get(sub.id)
        if old == sub:
            return []
        before = self._near(old) if old is not None else {}
        if old is not None and old.point is not None and old.object != sub.object:
            gone = self._slot[old.object]  # a fixed point's subscriber, replaced by an object
            self._lon[gone] = self._lat[gone] = np.nan
        if at is not None:
            slot = self._slot_of(sub.object)
            self._place(np.array([slot]), np.array([at[0]]), np.array([at[1]]), [at[2]])
        self.add(sub)
        if at is not None:
            self._keep(np.array([self._slot[sub.object]]))
        after = self._near(sub)
        mover, lon, lat = f"put#{seq}:{sub.object}", at[0] if at else math.nan, at[1] if at else math.nan
        out = []
        for kind, slots in (("faraway", sorted(set(before) - set(after))),
                            ("nearby", sorted(set(after) - set(before)))):
            for b in slots:
                obj = self._ids[b]
                d = after.get(b, before.get(b, math.nan)) if kind == "nearby" else self._distance(sub, b)
                out.append(RoamEvent(kind, sub.id, sub.object, obj, d, ts,
                                     roam_event_id(sub.id, obj, kind, ts, mover, lon, lat)))
        return out

    def drop(self, sub_id: str) -> None:
        """A subscription deleted: it reports nothing more (no `faraway` for its near pairs:
        whoever deleted it asked for silence)."""
        sub = self.remove(sub_id)
        if sub is not None:
            s = self._slot[sub.object]
            if sub.point is not None:  # a fixed point's subscriber goes with it
                self._lon[s] = self._lat[s] = np.nan
            elif not np.isnan(self._lon[s]):
                self._keep(np.array([s]))

    def _distance(self, sub: Subscription, b: int) -> float:
        s = self._slot[sub.object]
        return float(distances_m(self._lon[s], self._lat[s], self._lon[b:b + 1], self._lat[b:b + 1])[0])

    def _place(self, slots: I64, lon: F64, lat: F64, extras: Sequence[Mapping[str, Any] | None]) -> None:
        """Positions set as they are (no event): held, with their fields and filter flags."""
        self._lon[slots], self._lat[slots] = lon, lat
        self._known[slots] = False
        for s, e in zip(slots.tolist(), extras, strict=True):
            self._extra[s] = e
        names = [self._ids[s] for s in slots.tolist()]
        for f in self._filters.values():
            if f.where:
                f.passes[slots] = f.of(names, extras)

    # -- durable form ------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The whole state as plain data (held positions, their fields, the subscriptions)."""
        n = len(self._ids)
        at = np.flatnonzero(~np.isnan(self._lon[:n]))
        return {"ids": [self._ids[i] for i in at.tolist()],
                "lon": self._lon[at].astype("<f8").tobytes(), "lat": self._lat[at].astype("<f8").tobytes(),
                "extra": [self._extra[i] for i in at.tolist()],
                "subs": [s.to_wire() for s in self.subscriptions()]}

    def load(self, data: Mapping[str, Any]) -> None:
        """Replace the state with a snapshot's (ValueError if it does not fit together)."""
        ids = list(data["ids"])
        lon = np.frombuffer(data["lon"], "<f8").astype(np.float64)
        lat = np.frombuffer(data["lat"], "<f8").astype(np.float64)
        extra = list(data["extra"])
        if not len(ids) == lon.size == lat.size == len(extra) or len(set(ids)) != len(ids):
            raise ValueError(f"roaming state: {len(ids)} ids, {lon.size} / {lat.size} positions, "
                             f"{len(extra)} fields")
        subs = [Subscription.from_wire(d) for d in data["subs"]]
        self._reset()
        for sub in subs:
            self.add(sub)
        if ids:
            self._place(np.fromiter((self._slot_of(o) for o in ids), np.int64, len(ids)), lon, lat, extra)

    def _slot_of(self, obj: str) -> int:
        s = self._slot.get(obj)
        if s is not None:
            return s
        s = len(self._ids)
        self._slot[obj] = s
        self._ids.append(obj)
        self._extra.append(None)
        if s >= self._lon.size:
            cap = 2 * self._lon.size
            for name, fill in (("_lon", np.nan), ("_lat", np.nan), ("_rmax", 0.0), ("_own", False),
                               ("_cell", 0), ("_known", False)):
                a = getattr(self, name)
                b = np.full(cap, fill, a.dtype)
                b[: a.size] = a
                setattr(self, name, b)
            self._files.grow(cap)
            for f in self._filters.values():
                f.grow(self._ids, s, cap)
        else:
            for f in self._filters.values():
                if not f.where:
                    f.passes[s] = f.by_id([obj])[0]
        return s

    def _owned(self, lon: F64, lat: F64) -> B:
        out: B = self.owners.of(self.grid.point_keys(lon, lat)) == self.me
        return out

    def _subs_csr(self) -> tuple[I64, I64, F64, I64, list[str]]:
        """Subscriptions by subscriber slot: (ptr over slots, sub number, radius, filter number, ids)."""
        if self._csr is not None and self._csr[0].size < len(self._ids) + 1:
            # slots added since (objects seen): no subscription is theirs (`add` clears the cache)
            ptr = self._csr[0]
            grown = np.concatenate([ptr, np.full(len(self._ids) + 1 - ptr.size, ptr[-1])])
            self._csr = (grown, *self._csr[1:])
        if self._csr is None:
            fnum = {k: i for i, k in enumerate(self._filters)}
            subs = sorted(self._subs.values(), key=lambda s: (self._slot[s.object], s.id))
            slot = np.array([self._slot[s.object] for s in subs], np.int64)
            ptr = np.searchsorted(slot, np.arange(len(self._ids) + 1)).astype(np.int64)
            self._csr = (ptr, np.arange(len(subs), dtype=np.int64),
                         np.array([s.radius_m for s in subs], np.float64),
                         np.array([fnum[s.filter_key] for s in subs], np.int64),
                         [s.id for s in subs])
        return self._csr

    # -- the stream --------------------------------------------------------------------------

    def apply(self, ids: Sequence[str], lon: F64, lat: F64, ts: F64, prev_lon: F64, prev_lat: F64,
              extra: Sequence[Mapping[str, Any] | None] | None = None,
              prev_extra: Sequence[Mapping[str, Any] | None] | None = None) -> list[RoamEvent]:
        """The rows this worker was sent, in order (with each object's previous position and
        extra fields, as the router sends them): the events it reports, in row order."""
        m = len(ids)
        if m == 0:
            return []
        ms = np.fromiter((self._slot_of(o) for o in ids), np.int64, m)
        ex: Sequence[Mapping[str, Any] | None] = extra if extra else [None] * m
        pex: Sequence[Mapping[str, Any] | None] = prev_extra if prev_extra else [None] * m
        filt = list(self._filters.values())
        # filter flags before and after each row, from the row (a worker that did not hold the
        # object has no flag of its own to go by)
        names = [self._ids[s] for s in ms.tolist()]
        old_pass = [f.of(names, pex) if f.where else f.passes[ms] for f in filt]
        new_pass = [f.of(names, ex) if f.where else f.passes[ms] for f in filt]
        events = (self._pairs(ms, lon, lat, ts, prev_lon, prev_lat, old_pass, new_pass, ex)
                  if self._subs else [])
        # each object's last row is its new state; then what this worker keeps
        by_slot = np.lexsort((np.arange(m), ms))
        last_of = np.ones(m, bool)
        last_of[:-1] = ms[by_slot[1:]] != ms[by_slot[:-1]]
        last = by_slot[last_of]
        s = ms[last]
        self._lon[s], self._lat[s] = lon[last], lat[last]
        self._known[s] = False
        for f, p in zip(filt, new_pass, strict=True):
            f.passes[s] = p[last]
        for slot, r in zip(s.tolist(), last.tolist(), strict=True):
            self._extra[slot] = ex[r]
        self._keep(s)
        return events

    def apply_run(self, parts: Sequence[Rows]) -> list[RoamEvent]:
        """Consecutive `rows` messages in one call, those applied already left out (their marks
        are not past this matcher's: a redelivery)."""
        return [e for got in self.apply_sliced(parts, 0) for e in got]

    def apply_sliced(self, parts: Sequence[Rows], size: int = SLICE_ROWS) -> Iterator[list[RoamEvent]]:
        """`apply_run` a slice of `size` rows at a time (0: all at once), the events of each
        slice as it is applied: the same events as in one call (the batch's rows in order),
        and the caller may give its event loop back between slices. The mark is the last
        message's once every slice is applied."""
        fresh = [p for p in parts if p.mark is None or p.mark > self.mark]
        if not fresh:
            return
        rows = Rows.concat(fresh)
        n = len(rows.batch)
        step = size or max(n, 1)
        for lo in range(0, n, step):
            yield self.apply_rows(rows.slice(lo, lo + step) if step < n else rows)
        if fresh[-1].mark is not None:
            self.mark = fresh[-1].mark

    def apply_rows(self, rows: Rows) -> list[RoamEvent]:
        b = rows.batch
        return self.apply(b.ids, b.lon, b.lat, b.ts, rows.prev_lon, rows.prev_lat, b.extra or None,
                          rows.prev_extra)

    def _keep(self, ms: I64) -> None:
        """Of these slots' positions, drop those this worker will get no news of: neither in
        its blocks nor a subscriber whose box reaches them (BlockOwners.box_workers, the
        router's rule)."""
        lon, lat = self._lon[ms], self._lat[ms]
        keep = self._owned(lon, lat)
        r = self._rmax[ms]
        sub = np.flatnonzero(~keep & (r > 0))
        if sub.size:
            row, worker = self.owners.box_workers(lon[sub], lat[sub], r[sub])
            keep[sub[np.unique(row[worker == self.me])]] = True
        gone = ms[~keep]
        self._lon[gone] = np.nan
        self._lat[gone] = np.nan

    def _boxes(self, lon: F64, lat: F64, radius: F64, rows: I64, q: I64, b: int) -> None:
        """Box `b` of the given rows (index cells of the circles' bounding boxes)."""
        if rows.size:
            q[rows, b] = np.stack(self._index.boxes(lon[rows], lat[rows], radius[rows]), axis=1)

    def _pairs(self, ms: I64, nlon: F64, nlat: F64, ts: F64, olon: F64, olat: F64,
               old_pass: list[B], new_pass: list[B],
               extra: Sequence[Mapping[str, Any] | None]) -> list[RoamEvent]:
        n, m = len(self._ids), ms.size
        grid = self._index
        side = grid.side
        big = np.iinfo(np.int64).max
        rows = np.arange(m, dtype=np.int64)
        # each row's next row of the same object, and each object's first row
        by_slot = np.lexsort((rows, ms))
        same = ms[by_slot[1:]] == ms[by_slot[:-1]]
        nxt = np.full(m, big, np.int64)
        nxt[by_slot[:-1][same]] = by_slot[1:][same]
        first = np.ones(m, bool)
        first[by_slot[1:][same]] = False
        held_mask = ~np.isnan(self._lon[:n])
        held = np.flatnonzero(held_mask)
        new = held[~self._known[held]]
        if new.size:  # positions set since their owner and cell were computed
            self._own[new] = self._owned(self._lon[new], self._lat[new])
            cx, cy = grid.cells(self._lon[new], self._lat[new])
            self._cell[new] = cx * side + cy
            self._known[new] = True
        self._files.refile(n, held_mask, self._cell)
        had = ~np.isnan(olon)
        hr = np.flatnonzero(had)
        hk = np.flatnonzero(had & first)  # each moving object's place before its first row
        # entries: the slots (entry = slot; the held ones are filed, see refile), each moving
        # object's place before its first row, each row's new place; entry i is where its
        # object is for the rows k in (e_from, e_to): a moving object's held place never (its
        # rows carry its places, as the router knows them)
        e_slot = np.concatenate([np.arange(n, dtype=np.int64), ms[hk], ms])
        e_row = np.concatenate([np.full(n, -1, np.int64), hk, rows])
        e_ver = np.concatenate([np.zeros(n + hk.size, np.uint8), np.ones(m, np.uint8)])
        e_from = np.concatenate([np.full(n + hk.size, -1, np.int64), rows])
        to_held = np.full(n, big, np.int64)
        to_held[ms] = -1
        e_to = np.concatenate([to_held, hk, nxt])
        e_lon = np.concatenate([self._lon[:n], olon[hk], nlon])
        e_lat = np.concatenate([self._lat[:n], olat[hk], nlat])
        m_own_new = self._owned(nlon, nlat)
        m_own_old = np.zeros(m, bool)
        m_own_old[hr] = self._owned(olon[hr], olat[hr])
        e_own = np.concatenate([self._own[:n], m_own_old[hk], m_own_new])
        mx, my = grid.cells(np.concatenate([olon[hk], nlon]), np.concatenate([olat[hk], nlat]))
        b_cell = mx * side + my
        e_cell = np.concatenate([self._cell[:n], b_cell])
        # the indexes: the filed held positions merged with the batch's places (a sort of the
        # batch's, none of the held), every entry (`a`) and the subscribers' (`s`)
        ax_key, ax_ent, ay_key, ay_ent = self._files.with_batch(n, b_cell, my * side + mx)
        ptr, _, radius, fnum, sub_ids = self._subs_csr()
        subscriber = (ptr[1:] > ptr[:-1])[e_slot]
        sx, sy = subscriber[ax_ent], subscriber[ay_ent]
        # per mover: its own largest circle at its new and old place (against every entry),
        # the largest circle of any subscriber at both (against the subscribers' entries)
        q = np.zeros((m, 4, 4), np.int64)
        q[:, :, 0] = 1  # x0 > x1: no box
        r_own = self._rmax[ms]
        r_any = np.full(m, self.max_radius())
        self._boxes(nlon, nlat, r_own, np.flatnonzero(r_own > 0), q, 0)
        self._boxes(olon, olat, r_own, np.flatnonzero(had & (r_own > 0)), q, 1)
        self._boxes(nlon, nlat, r_any, rows, q, 2)
        self._boxes(olon, olat, r_any, hr, q, 3)
        filt = list(self._filters.values())
        f_n = max(len(filt), 1)
        pass_held = np.stack([f.passes[:n] for f in filt]) if filt else np.zeros((1, n), bool)
        pass_old = np.stack(old_pass) if filt else np.zeros((f_n, m), bool)
        pass_new = np.stack(new_pass) if filt else np.zeros((f_n, m), bool)
        out = kernel.roam_pairs(
            n, side, self.max_radius(), m_slot=ms, m_olon=olon, m_olat=olat, m_nlon=nlon, m_nlat=nlat,
            m_rmax=r_own, m_had_old=had, m_own_old=m_own_old, m_own_new=m_own_new, q=q,
            e_cell=e_cell, e_slot=e_slot, e_row=e_row, e_from=e_from, e_to=e_to, e_lon=e_lon, e_lat=e_lat,
            e_ver=e_ver, e_own=e_own, ax_key=ax_key, ax_ent=ax_ent, ay_key=ay_key, ay_ent=ay_ent,
            sx_key=ax_key[sx], sx_ent=ax_ent[sx], sy_key=ay_key[sy], sy_ent=ay_ent[sy], s_ptr=ptr,
            s_filter=fnum, s_radius=radius, pass_held=pass_held, pass_old=pass_old, pass_new=pass_new)
        searches, looked = out["work"]
        self.work = (self.work[0] + searches, self.work[1] + looked)
        k, j, i, fl, d = out["k"], out["j"], out["i"], out["flags"], out["d"]
        side_a = (fl & 1).astype(bool)
        near = (fl & 2).astype(bool)
        keep = np.ones(k.size, bool)
        u = np.flatnonzero(fl & 4)
        if u.size:  # within a micrometre of a radius: decided with the same haversine as the reference
            ku, iu, r = k[u], i[u], radius[j[u]]
            dn = distances_m(nlon[ku], nlat[ku], e_lon[iu], e_lat[iu])
            dw = distances_m(olon[ku], olat[ku], e_lon[iu], e_lat[iu])
            was = (fl[u] & 8).astype(bool) & (dw <= r)
            now = (fl[u] & 16).astype(bool) & (dn <= r)
            own = np.where(side_a[u], e_own[iu], np.where(now, m_own_new[ku], m_own_old[ku]))
            keep[u] = (was != now) & own
            near[u], d[u] = now, dn
        k, j, i, side_a, near, d = k[keep], j[keep], i[keep], side_a[keep], near[keep], d[keep]
        x = e_slot[i]
        a_slot = np.where(side_a, ms[k], x)
        b_slot = np.where(side_a, x, ms[k])
        order = np.lexsort((j, d, k))
        if not order.size:
            return []
        # the events as columns, each text made once per row / subscription / object (a crowd
        # landing on subscribers makes tens of thousands of events in one batch)
        ids = self._ids
        rows_k = k[order]
        rows = np.unique(rows_k).tolist()
        tss, lons, lats = ts.tolist(), nlon.tolist(), nlat.tolist()
        update = dict.fromkeys(rows, "")
        for r in rows:
            update[r] = update_key(tss[r], ids[int(ms[r])], lons[r], lats[r], fields_key(extra[r]))
        kinds = ["nearby" if x else "faraway" for x in near[order].tolist()]
        subs = [sub_ids[x] for x in j[order].tolist()]
        objs = [ids[x] for x in b_slot[order].tolist()]
        rk = rows_k.tolist()
        eids = [pair_event_id(s, o, kd, update[r]) for s, o, kd, r in zip(subs, objs, kinds, rk, strict=True)]
        return list(map(RoamEvent._make, zip(kinds, subs, [ids[x] for x in a_slot[order].tolist()], objs,
                                             d[order].tolist(), [tss[r] for r in rk], eids, strict=True)))


# --------------------------------------------------------------------------- the wire


def matcher_of(msg: Mapping[str, Any], worker: str) -> RoamMatcher:
    """The matcher a `sync` message (or a snapshot, the same form) describes for `worker`."""
    ring = HashRing.from_dict(msg["ring"])
    if worker not in ring:
        raise ValueError(f"roaming state for a ring without worker {worker!r}")
    grid = RoamGrid(int(msg["level"]), int(msg["block_bits"]))
    names = list(ring.nodes)
    m = RoamMatcher(grid, BlockOwners(grid, names, ring.nodes_for_many), names.index(worker))
    m.ring = msg["ring"]
    m.load(msg["state"])
    m.mark = mark_of(msg) or (0, 0)
    return m


def step(matcher: RoamMatcher | None, msg: Mapping[str, Any], worker: str) -> tuple[RoamMatcher | None,
                                                                                 list[RoamEvent]]:
    """One message of the router (exchanges/roam_routing.py) applied: the matcher after it and
    the events it reports. ValueError / KeyError / TypeError for a message that does not fit."""
    op = msg["op"]
    mark = mark_of(msg)
    if matcher is not None and mark is not None and mark <= matcher.mark:
        return matcher, []  # applied already (a redelivery): see RoamStream's marks
    if op == "sync":
        return matcher_of(msg, worker), []
    if matcher is None:
        raise ValueError(f"a roaming {op!r} before any sync")
    if op == "rows":
        events = matcher.apply_rows(Rows.of(msg))
    elif op == "put":
        at = msg.get("at")
        where = None if at is None else (float(at[0]), float(at[1]), at[2])
        events = matcher.put(Subscription.from_wire(msg["sub"]), float(msg["ts"]), where,
                             int(msg.get("seq", 0)))
    elif op == "drop":
        matcher.drop(str(msg["id"]))
        events = []
    else:
        raise ValueError(f"unknown roaming op {op!r}")
    if mark is not None:
        matcher.mark = mark
    return matcher, events


def snapshot_of(matcher: RoamMatcher) -> dict[str, Any]:
    """The matcher as a `sync` message's fields (what `matcher_of` reads back)."""
    return {"level": matcher.grid.level, "block_bits": matcher.grid.block_bits, "ring": matcher.ring,
            "state": matcher.snapshot(), "mark": list(matcher.mark)}
