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

A batch is evaluated in segments in which no object repeats, each segment at once: a pair
touched at row k uses the other object's position as of k (its row's new position if that row
came before k in the segment, its previous one otherwise).

Trade-off: candidates come from a grid over the cells, rebuilt per segment (a sort of the held
positions), and every candidate's distance is computed: no incremental index to keep right, at
the price of a sort per batch and of the candidates in a circle's box (about 3x the circle).
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from exchanges import filters
from exchanges.batch import PositionBatch
from exchanges.hash_ring import HashRing
from exchanges.roam_cells import BlockOwners, RoamGrid, distances_m, unique_pairs
from exchanges.subscriptions import Subscription

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class RoamEvent:
    kind: str  # "nearby" | "faraway"
    subscription: str
    subscriber: str
    object: str
    distance_m: float  # after the update
    ts: float
    id: str

    def key(self) -> tuple[str, str, str, float]:
        return (self.subscription, self.object, self.kind, self.ts)

    def to_json(self) -> dict[str, Any]:
        return {"event": self.kind, "subscription": self.subscription, "subscriber": self.subscriber,
                "object": self.object, "distance_m": round(self.distance_m, 3), "ts": self.ts,
                "event_id": self.id}


def roam_event_id(subscription: str, obj: str, kind: str, ts: float, mover: str, lon: float,
                  lat: float) -> str:
    """Stable over replays: the pair, the kind and the update that caused it (who moved, when, where)."""
    text = f"{subscription}\x1f{obj}\x1f{kind}\x1f{ts!r}\x1f{mover}\x1f{lon!r}\x1f{lat!r}"
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


class _Filter:
    """One (match, where) pair shared by subscriptions; per object slot whether it passes."""

    def __init__(self, match: str, where: tuple[filters.Clause, ...]) -> None:
        self.match, self.where = match, where
        self.passes = np.zeros(0, bool)

    def grow(self, ids: Sequence[str], start: int, cap: int) -> None:
        p = np.zeros(cap, bool)
        p[: self.passes.size] = self.passes[: cap]
        if not self.where:
            m = self.match
            p[start:len(ids)] = [m == "*" or fnmatch.fnmatchcase(i, m) for i in ids[start:]]
        self.passes = p

    def of(self, ids: Sequence[str], extras: Sequence[Mapping[str, Any] | None]) -> B:
        ok = np.array([self.match == "*" or fnmatch.fnmatchcase(i, self.match) for i in ids], bool)
        return ok & filters.matches(self.where, extras)


