"""x-geo: the "special fanout" exchange of one region, routing on the Hilbert index.

Bindings are fences' Hilbert ranges (clipped to the region by whoever binds them); `route`
takes a whole batch of positions and returns, per x-fence worker, the positions it must
see with their candidate fences (and whether the covering block is interior, so x-fence
can skip the exact polygon test). Fences are spread over workers by a consistent-hash ring.

Trade-off: x-geo remembers, per object, the workers it routed the object to last time
(a bitmask, one int per object). A position whose candidates no longer include a worker
that had the object is still sent there, with no candidates: that is the seed's *control*
message, and it lets the worker emit LEAVE at once instead of after a timeout. The memory
costs O(objects) here, and lets the workers stay free of any global view. It is not
persisted: with `announce_unknown` (the sidecar's setting) an object not seen since the
start (or since a session that ended with a batch unacked) goes to every worker once, so a
worker that had it from before still hears of it.

x-geo also keeps each object's latest position in the region (until a handover notice says
it left): when a fence changes here (`change`), the latest positions of the objects in its
old or new ranges go to its worker as *re-check* rows, right behind the definition, so the
worker decides who is inside the new geometry from where each object is now, not from the
last position it happened to be told (which, for an object that left its fences, can be
anywhere). Rows routed before the change were routed with the old binding and carry its
version; rows after it carry the new one. That is what makes a change exact against the
positions in flight: each position is in exactly one of "routed before" or "routed after",
and the re-check row is the latest of the first kind.

A handover notice (x-ingress: the object went to another region, here is its new position)
goes to *every* worker, flagged `notice`, and x-geo forgets the object. The notice only opens
gates (below): the region the object went to decides what it is in there, since an object's
first position in a region (its gate is its own ts) goes to every worker, each deciding from
it, as that region has the fences (one that had the object inside a fence elsewhere LEAVEs).
Every position carries, from x-ingress, a `gate`: the ts at which its object entered this region (0 if
unknown). A worker holds a position until it has seen the notice of the region the object
came from (notice ts >= gate), so the positions of one object reach its fences in time order
even though each region's stream to a worker is ordered only within itself; the notice
itself is gated on its own region's entry, which chains the regions an object went through.
x-geo passes gates on: they are x-ingress's memory, so a restarted x-geo loses none.

A hot fence (the ring's `hot`: N masters, exchanges/hash_ring.py) is judged by N workers,
each for its own objects: a candidate of such a fence goes to the master that owns the
object (the first of the fence's masters in the object's walk of the ring; each object's
walk is cached here as worker numbers, computed once per ring). Everything per fence that
went to its worker goes to each master instead: the definition (with the re-check rows of
that master's objects) and the delete. An object's memory of where it was routed works as
for any fence, since an object always goes to the same master of a fence.

CROSS (a fence's `cross`): x-geo keeps the bounding boxes of the fences that detect it, and
tests the segment from each object's position before (its row before in the batch, else the
latest remembered here) to the new one against them, all at once per batch; a fence whose box
the segment meets becomes a candidate of the new position (not interior), which then carries
the previous position to the worker (WorkerBatch.prev) for the exact test. Trade-off: only
segments within one region are tested (a segment whose ends are in two regions has its first
end in the other region's memory), and none longer than `CROSS_MAX_SEGMENT_DEG`.

Beside this module: the objects' latest positions (latest.py), the CROSS segment test
(crossings.py) and the Hilbert range index (range_index.py).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

import hilbert_c as hk
from exchanges.batch import PositionBatch
from exchanges.contract import InvalidMessage
from exchanges.fence_binding import INDEX_BITS, FenceBinding
from exchanges.object_codes import ObjectCodes, carry, distinct, grow
from exchanges.worker_batch import WorkerBatch
from exchanges.x_geo import queries
from exchanges.x_geo.crossings import with_crossings
from exchanges.x_geo.latest import LatestPositions
from exchanges.x_geo.range_index import Matches, RangeIndex

MAX_WORKERS = 63  # worker sets are bitmasks in an int64


def region_code(region: str) -> int:
    """A region's number in WorkerBatch.origin: stable without coordination, never 0."""
    return zlib.crc32(region.encode()) | (1 << 32)


class Ring(Protocol):
    def node_for(self, key: str) -> str: ...

    def masters(self, key: str) -> list[str]: ...

    def iter_nodes(self, key: str) -> Iterator[str]: ...


