"""Which workers see a position, for proximity subscriptions (pure; see exchanges/roam_cells.py).

A row goes to the owners of:
- its object's cell, now and at the object's previous position (the publisher side: the worker
  that owned the old cell learns the object left, and reports what that ends);
- when the object carries subscriptions, every block its largest circle's box touches, now and
  at the previous position with the radius it had then (the subscriber side); a box over more
  than `BlockOwners.WIDE_BLOCKS` blocks goes to every worker (roam_cells.py).
A far jump is two places, not the area between them: a row costs the blocks of its two boxes.

Each row travels with its object's previous position and extra fields, so a worker that did not
hold the object can still tell what the move changed (fence/x_fence/roaming.py). Rows keep the batch's order
within each worker's share.

Trade-off: the router keeps every object's last position (a dict entry per object), which
x-geo holds anyway for queries; in exchange a worker never needs a position it was not sent.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from exchanges.batch import PositionBatch
from exchanges.roam_cells import BlockOwners, RoamGrid, unique_pairs
from exchanges.subscriptions import Subscription, is_point_object
from exchanges.tenancy import NO_TENANT, SEP, tenant_of

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class RoamRows:
    """One worker's share of a batch: row numbers (in order) and each row's previous position
    (NaN: the object had none) and extra fields."""

    rows: I64
    prev_lon: F64
    prev_lat: F64
    prev_extra: list[Mapping[str, Any] | None]

    def __len__(self) -> int:
        return int(self.rows.size)


class RoamRouter:
    def __init__(self, grid: RoamGrid, owners: BlockOwners) -> None:
        self.grid = grid
        self.owners = owners
        self._radius: dict[str, float] = {}  # subscriber object -> its largest radius
        # object -> (lon, lat, radius routed with, ts) of its last row routed
        self._last: dict[str, tuple[float, float, float, float]] = {}
        self._extra: dict[str, Mapping[str, Any]] = {}  # object -> extra fields of its last position

    def set_radius(self, obj: str, radius_m: float) -> None:
        """The largest radius of `obj`'s subscriptions (0: it has none), in force from now: the
        workers hold the object by it from the definition on, so its next row's old box is
        this one too."""
        if radius_m > 0:
            self._radius[obj] = float(radius_m)
        else:
            self._radius.pop(obj, None)
        last = self._last.get(obj)
        if last is not None:
            self._last[obj] = (last[0], last[1], float(radius_m), last[3])

    def radius(self, obj: str) -> float:
        return self._radius.get(obj, 0.0)

    def place(self, obj: str, lon: float, lat: float, ts: float) -> None:
        """`obj` is at (lon, lat) from now, with no row routed: a fixed point's synthetic
        subscriber, which the put message carries to every worker (`at`)."""
        self._last[obj] = (float(lon), float(lat), self.radius(obj), float(ts))

    def forget(self, obj: str) -> None:
        """`obj` is gone (a fixed point's subscriber, its subscription dropped)."""
        self._last.pop(obj, None)
        self._extra.pop(obj, None)
        self._radius.pop(obj, None)

    def last(self, obj: str) -> tuple[float, float, Mapping[str, Any] | None] | None:
        """The object's last position routed and its fields (None: not seen)."""
        p = self._last.get(obj)
        return None if p is None else (p[0], p[1], self._extra.get(obj))

    def positions(self) -> tuple[list[str], F64, list[Mapping[str, Any] | None]]:
        """Every object seen: ids, (n, 4) lon, lat, radius routed with, ts; fields."""
        ids = list(self._last)
        pos = np.array([self._last[o] for o in ids], np.float64).reshape(len(ids), 4)
        return ids, pos, [self._extra.get(o) for o in ids]

    def restore(self, ids: Sequence[str], pos: F64, extras: Sequence[Mapping[str, Any] | None]) -> None:
        """The memory `positions` gave (the radii come from set_radius)."""
        self._last = {o: (float(a), float(b), float(c), float(d))
                      for o, (a, b, c, d) in zip(ids, pos.tolist(), strict=True)}
        self._extra = {o: e for o, e in zip(ids, extras, strict=True) if e}

    def under(self, owners: BlockOwners) -> RoamRouter:
        """The same memory, another ring's owners."""
        r = RoamRouter(self.grid, owners)
        r._radius, r._last, r._extra = self._radius, self._last, self._extra
        return r

    def objects(self) -> list[str]:
        """Every object whose last position is kept."""
        return list(self._last)

    def __len__(self) -> int:
        return len(self._last)

    def route(self, ids: list[str], lon: F64, lat: F64, ts: F64 | None = None,
              extra: Sequence[Mapping[str, Any] | None] | None = None) -> dict[int, RoamRows]:
        """Worker number -> its rows of the batch. A row older than its object's last one
        routed (ts) is stale: it goes nowhere (a position that came late changes nothing,
        as on the fence path); one as old (a redelivery) goes as any other."""
        n = len(ids)
        prev_extra: list[Mapping[str, Any] | None] = [None] * n
        nan = math.nan
        plon, plat, prad = [nan] * n, [nan] * n, [0.0] * n  # the previous position (lists: numpy
        rads = [0.0] * n  # element writes cost ~1 us each, this loop runs per row)
        stale: list[int] = []
        last, radius, last_ex = self._last, self._radius, self._extra
        lons, lats = lon.tolist(), lat.tolist()
        tss = ts.tolist() if ts is not None else [-math.inf] * n
        ex = extra or [None] * n
        for i, o in enumerate(ids):
            p = last.get(o)
            if p is not None:
                if tss[i] < p[3]:
                    stale.append(i)
                    continue
                plon[i], plat[i], prad[i] = p[0], p[1], p[2]
            r = radius.get(o, 0.0)
            rads[i] = r
            last[o] = (lons[i], lats[i], r, tss[i])
            pe = prev_extra[i] = last_ex.get(o)
            e = ex[i]
            if e:
                last_ex[o] = e
            elif pe is not None:
                del last_ex[o]
        prev = np.array([plon, plat, prad]).T.reshape(n, 3)
        rad = np.array(rads)
        fresh = np.ones(n, bool)
        fresh[stale] = False
        had = ~np.isnan(prev[:, 0])
        grid, owners = self.grid, self.owners
        f = np.flatnonzero(fresh)
        h = np.flatnonzero(had)
        rows = [f, h]
        workers = [owners.of(grid.point_keys(lon[f], lat[f])),
                   owners.of(grid.point_keys(prev[h, 0], prev[h, 1]))]
        s = np.flatnonzero(rad > 0)
        if s.size:
            br, bw = owners.box_workers(lon[s], lat[s], rad[s])
            rows.append(s[br])
            workers.append(bw)
        ps = np.flatnonzero(had & (prev[:, 2] > 0))
        if ps.size:
            br, bw = owners.box_workers(prev[ps, 0], prev[ps, 1], prev[ps, 2])
            rows.append(ps[br])
            workers.append(bw)
        worker, row = unique_pairs(np.concatenate(workers), np.concatenate(rows))
        out: dict[int, RoamRows] = {}
        if row.size == 0:
            return out
        cuts = np.flatnonzero(np.diff(worker)) + 1
        for part in np.split(np.arange(row.size), cuts):
            rr = row[part]
            out[int(worker[part[0]])] = RoamRows(rr, prev[rr, 0], prev[rr, 1],
                                                 [prev_extra[i] for i in rr.tolist()])
        return out


# --------------------------------------------------------------------------- the stream


ROAM = "roam"  # the message kind on a worker's queue
DEFAULT_GRID = RoamGrid.for_radius(500.0)  # ~610 m cells; a larger radius spans more of them (still exact)


class RoamStream:
    """x-ingress's side of the proximity subscriptions: the definitions, the router, and the
    messages each worker gets, all in one order (the order x-ingress routes in), so a worker
    applies a definition exactly between the rows routed before it and the rows after it.

    Messages (dicts, `op`): `sync` (the ring, the grid and everything the worker should hold:
    its positions and the subscriptions; it replaces the worker's state), `put` (a subscription
    defined or changed, with its object's latest position), `drop`, `rows` (a batch's rows
    for that worker, each with its object's previous position and fields). fence/x_fence/
    roaming.py `step` applies them.

    Idle while no subscription exists: no row is routed and no position kept, so the fence path
    pays nothing for it. The first subscription starts from what comes after it: an object
    counts from its first position after that (nothing was near before, as nothing could be).
    The same per tenant: a subscription pairs only objects of its own tenant
    (exchanges/subscriptions.py), so only the rows of tenants with a subscription are routed
    and kept; a tenant's first subscription counts its objects from their next position, and
    its last one dropped forgets them (a sync), so the tenants that use proximity pay for it
    and the others do not.
    """

    def __init__(self, ring: Any, grid: RoamGrid = DEFAULT_GRID) -> None:
        self.grid = grid
        self.subs: dict[str, Subscription] = {}
        self.ring = ring
        self.router = RoamRouter(grid, BlockOwners(grid, list(ring.nodes), ring.nodes_for_many))
        # Every message carries `mark` [epoch, n]: n counts the router's steps (rows, put, drop,
        # sync; the same count when the journal is replayed), the epoch x-ingress's sessions.
        # A worker applies a message only if its mark is past the last one it applied: its own
        # redelivery (a step journaled, the ack lost) changes nothing, as a position at its
        # object's last ts changes nothing on the fence path. A session's sync is of a newer
        # epoch, so it is applied even when x-ingress restarted behind what a worker applied
        # (x-ingress then routes the lost batches again, with the same n).
        self.epoch = 0
        self.n = 0
        self._per_tenant: Counter[str] = Counter()  # tenant -> its subscriptions

    def _marked(self, msgs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        self.n += 1
        mark = [self.epoch, self.n]
        return {w: {**m, "mark": mark} for w, m in msgs.items()}

    def new_session(self) -> dict[str, dict[str, Any]]:
        """A session's first messages: a sync of a new epoch (see __init__); none while idle
        (the first subscription's sync will carry the new epoch). The caller journals the
        epoch before it sends them: a restart must not use an epoch twice."""
        self.epoch += 1
        return self.sync() if self.subs else {}

    def set_ring(self, ring: Any) -> None:
        """A new worker ring (exchanges.hash_ring.HashRing); the caller sends `sync` after it."""
        self.ring = ring
        self.router = self.router.under(BlockOwners(self.grid, list(ring.nodes), ring.nodes_for_many))

    @property
    def workers(self) -> list[str]:
        return self.router.owners.workers

    @property
    def active(self) -> bool:
        return bool(self.subs)

    @property
    def tenants(self) -> frozenset[str]:
        """The tenants with a subscription: only their objects' rows are routed."""
        return frozenset(self._per_tenant)

    def relevant(self, batch: PositionBatch) -> PositionBatch:
        """The rows of `batch` of tenants with a subscription (the batch itself when all are)."""
        if not self._per_tenant or not len(batch):
            return batch.take(np.empty(0, np.int64))
        tenants = self._per_tenant
        if len(tenants) == 1 and NO_TENANT not in tenants:  # one tenant: a prefix test per id
            prefix = next(iter(tenants)) + SEP
            keep = np.fromiter((i.startswith(prefix) for i in batch.ids), bool, len(batch))
        else:
            keep = np.fromiter((tenant_of(i) in tenants for i in batch.ids), bool, len(batch))
        return batch if keep.all() else batch.take(np.flatnonzero(keep))

    def _count(self, sub: Subscription, by: int) -> None:
        left = self._per_tenant[sub.tenant] + by
        if left > 0:
            self._per_tenant[sub.tenant] = left
        else:
            del self._per_tenant[sub.tenant]

    def _forget_tenant(self, tenant: str) -> None:
        """A tenant's last subscription gone: its objects' positions and fields forgotten."""
        r = self.router
        for obj in [o for o in r.objects() if not is_point_object(o) and tenant_of(o) == tenant]:
            r.forget(obj)

    def _radius_of(self, obj: str) -> float:
        return max((s.radius_m for s in self.subs.values() if s.object == obj), default=0.0)

    def put(self, sub: Subscription, ts: float, seq: int = 0) -> dict[str, dict[str, Any]]:
        """Messages for a subscription defined or changed at `ts` by stored change `seq` (the
        first one: a sync)."""
        first = not self.subs
        old = self.subs.get(sub.id)
        self.subs[sub.id] = sub
        self._count(sub, 1)
        if old is not None:
            self._count(old, -1)  # the same id: the same tenant
        for obj in {sub.object, *(() if old is None else (old.object,))}:
            self.router.set_radius(obj, self._radius_of(obj))
        if sub.point is not None:  # a fixed point: its subscriber stands there
            self.router.place(sub.object, sub.point[0], sub.point[1], ts)
        if old is not None and old.point is not None and sub.point is None:
            self.router.forget(old.object)
        if first:
            return self.sync()
        last = self.router.last(sub.object)
        at = None if last is None else list(last)
        msg = {"op": "put", "sub": sub.to_wire(), "ts": float(ts), "at": at, "seq": int(seq)}
        return self._marked({w: msg for w in self.workers})  # one message, the same for every worker

    def drop(self, sub_id: str, ts: float) -> dict[str, dict[str, Any]]:
        """Messages for a subscription deleted (the last one: a sync that empties every worker)."""
        sub = self.subs.pop(sub_id, None)
        if sub is None:
            return {}
        self._count(sub, -1)
        self.router.set_radius(sub.object, self._radius_of(sub.object))
        if sub.point is not None:
            self.router.forget(sub.object)
        if not self.subs:
            self.router = RoamRouter(self.grid, self.router.owners)
            return self.sync()
        if sub.tenant not in self._per_tenant:  # the workers forget the tenant's objects too
            self._forget_tenant(sub.tenant)
            return self.sync()
        return self._marked({w: {"op": "drop", "id": sub_id, "ts": float(ts)} for w in self.workers})

    def rows(self, batch: PositionBatch) -> dict[str, dict[str, Any]]:
        """Each worker's rows of a batch: those of tenants with a subscription (none while
        idle)."""
        if not self.subs or not len(batch):
            return {}
        batch = self.relevant(batch)
        if not len(batch):
            return {}
        out = {}
        shares = self.router.route(batch.ids, batch.lon, batch.lat, batch.ts, batch.extra or None)
        for w, share in shares.items():
            out[self.workers[w]] = {
                "op": "rows", "batch": batch.take(share.rows).to_wire(),
                "prev_lon": share.prev_lon.astype("<f8").tobytes(),
                "prev_lat": share.prev_lat.astype("<f8").tobytes(),
                "prev_extra": share.prev_extra if any(e is not None for e in share.prev_extra) else None}
        return self._marked(out)

    def sync(self) -> dict[str, dict[str, Any]]:
        """Per worker, everything it should hold: the positions of objects in its blocks and of
        subscribers whose circles touch them, and every subscription."""
        r = self.router
        ids, pos, extras = r.positions()
        n = len(ids)
        rad = np.array([r.radius(o) for o in ids], np.float64)
        home = r.owners.of(self.grid.point_keys(pos[:, 0], pos[:, 1]))
        pairs_w, pairs_row = [home], [np.arange(n, dtype=np.int64)]
        s = np.flatnonzero(rad > 0)
        if s.size:
            row, w = r.owners.box_workers(pos[s, 0], pos[s, 1], rad[s])
            pairs_w.append(w)
            pairs_row.append(s[row])
        worker, row = unique_pairs(np.concatenate(pairs_w), np.concatenate(pairs_row))
        subs = [v.to_wire() for _, v in sorted(self.subs.items())]
        out = {}
        for i, name in enumerate(self.workers):
            mine = row[worker == i]
            out[name] = {"op": "sync", "level": self.grid.level, "block_bits": self.grid.block_bits,
                         "ring": self.ring.to_dict(),
                         "state": {"ids": [ids[j] for j in mine.tolist()],
                                   "lon": pos[mine, 0].astype("<f8").tobytes(),
                                   "lat": pos[mine, 1].astype("<f8").tobytes(),
                                   "extra": [extras[j] for j in mine.tolist()], "subs": subs}}
        return self._marked(out)

    # -- durable form (x-ingress's journal) ---------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        ids, pos, extras = self.router.positions()
        return {"format": 2, "subs": [v.to_wire() for _, v in sorted(self.subs.items())], "ids": ids,
                "pos": pos.astype("<f8").tobytes(), "extra": extras, "mark": [self.epoch, self.n]}

    def load(self, data: Mapping[str, Any]) -> None:
        if data.get("format") != 2:
            raise ValueError(f"roaming router snapshot format {data.get('format')!r}, this code reads 2")
        self.subs = {d["id"]: Subscription.from_wire(d) for d in data["subs"]}
        self._per_tenant = Counter(s.tenant for s in self.subs.values())
        self.router = RoamRouter(self.grid, self.router.owners)
        ids = list(data["ids"])
        self.router.restore(ids, np.frombuffer(data["pos"], "<f8").reshape(len(ids), 4), list(data["extra"]))
        for s in self.subs.values():
            self.router.set_radius(s.object, self._radius_of(s.object))
        self.epoch, self.n = (int(x) for x in data.get("mark", (0, 0)))

    def replay(self, record: Mapping[str, Any]) -> None:
        """A journal record (`put`, `drop`, `rows` or a session's `epoch`, as x-ingress wrote
        them) applied again, its messages discarded (they were sent the first time)."""
        if "epoch" in record:
            self.epoch = int(record["epoch"])
            if self.subs:
                self.n += 1  # the session's sync, as `new_session` counted it
        elif "put" in record:
            self.put(Subscription.from_wire(record["put"]), float(record["ts"]), int(record.get("seq", 0)))
        elif "drop" in record:
            self.drop(str(record["drop"]), float(record["ts"]))
        else:
            self.rows(PositionBatch.from_wire(record["rows"]))