class RoamMatcher:
    """One worker's share of the proximity subscriptions: the positions it holds (objects in
    its blocks, subscribers whose circles touch them) and the subscriptions themselves."""

    def __init__(self, grid: RoamGrid, owners: BlockOwners, me: int) -> None:
        self.grid, self.owners, self.me = grid, owners, me
        self.ring: Any = None  # the ring as the router sent it (to_dict), kept for snapshots
        self._reset()

    def _reset(self) -> None:
        self._slot: dict[str, int] = {}
        self._ids: list[str] = []
        cap = 1024
        self._lon = np.full(cap, np.nan)
        self._lat = np.full(cap, np.nan)
        self._rmax = np.zeros(cap)
        self._extra: list[Mapping[str, Any] | None] = []
        self._subs: dict[str, Subscription] = {}
        self._filters: dict[tuple[str, tuple[filters.Clause, ...]], _Filter] = {}
        self._csr: tuple[I64, I64, F64, I64, list[str]] | None = None  # by subscriber slot

    # -- definitions -------------------------------------------------------------------------

    def add(self, sub: Subscription) -> None:
        old = self._subs.get(sub.id)
        self._subs[sub.id] = sub
        key = (sub.match, sub.where)
        if key not in self._filters:
            f = _Filter(sub.match, sub.where)
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
            self._csr = None
            self._set_rmax(self._slot_of(sub.object))
        return sub

    def subscriptions(self) -> list[Subscription]:
        return sorted(self._subs.values(), key=lambda s: s.id)

    def _set_rmax(self, slot: int) -> None:
        obj = self._ids[slot]
        self._rmax[slot] = max((s.radius_m for s in self._subs.values() if s.object == obj), default=0.0)

    def max_radius(self) -> float:
        return max((s.radius_m for s in self._subs.values()), default=0.0)

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
        f = self._filters[(sub.match, sub.where)]
        at = at[f.passes[at] & (at != s)]
        d = distances_m(self._lon[s], self._lat[s], self._lon[at], self._lat[at])
        near = d <= sub.radius_m
        at, d = at[near], d[near]
        own = self._owned(self._lon[at], self._lat[at])
        return dict(zip(at[own].tolist(), d[own].tolist(), strict=True))

    # -- definitions in the stream -----------------------------------------------------------

    def put(self, sub: Subscription, ts: float,
            at: tuple[float, float, Mapping[str, Any] | None] | None = None) -> list[RoamEvent]:
        """A subscription defined or changed at `ts` in the stream; `at` is its object's latest
        position as the router knows it (None: not seen yet). The pairs near now (this
        worker's share) that were not under the old definition are `nearby`, those no longer
        near `faraway`, dated `ts`. The same definition again changes nothing."""
        old = self._subs.get(sub.id)
        if old == sub:
            return []
        before = self._near(old) if old is not None else {}
        if at is not None:
            slot = self._slot_of(sub.object)
            self._place(np.array([slot]), np.array([at[0]]), np.array([at[1]]), [at[2]])
        self.add(sub)
        if at is not None:
            self._keep(np.array([self._slot[sub.object]]))
        after = self._near(sub)
        mover, lon, lat = f"put:{sub.object}", at[0] if at else math.nan, at[1] if at else math.nan
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
            if not np.isnan(self._lon[s]):
                self._keep(np.array([s]))

    def _distance(self, sub: Subscription, b: int) -> float:
        s = self._slot[sub.object]
        return float(distances_m(self._lon[s], self._lat[s], self._lon[b:b + 1], self._lat[b:b + 1])[0])

    def _place(self, slots: I64, lon: F64, lat: F64, extras: Sequence[Mapping[str, Any] | None]) -> None:
        """Positions set as they are (no event): held, with their fields and filter flags."""
        self._lon[slots], self._lat[slots] = lon, lat
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
            for name, fill in (("_lon", np.nan), ("_lat", np.nan), ("_rmax", 0.0)):
                a = getattr(self, name)
                b = np.full(cap, fill)
                b[: a.size] = a
                setattr(self, name, b)
            for f in self._filters.values():
                f.grow(self._ids, s, cap)
        else:
            for f in self._filters.values():
                if not f.where:
                    f.passes[s] = f.match == "*" or fnmatch.fnmatchcase(obj, f.match)
        return s

    def _owned(self, lon: F64, lat: F64) -> B:
        out: B = self.owners.of(self.grid.point_keys(lon, lat)) == self.me
        return out

    def _subs_csr(self) -> tuple[I64, I64, F64, I64, list[str]]:
        """Subscriptions by subscriber slot: (ptr over slots, sub number, radius, filter number, ids)."""
        if self._csr is None or self._csr[0].size != len(self._ids) + 1:
            fnum = {k: i for i, k in enumerate(self._filters)}
            subs = sorted(self._subs.values(), key=lambda s: (self._slot[s.object], s.id))
            slot = np.array([self._slot[s.object] for s in subs], np.int64)
            ptr = np.searchsorted(slot, np.arange(len(self._ids) + 1)).astype(np.int64)
            self._csr = (ptr, np.arange(len(subs), dtype=np.int64),
                         np.array([s.radius_m for s in subs], np.float64),
                         np.array([fnum[(s.match, s.where)] for s in subs], np.int64),
                         [s.id for s in subs])
        return self._csr

    # -- the stream --------------------------------------------------------------------------

    def apply(self, ids: Sequence[str], lon: F64, lat: F64, ts: F64, prev_lon: F64, prev_lat: F64,
              extra: Sequence[Mapping[str, Any] | None] | None = None,
              prev_extra: Sequence[Mapping[str, Any] | None] | None = None) -> list[RoamEvent]:
        """The rows this worker was sent, in order (with each object's previous position and
        extra fields, as the router sends them): the events it reports, in row order."""
        slots = np.fromiter((self._slot_of(o) for o in ids), np.int64, len(ids))
        ex: Sequence[Mapping[str, Any] | None] = extra if extra else [None] * len(ids)
        pex: Sequence[Mapping[str, Any] | None] = prev_extra if prev_extra else [None] * len(ids)
        events: list[RoamEvent] = []
        start, seen = 0, set[int]()
        for k, s in enumerate(slots.tolist()):
            if s in seen:
                events += self._segment(slots[start:k], lon[start:k], lat[start:k], ts[start:k],
                                        prev_lon[start:k], prev_lat[start:k], ex[start:k], pex[start:k])
                start, seen = k, set()
            seen.add(s)
        events += self._segment(slots[start:], lon[start:], lat[start:], ts[start:],
                                prev_lon[start:], prev_lat[start:], ex[start:], pex[start:])
        return events

    def _segment(self, ms: I64, nlon: F64, nlat: F64, ts: F64, olon: F64, olat: F64,
                 extra: Sequence[Mapping[str, Any] | None],
                 prev_extra: Sequence[Mapping[str, Any] | None]) -> list[RoamEvent]:
        m = ms.size
        if m == 0:
            return []
        filt = list(self._filters.values())
        # filter flags before and after each mover's row, from the row (a worker that did not
        # hold the object has no flag of its own to go by)
        names = [self._ids[s] for s in ms.tolist()]
        old_pass = [f.of(names, prev_extra) if f.where else f.passes[ms] for f in filt]
        new_pass = [f.of(names, extra) if f.where else f.passes[ms] for f in filt]
        events = self._pairs(ms, nlon, nlat, ts, olon, olat, old_pass, new_pass) if self._subs else []
        # the movers' new state, then what this worker keeps
        self._lon[ms], self._lat[ms] = nlon, nlat
        for f, p in zip(filt, new_pass, strict=True):
            f.passes[ms] = p
        for s, e in zip(ms.tolist(), extra, strict=True):
            self._extra[s] = e
        self._keep(ms)
        return events

    def _keep(self, ms: I64) -> None:
        lon, lat = self._lon[ms], self._lat[ms]
        keep = self._owned(lon, lat)
        r = self._rmax[ms]
        sub = np.flatnonzero(~keep & (r > 0))
        if sub.size:
            row, key = self.grid.box_keys(lon[sub], lat[sub], r[sub])
            mine = row[self.owners.of(key) == self.me]
            keep[sub[np.unique(mine)]] = True
        gone = ms[~keep]
        self._lon[gone] = np.nan
        self._lat[gone] = np.nan

    def _candidates(self, ms: I64, nlon: F64, nlat: F64, olon: F64, olat: F64) -> tuple[I64, I64]:
        """(k, slot): objects possibly within the largest radius of mover k, before or after."""
        n = len(self._ids)
        grid, side = self.grid, self.grid.side
        mover = np.zeros(n, bool)
        mover[ms] = True
        held = np.flatnonzero(~np.isnan(self._lon[:n]) & ~mover)
        had = np.flatnonzero(~np.isnan(olon))
        e_slot = np.concatenate([held, ms[had], ms])
        e_lon = np.concatenate([self._lon[held], olon[had], nlon])
        e_lat = np.concatenate([self._lat[held], olat[had], nlat])
        ex, ey = grid.cells(e_lon, e_lat)
        e_cell = ex * side + ey
        order = np.argsort(e_cell, kind="stable")
        e_cell, e_slot = e_cell[order], e_slot[order]
        q_row = np.concatenate([had, np.arange(ms.size, dtype=np.int64)])
        q_lon = np.concatenate([olon[had], nlon])
        q_lat = np.concatenate([olat[had], nlat])
        x0, x1, y0, y1 = grid.boxes(q_lon, q_lat, np.full(q_row.size, self.max_radius()))
        nx, ny = x1 - x0 + 1, y1 - y0 + 1
        cnt = nx * ny
        start = np.cumsum(cnt) - cnt
        j = np.arange(int(cnt.sum()), dtype=np.int64) - np.repeat(start, cnt)
        nxr = np.repeat(nx, cnt)
        cx = np.mod(np.repeat(x0, cnt) + j % nxr, side)
        cy = np.repeat(y0, cnt) + j // nxr
        qk, qc = unique_pairs(np.repeat(q_row, cnt), cx * side + cy)
        lo = np.searchsorted(e_cell, qc, "left")
        hi = np.searchsorted(e_cell, qc, "right")
        c = hi - lo
        hit = np.repeat(qk, c)
        st = np.cumsum(c) - c
        at = np.arange(int(c.sum()), dtype=np.int64) - np.repeat(st, c) + np.repeat(lo, c)
        k, x = unique_pairs(hit, e_slot[at])
        keep = x != ms[k]
        return k[keep], x[keep]

    def _pairs(self, ms: I64, nlon: F64, nlat: F64, ts: F64, olon: F64, olat: F64,
               old_pass: list[B], new_pass: list[B]) -> list[RoamEvent]:
        k, x = self._candidates(ms, nlon, nlat, olon, olat)
        if k.size == 0:
            return []
        n = len(self._ids)
        row_of = np.full(n, -1, np.int64)
        row_of[ms] = np.arange(ms.size)
        kx = row_of[x]
        xm = np.maximum(kx, 0)
        after = (kx >= 0) & (kx < k)  # the other object's row came first in the segment
        before = (kx >= 0) & (kx > k)
        x_lon = np.where(after, nlon[xm], np.where(before, olon[xm], self._lon[x]))
        x_lat = np.where(after, nlat[xm], np.where(before, olat[xm], self._lat[x]))
        filt = list(self._filters.values())
        x_pass = [np.where(after, new_pass[i][xm], np.where(before, old_pass[i][xm], f.passes[x]))
                  for i, f in enumerate(filt)]
        ptr, _, radius, fnum, sub_ids = self._subs_csr()
        out: list[tuple[int, str, str, str, float, bool]] = []
        # A: subscriptions on the mover, the other object is b; B: on the other object, the mover is b
        for side_a in (True, False):
            owner_slot = ms[k] if side_a else x
            cnt = ptr[owner_slot + 1] - ptr[owner_slot]
            c = np.repeat(np.arange(k.size), cnt)
            if c.size == 0:
                continue
            st = np.cumsum(cnt) - cnt
            j = np.arange(c.size, dtype=np.int64) - np.repeat(st, cnt) + np.repeat(ptr[owner_slot], cnt)
            kk, r, fn = k[c], radius[j], fnum[j]
            p_now = np.zeros(c.size, bool)
            p_was = np.zeros(c.size, bool)
            for i in range(len(filt)):
                sel = fn == i
                if side_a:
                    p_now[sel] = p_was[sel] = x_pass[i][c[sel]]
                else:
                    p_now[sel] = new_pass[i][kk[sel]]
                    p_was[sel] = old_pass[i][kk[sel]]
            d_now = distances_m(nlon[kk], nlat[kk], x_lon[c], x_lat[c])
            d_was = distances_m(olon[kk], olat[kk], x_lon[c], x_lat[c])
            near_now = p_now & (d_now <= r)
            near_was = p_was & (d_was <= r)  # NaN (no previous position) compares False
            ch = np.flatnonzero(near_now != near_was)
            if ch.size == 0:
                continue
            cc, kk, near = c[ch], kk[ch], near_now[ch]
            if side_a:  # b is the other object, which did not move
                own = self._owned(x_lon[cc], x_lat[cc])
            else:  # b is the mover: its cell after for nearby, before for faraway
                own = self._owned(np.where(near, nlon[kk], olon[kk]), np.where(near, nlat[kk], olat[kk]))
            for i in np.flatnonzero(own).tolist():
                kr, ci = int(kk[i]), int(cc[i])
                a_slot, b_slot = (ms[kr], x[ci]) if side_a else (x[ci], ms[kr])
                out.append((kr, sub_ids[int(j[ch[i]])], self._ids[int(a_slot)], self._ids[int(b_slot)],
                            float(d_now[ch[i]]), bool(near[i])))
        out.sort(key=lambda e: (e[0], e[4], e[1], e[3]))
        movers = [self._ids[s] for s in ms.tolist()]
        return [RoamEvent("nearby" if near else "faraway", sid, a, b, d, float(ts[kr]),
                          roam_event_id(sid, b, "nearby" if near else "faraway", float(ts[kr]), movers[kr],
                                        float(nlon[kr]), float(nlat[kr])))
                for kr, sid, a, b, d, near in out]


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
    return m