def dense_numbers(values: npt.NDArray[np.int32], bound: int) -> tuple[npt.NDArray[np.int64],
                                                                      npt.NDArray[np.int32]]:
    """(distinct values sorted, each value's number among them): np.unique with
    return_inverse, in linear time through a scratch array when the bound is not much
    larger than the input (numpy's unique sorts)."""
    if bound > 4 * values.size + 1024:
        uniq, inv = np.unique(values, return_inverse=True)
        return uniq.astype(np.int64), inv.astype(np.int32).reshape(-1)
    present = np.zeros(bound, dtype=bool)
    present[values] = True
    distinct = np.flatnonzero(present)
    number = np.empty(bound, dtype=np.int32)
    number[distinct] = np.arange(distinct.size, dtype=np.int32)
    return distinct, number[values]


def worker_sets(point: npt.NDArray[np.int64], worker: npt.NDArray[np.int64], n: int) -> npt.NDArray[np.int64]:
    """Per position of a batch of n, the bitmask of the workers of its matches (matches
    sorted by point)."""
    out = np.zeros(n, dtype=np.int64)
    if point.size:
        starts = np.flatnonzero(np.r_[True, point[1:] != point[:-1]])
        out[point[starts]] = np.bitwise_or.reduceat(np.left_shift(np.int64(1), worker), starts)
    return out


class XGeo:
    """The routing core of one x-geo instance (no I/O; see exchanges.contract)."""

    def __init__(self, region: str, workers: Sequence[str], ring: Ring, *,
                 announce_unknown: bool = False) -> None:
        if not workers or len(workers) > MAX_WORKERS or len(set(workers)) != len(workers):
            raise ValueError(f"1..{MAX_WORKERS} distinct workers, got {list(workers)}")
        self.region = region
        self.workers = list(workers)
        self._worker_index = {w: i for i, w in enumerate(self.workers)}
        self._ring = ring
        self._all = (1 << len(self.workers)) - 1
        self._origin = region_code(region)
        self.announce_unknown = announce_unknown  # an unseen object's first position: every worker
        self.create()

    # -- contract -------------------------------------------------------------------------

    def create(self) -> None:
        self._index = RangeIndex()
        self._versions: dict[str, int] = {}  # bound fences, and the last version of removed ones
        self._worker_of_slot = np.zeros(0, dtype=np.int64)  # the fence's (first) master
        self._masters_of_slot = np.zeros(0, dtype=np.int64)  # a hot fence's masters (bits), else 0
        self._version_of_slot = np.zeros(0, dtype=np.int64)
        # fences that detect CROSS: their bounding boxes, and (made when needed) the table the
        # segments are tested against (slots, boxes as columns x0, y0, x1, y1)
        self._cross: dict[str, tuple[float, float, float, float]] = {}
        self._cross_table: tuple[npt.NDArray[np.int32], npt.NDArray[np.float64]] | None = None
        self.forget_objects()

    def forget_objects(self) -> None:
        """Drop what is known of objects (the workers each was routed to, their latest
        positions): after a batch was routed and not delivered, its objects' memory is not to
        be trusted."""
        self._objects = ObjectCodes()
        self._last_mask = np.zeros(0, dtype=np.int64)  # object code -> workers routed to last
        # object code -> its latest position here and whether it is still here (latest.py)
        self._latest = LatestPositions()
        self.forget_walks()

    def forget_walks(self) -> None:
        """The objects' walks of the ring (worker numbers, in the order each object's walk
        meets them; -1 unknown): computed when an object first meets a hot fence."""
        self._walk = np.full((0, len(self.workers)), -1, np.int8)

    def delete(self) -> None:
        self.create()

    def validate(self, batch: PositionBatch) -> None:
        if len(batch) and (batch.h >= np.uint64(1 << (2 * INDEX_BITS))).any():
            raise InvalidMessage(f"a Hilbert index is beyond the {INDEX_BITS}-bit curve")
        if not (np.isfinite(batch.ts).all()):
            raise InvalidMessage("a timestamp is not a finite number")

    def add_binding(self, binding: FenceBinding) -> None:
        """Bind or re-bind a fence; an older version than the one known is ignored."""
        known = self._versions.get(binding.fence_id)
        if known is not None and binding.version < known:
            return
        self._versions[binding.fence_id] = binding.version
        self._index.add(binding.fence_id, binding.ranges, binding.interior)
        slot = self._index.slot_of(binding.fence_id)
        self._worker_of_slot = grow(self._worker_of_slot, slot + 1, 0)
        self._masters_of_slot = grow(self._masters_of_slot, slot + 1, 0)
        self._version_of_slot = grow(self._version_of_slot, slot + 1, 0)
        self._place(slot, binding.fence_id)
        self._version_of_slot[slot] = binding.version
        if binding.cross is not None or binding.fence_id in self._cross:
            self._cross_table = None
            if binding.cross is None:
                del self._cross[binding.fence_id]
            else:
                self._cross[binding.fence_id] = binding.cross

    def _place(self, slot: int, fence_id: str) -> None:
        """The fence's master(s), as the ring in force has them."""
        masters = [self._worker_index[w] for w in self._ring.masters(fence_id)]
        self._worker_of_slot[slot] = masters[0]
        self._masters_of_slot[slot] = sum(1 << i for i in masters) if len(masters) > 1 else 0

    def masters_of(self, fence_id: str) -> list[str]:
        """The worker(s) a fence's candidates go to (more than one: a hot fence)."""
        return list(self._ring.masters(fence_id))

    def _owners(self, codes: npt.NDArray[np.int64], masks: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Per (object code, masters bits): the worker number of the master owning the object
        (the first of the masters in its walk)."""
        n = len(self._objects)
        if self._walk.shape[0] < n:
            self._walk = np.vstack([self._walk, np.full((n - self._walk.shape[0], len(self.workers)), -1,
                                                        np.int8)])
        todo = np.unique(codes[self._walk[codes, 0] < 0])
        ids, index = self._objects.ids, self._worker_index
        for c in todo.tolist():
            self._walk[c] = [index[w] for w in self._ring.iter_nodes(ids[c])]
        walk = self._walk[codes].astype(np.int64)
        first = np.argmax((masks[:, None] >> walk) & 1, axis=1)
        out: npt.NDArray[np.int64] = walk[np.arange(codes.size), first]
        return out

    def remove_bindings(self, bindings: Iterable[tuple[str, int]]) -> None:
        """Unbind (fence_id, version) pairs; idempotent, and a stale version is ignored."""
        for fence_id, version in bindings:
            known = self._versions.get(fence_id)
            if known is not None and version < known:
                continue
            self._versions[fence_id] = version
            self._index.remove(fence_id, missing_ok=True)
            if self._cross.pop(fence_id, None) is not None:
                self._cross_table = None

    def change(self, fence_id: str, version: int,
               binding: FenceBinding | None) -> dict[str, WorkerBatch] | None:
        """Apply a change of one fence (`binding`: its ranges here at `version`; None: it no
        longer touches this region) and return, per master of the fence (one, unless it is
        hot), the re-check rows for that worker: the latest
        position of every object here that is in the fence's old or new ranges (the worker
        judges their age: it enters none seen more than the fence's timeout before the change,
        and times out those it has inside). The batch goes to the worker with the definition
        even when empty (the worker counts the regions through which a change reached it).
        This version applied already (a redelivery, or the bindings recovered from the store
        since): no rows. None: an older version than the one applied (stale: not forwarded).
        The rows' objects are marked as routed to their worker, so their next position goes
        there even from outside the fence (the LEAVE is immediate). A hot fence's rows are
        split by the master owning each object; every master gets a batch."""
        if binding is not None and (binding.fence_id != fence_id or binding.version != version):
            raise ValueError(f"binding {binding.fence_id} v{binding.version} given for {fence_id} v{version}")
        known = self._versions.get(fence_id)
        if known is not None and version < known:
            return None
        masters = self.masters_of(fence_id)
        nothing = np.empty(0, np.int64)
        none = {w: self._rechecks(w, fence_id, version, nothing, nothing, np.empty(0, bool)) for w in masters}
        if known == version:
            return none
        old = self.binding(fence_id)
        if binding is None:
            self.remove_bindings([(fence_id, version)])
        else:
            self.add_binding(binding)
        if old is None and binding is None:
            return none
        n = len(self._objects)
        here = np.flatnonzero(self._latest.present[:n])
        h = self._latest.h[here]
        pick = hk.ranges_contain(old.ranges, h) if old is not None else np.zeros(here.size, bool)
        row = hk.ranges_lookup(binding.ranges, h) if binding is not None else np.full(here.size, -1)
        pick |= row >= 0
        objs, row = here[pick], row[pick]
        self._last_mask = grow(self._last_mask, n, self._all if self.announce_unknown else 0)
        number = [self._worker_index[w] for w in masters]
        if len(masters) == 1:
            owner = np.full(objs.size, number[0], np.int64)
        else:
            owner = self._owners(objs, np.full(objs.size, sum(1 << i for i in number), np.int64))
        self._last_mask[objs] |= np.left_shift(np.int64(1), owner)
        out = {}
        for w, i in zip(masters, number, strict=True):
            mine = owner == i
            r = row[mine]
            interior = binding.interior[r[r >= 0]] if binding is not None else np.empty(0, bool)
            out[w] = self._rechecks(w, fence_id, version, objs[mine], r, np.asarray(interior, bool))
        return out

    def set_ring(self, workers: Sequence[str], ring: Ring) -> dict[str, int]:
        """Route with a new worker membership (`geofence worker add / remove`, once the moved
        fences' state is on their new workers): every fence's worker again, and the objects'
        memory of where they were routed carried over, so an object inside a fence that moved
        sends its next position to the fence's new worker too (its LEAVE stays immediate).
        Returns how many bound fences each worker gained."""
        if not workers or len(workers) > MAX_WORKERS or len(set(workers)) != len(workers):
            raise ValueError(f"1..{MAX_WORKERS} distinct workers, got {list(workers)}")
        old_workers, index = self.workers, {w: i for i, w in enumerate(workers)}
        gained: dict[str, int] = {}
        losers: set[int] = set()  # old bits of workers that lost fences (or a hot fence's objects)
        gainers_mask = 0
        for fence_id in self.fences():
            slot = self._index.slot_of(fence_id)
            bits = int(self._masters_of_slot[slot]) or 1 << int(self._worker_of_slot[slot])
            before = [w for i, w in enumerate(old_workers) if bits >> i & 1]
            after = list(ring.masters(fence_id))
            self._worker_of_slot[slot] = index[after[0]]
            self._masters_of_slot[slot] = sum(1 << index[w] for w in after) if len(after) > 1 else 0
            if set(before) == set(after) and (len(after) == 1 or ring == self._ring):
                continue
            # a hot fence whose ring changed: any master may have given objects to any other
            # (the objects' walks change with the ring), so every old master counts as a loser
            for w in after:
                if w not in before or len(after) > 1:
                    gained[w] = gained.get(w, 0) + 1
                gainers_mask |= 1 << index[w]
            losers.update(self._worker_index[w] for w in before)
        n = len(self._objects)
        old_masks = self._last_mask[:n].copy()
        masks = np.zeros(n, np.int64)
        for w, i in self._worker_index.items():
            had = (old_masks >> i) & 1 == 1
            if w in index:
                masks[had] |= 1 << index[w]
            if i in losers:
                masks[had] |= gainers_mask
        self._last_mask = masks
        self.workers, self._worker_index, self._ring = list(workers), index, ring
        self._all = (1 << len(workers)) - 1
        self.forget_walks()
        return gained

    def rebind(self, fence_id: str, version: int, binding: FenceBinding | None) -> bool:
        """The version applied, bound here with other ranges (None: none): a live region
        change (`geofence region add / remove`, the nightly re-split) moves a fence's ranges
        between regions without changing the fence, so nobody is re-checked. True if the
        bound ranges changed; False for another version (`change` handles those)."""
        if self._versions.get(fence_id) != version:
            return False
        old = self.binding(fence_id)
        if binding is None:
            if old is None:
                return False
            self._index.remove(fence_id, missing_ok=True)
            return True
        if old is not None and np.array_equal(old.ranges, binding.ranges) \
                and np.array_equal(old.interior, binding.interior):
            return False
        self.add_binding(binding)
        return True

    def _rechecks(self, worker: str, fence_id: str, version: int, objs: npt.NDArray[np.int64],
                  row: npt.NDArray[np.int64], interior: npt.NDArray[np.bool_]) -> WorkerBatch:
        """Re-check rows of `fence_id` for these objects: a candidate (with its interior
        flag) where the new ranges hold the latest position (row >= 0)."""
        has = row >= 0
        ptr = np.zeros(objs.size + 1, np.int64)
        np.cumsum(has, out=ptr[1:])
        ids, latest = self._objects.ids, self._latest
        pos = PositionBatch([ids[c] for c in objs.tolist()], latest.lon[objs], latest.lat[objs],
                            latest.ts[objs], latest.h[objs])
        return WorkerBatch(worker, pos, ptr, [fence_id], np.zeros(int(ptr[-1]), np.int32), interior,
                           None, latest.gate[objs], None, np.full(objs.size, self._origin, np.int64),
                           np.array([version], np.int64), np.zeros(objs.size, np.int32))

    def latest(self, object_id: str) -> dict[str, float] | None:
        """The object's latest position in this region, or None (never seen, or it left)."""
        return self._latest.of(self._objects.get(object_id))

    def query(self, q: queries.Query) -> list[dict[str, Any]]:
        """A spatial query over the latest positions of the objects in this region
        (exchanges/x_geo/queries.py; the caller merges the regions' answers)."""
        n, latest = len(self._objects), self._latest
        here = latest.present[:n]
        return queries.answer(q, self._objects.ids, np.where(here, latest.lon[:n], np.nan),
                              np.where(here, latest.lat[:n], np.nan), latest.ts[:n], latest.extra[:n])

    def binding(self, fence_id: str) -> FenceBinding | None:
        """What is bound for `fence_id` (at the version last applied), or None."""
        version = self._versions.get(fence_id)
        if version is None or fence_id not in self._index:
            return None
        ranges, interior = self._index.ranges_of(fence_id)
        return FenceBinding(fence_id, version, ranges, interior, self._cross.get(fence_id))

    def known_version(self, fence_id: str) -> int | None:
        """The latest version of `fence_id` applied (bound, unbound or dropped)."""
        return self._versions.get(fence_id)

    def compact(self) -> None:
        """Fold pending binding changes into the routing table now (after a bulk of
        add_binding), instead of in the next route."""
        self._index.compact()

    def recover(self, bindings: Iterable[FenceBinding]) -> None:
        """Rebuild from durable bindings; what objects were routed where is not recovered
        (with announce_unknown, each object's first position goes to every worker)."""
        self.create()
        for b in bindings:
            self.add_binding(b)
        self._index.compact()

    def route(self, batch: PositionBatch, left: PositionBatch | None = None, *,
              notice: npt.NDArray[np.bool_] | None = None,
              gate: npt.NDArray[np.float64] | None = None,
              announced: npt.NDArray[np.bool_] | None = None) -> dict[str, WorkerBatch]:
        """Per worker: the positions it must see, their candidate fences on it, and gates.

        As x-ingress sends them, in the batch's order (each object's time order): `notice`
        flags handover notices (an object left this region; the position is the one in the
        region it went to), `gate` is each position's gate (passed on), `announced` the
        first positions of objects x-ingress had not seen since its start (see
        exchanges.batch.RegionBatch): a position for every worker, or a notice that is only a
        barrier. `left` are notices given apart (in-process callers): they are merged into
        the batch by time, so an object that crossed back and forth within the batch is told
        of in order.
        """
        if left is not None and len(left):
            if notice is not None:
                raise ValueError("notices given twice (left= and notice=)")
            notice = np.r_[np.zeros(len(batch), bool), np.ones(len(left), bool)]
            if gate is not None:
                gate = np.r_[gate, np.zeros(len(left))]
            if announced is not None:
                announced = np.r_[announced, np.zeros(len(left), bool)]
            batch = PositionBatch.concat([batch, left])
            codes = self._objects.codes(batch.ids)
            if not distinct(codes, len(self._objects)):  # crossed back: time order matters
                order = np.argsort(batch.ts, kind="stable")
                batch, codes, notice = batch.take(order), codes[order], notice[order]
                gate = None if gate is None else gate[order]
                announced = None if announced is None else announced[order]
            return self._route(batch, codes, notice, gate, announced)
        return self._route(batch, self._objects.codes(batch.ids), notice, gate, announced)

    def objects_left(self, ids: Sequence[str], ts: npt.ArrayLike, lon: npt.ArrayLike,
                     lat: npt.ArrayLike, h: npt.ArrayLike) -> dict[str, WorkerBatch]:
        """Only handover notices (see route)."""
        pos = PositionBatch(list(ids), np.asarray(lon, np.float64), np.asarray(lat, np.float64),
                            np.asarray(ts, np.float64), np.asarray(h, np.uint64))
        return self.route(pos, notice=np.ones(len(pos), bool))

    def _route(self, batch: PositionBatch, codes: npt.NDArray[np.int64],
               notice: npt.NDArray[np.bool_] | None, gate: npt.NDArray[np.float64] | None,
               announced: npt.NDArray[np.bool_] | None = None) -> dict[str, WorkerBatch]:
        n = len(batch)
        if n == 0:
            return {}
        if notice is not None and not notice.any():
            notice = None
        if gate is not None and not gate.any():
            gate = None
        if announced is not None and not announced.any():
            announced = None
        m = self._index.route(batch.h)
        if notice is not None:  # a notice's position is in another region: no candidates here
            m = m.take(np.flatnonzero(~notice[m.point]))
        prev = None
        if self._cross:
            m, prev = self._with_crossings(batch, codes, notice, m)
        w_of_match = self._worker_of_slot[m.slot]
        hot = self._masters_of_slot[m.slot]
        if hot.any():  # a hot fence's candidates: to the master owning each object
            k = np.flatnonzero(hot)
            w_of_match[k] = self._owners(codes[m.point[k]], hot[k])
        now = worker_sets(m.point, w_of_match, n)
        self._last_mask = grow(self._last_mask, len(self._objects), self._all if self.announce_unknown else 0)
        targets = now | carry(codes, now, self._last_mask)  # a notice's `now` is 0: forgotten
        if notice is not None:
            targets[notice] = self._all
        if gate is not None:
            # an object's first position in this region (its gate is its own ts: it came in
            # from another one) goes to every worker: each decides from it, as this region
            # has the fences, what the object is in now (its notice only opens the gate)
            came_in = gate == batch.ts
            if notice is not None:
                came_in &= ~notice
            targets[came_in] = self._all
        barrier = None
        if announced is not None:
            targets[announced] = self._all
            barrier = announced & notice if notice is not None else None
            if barrier is not None and not barrier.any():
                barrier = None
        self._latest.remember(batch, codes, len(self._objects), notice, gate)
        out = {}
        local = np.empty(n, np.int64)
        for wi, worker in enumerate(self.workers):
            pts = np.flatnonzero(targets & (1 << wi))
            if not pts.size:
                continue
            sel = np.flatnonzero(w_of_match == wi)  # in point order, as m is
            local[pts] = np.arange(pts.size)
            ptr = np.zeros(pts.size + 1, dtype=np.int64)
            np.cumsum(np.bincount(local[m.point[sel]], minlength=pts.size), out=ptr[1:])
            slots, cand = dense_numbers(m.slot[sel], self._index.slot_count())
            out[worker] = WorkerBatch(
                worker, batch.take(pts), ptr, self._index.fence_of_slot(slots), cand, m.interior[sel],
                None if notice is None else notice[pts], None if gate is None else gate[pts],
                None if barrier is None else barrier[pts], np.full(pts.size, self._origin, np.int64),
                self._version_of_slot[slots], prev=None if prev is None else prev[pts],
            )
        return out

    def _with_crossings(self, batch: PositionBatch, codes: npt.NDArray[np.int64],
                        notice: npt.NDArray[np.bool_] | None, m: Matches
                        ) -> tuple[Matches, npt.NDArray[np.float64] | None]:
        """CROSS tests against the fences that detect CROSS (crossings.py): the matches, and
        each position's previous one when any segment met a box."""
        if self._cross_table is None:
            ids = [f for f in self._cross if f in self._index]
            slots = np.array([self._index.slot_of(f) for f in ids], np.int32)
            self._cross_table = slots, np.array([self._cross[f] for f in ids], np.float64).reshape(-1, 4)
        slots, box = self._cross_table
        return with_crossings(batch, codes, notice, m, slots, box, self._latest, self._index.slot_count())

    # -- state for `geofence inspect geo` ---------------------------------------------------

    def fences(self) -> list[str]:
        return self._index.fences()

    def worker_of(self, fence_id: str) -> str:
        """The worker of a bound fence; a hot fence's masters joined with "+"."""
        slot = self._index.slot_of(fence_id)
        bits = int(self._masters_of_slot[slot])
        if bits:
            return "+".join(w for i, w in enumerate(self.workers) if bits >> i & 1)
        return self.workers[int(self._worker_of_slot[slot])]

    def objects(self) -> dict[str, list[str]]:
        """Objects currently routed to some worker, and to which."""
        masks = self._last_mask[: len(self._objects)]
        return {self._objects.ids[c]: [w for i, w in enumerate(self.workers) if int(masks[c]) & (1 << i)]
                for c in np.flatnonzero(masks).tolist()}

    def stats(self) -> dict[str, object]:
        tracked = int(np.count_nonzero(self._last_mask))
        return {"region": self.region, "objects": tracked, **self._index.stats()}

    # -- internals ------------------------------------------------------------------------