def step(matcher: RoamMatcher | None, msg: Mapping[str, Any], worker: str) -> tuple[RoamMatcher | None,
                                                                                 list[RoamEvent]]:
    """One message of the router (exchanges/roam_routing.py) applied: the matcher after it and
    the events it reports. ValueError / KeyError / TypeError for a message that does not fit."""
    op = msg["op"]
    if op == "sync":
        return matcher_of(msg, worker), []
    if matcher is None:
        raise ValueError(f"a roaming {op!r} before any sync")
    if op == "rows":
        b = PositionBatch.from_wire(msg["batch"])
        n = len(b)
        plon = np.frombuffer(msg["prev_lon"], "<f8").astype(np.float64)
        plat = np.frombuffer(msg["prev_lat"], "<f8").astype(np.float64)
        pex = list(msg["prev_extra"]) if msg.get("prev_extra") else None
        if plon.size != n or plat.size != n or (pex is not None and len(pex) != n):
            raise ValueError(f"roaming rows: previous positions / fields do not fit {n} rows")
        return matcher, matcher.apply(b.ids, b.lon, b.lat, b.ts, plon, plat, b.extra or None, pex)
    if op == "put":
        at = msg.get("at")
        where = None if at is None else (float(at[0]), float(at[1]), at[2])
        return matcher, matcher.put(Subscription.from_wire(msg["sub"]), float(msg["ts"]), where)
    if op == "drop":
        matcher.drop(str(msg["id"]))
        return matcher, []
    raise ValueError(f"unknown roaming op {op!r}")


def snapshot_of(matcher: RoamMatcher) -> dict[str, Any]:
    """The matcher as a `sync` message's fields (what `matcher_of` reads back)."""
    return {"level": matcher.grid.level, "block_bits": matcher.grid.block_bits, "ring": matcher.ring,
            "state": matcher.snapshot()}
