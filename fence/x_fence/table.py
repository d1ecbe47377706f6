"""The state of one x-fence worker as columns (see fence/x_fence/core.py): its fences by code,
its objects' rows, the sorted inside pairs, the unconfirmed stays, what changed since the
last journal record; and the events made from them (their ids, their order)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from exchanges.fence_def import FenceDef
from exchanges.fence_events import (
    CODES,
    CROSSED,
    DWELLED,
    EVENT_SLOTS,
    SET_POSITION,
    Event,
    visit_id,
)
from exchanges.fence_options import FENCE_OPTIONS, refusing
from exchanges.fence_options.band import hysteresis_zones
from exchanges.object_codes import ObjectCodes, grow
from exchanges.tenancy import TenantCodes, tenant_of
from fence.x_fence import codec
from fence.x_fence.held import Held
from fence.x_fence.shapes import Edges

WALLED = -2  # a candidate's fence code when the fence is another tenant's (x_fence/decisions.py)
_LOW = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


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


def name_rank(codes: I64, names: list[str]) -> I64:
    """For each code, the rank of its name among the names of the distinct codes given."""
    uniq, inv = np.unique(codes, return_inverse=True)
    strs = [names[c] for c in uniq.tolist()]
    rank = np.empty(uniq.size, np.int64)
    rank[sorted(range(len(strs)), key=strs.__getitem__)] = np.arange(uniq.size)
    out: I64 = rank[inv]
    return out



class FenceTable:
    """The state of one x-fence worker (no I/O): its fences by code, its objects' rows, the
    inside pairs, and what changed since the last journal record. The jobs on it are mixins in
    sibling modules (decisions, gates, handover, queries, persistence); fence/x_fence/core.py
    puts them together as XFence."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self._objects = ObjectCodes()
        self._last_ts = np.zeros(0, np.float64)
        self._last_lon = np.zeros(0, np.float64)
        self._last_lat = np.zeros(0, np.float64)
        self._ttl = np.zeros(0, np.float64)  # per object: the TTL of its latest position (inf: none)
        self._fence_code: dict[str, int] = {}
        # Tenants (exchanges/tenancy.py): a fence sees its own tenant's objects only. Codes of
        # the fences' and the objects' tenants, compared as arrays; an object's is filled in
        # the first time a batch needs it (`_object_tenants`), whoever numbered the object.
        self._tenants = TenantCodes()
        self._fence_tenant = np.zeros(0, np.int32)  # by fence code (an id's tenant never changes)
        self._obj_tenant = np.zeros(0, np.int32)  # by object code, the first _tenant_known filled
        self._tenant_known = 0
        # by fence code, for a fence that counts other tenants' objects (counts_from,
        # exchanges/fence_options/shares.py): their tenants' codes
        self._shares: dict[int, frozenset[int]] = {}
        self._fences: list[FenceDef | None] = []
        self._fence_names: list[str] = []  # by code, kept after a drop (codes are not reused)
        self._id_prefix: list[str] = []  # by code: "fence_id \x1f version \x1f" of event ids
        self._versions: dict[str, int] = {}  # also remembers deleted fences' last version
        self._version_of = np.zeros(0, np.int64)  # by code: the version defined
        self._changed_at = np.zeros(0, np.float64)  # by code: its change time (re-check events)
        self._created = np.zeros(0, bool)  # by code: that version created the fence (not a replace)
        # by code, while a change is in transition (not every region it was sent to has
        # forwarded it yet): the replaced version's geometry, and the regions still to come
        self._prev: dict[int, FenceDef] = {}
        self._pending: dict[int, set[str]] = {}
        self._geoms = np.empty(0, dtype=object)
        # by option key, by code: the number the option keeps (`FenceOption.column`: timeout_s,
        # hysteresis_m, dwell_s, cross as 0 / 1, ...)
        self._opt: dict[str, F64] = {o.key: np.zeros(0, np.float64) for o in FENCE_OPTIONS}
        # by code: one of the fence's options may refuse a position (a filter, an expiry, ...)
        self._refusing = np.zeros(0, bool)
        # by code, for a fence with a band: the fence shrunk and grown by it (band.py)
        self._inner = np.empty(0, dtype=object)
        self._outer = np.empty(0, dtype=object)
        # the inside pairs whose stay has not reached its fence's dwell time yet (no ENTER was
        # emitted: their LEAVE is silent); sorted keys, a subset of _keys
        self._unconfirmed = np.empty(0, np.uint64)
        self._edges = Edges()
        self._keys = np.empty(0, np.uint64)  # sorted (object << 32 | fence)
        self._since = np.empty(0, np.float64)
        self._ho_ts = np.zeros(0, np.float64)  # per object: the latest handover notice applied
        self._held = Held()  # positions waiting for a gate, in arrival order (fence/x_fence/held.py)
        self.unknown_fence_candidates = 0
        self.walled_candidates = 0  # candidates x-geo routed to a fence of another tenant
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

    def _clear_slot(self, code: int) -> None:
        """Fence `code` is gone (its slot stays, unused: codes are not reused)."""
        self._fences[code] = None
        self._geoms[code] = None
        for o in FENCE_OPTIONS:
            self._opt[o.key][code] = o.column(o.default)
        self._refusing[code] = False
        self._shares.pop(code, None)
        self._inner[code] = self._outer[code] = None
        self._prev.pop(code, None)
        self._pending.pop(code, None)
        self._edges.drop(code)

    def _new_slot(self, fence_id: str) -> int:
        """A new fence code for `fence_id` (codes are never reused)."""
        code = len(self._fences)
        self._fence_code[fence_id] = code
        self._fences.append(None)
        self._fence_names.append(fence_id)
        self._fence_tenant = grow(self._fence_tenant, code + 1, 0)
        self._fence_tenant[code] = self._tenants.code(tenant_of(fence_id))
        self._id_prefix.append("")
        self._version_of = grow(self._version_of, code + 1, 0)
        self._changed_at = grow(self._changed_at, code + 1, 0.0)
        self._created = grow(self._created, code + 1, False)
        self._geoms = grow(self._geoms, code + 1, None)
        for o in FENCE_OPTIONS:
            self._opt[o.key] = grow(self._opt[o.key], code + 1, o.column(o.default))
        self._refusing = grow(self._refusing, code + 1, False)
        self._inner = grow(self._inner, code + 1, None)
        self._outer = grow(self._outer, code + 1, None)
        return code

    def _install(self, code: int, fence: FenceDef, changed_at: float, created: bool) -> None:
        """Fence `code` is `fence`, changed at `changed_at` (its slot exists)."""
        self._fences[code] = fence
        self._id_prefix[code] = f"{fence.fence_id}\x1f{fence.version}\x1f"
        self._version_of[code] = fence.version
        self._changed_at[code] = changed_at
        self._created[code] = created
        self._geoms[code] = fence.geometry
        self._edges.put(code, fence.geometry)
        for o in FENCE_OPTIONS:
            self._opt[o.key][code] = o.column(getattr(fence, o.key))
        self._refusing[code] = bool(refusing(fence))
        if fence.counts_from:
            self._shares[code] = frozenset(self._tenants.code(t) for t in fence.counts_from)
        else:
            self._shares.pop(code, None)
        self._inner[code], self._outer[code] = (hysteresis_zones(fence.geometry, fence.hysteresis_m)
                                                if fence.hysteresis_m else (None, None))

    def _stored_pairs(self, objs: I64) -> I64:
        """Indices in the pair table of the pairs of these objects (sorted codes)."""
        lo = np.searchsorted(self._keys, objs.astype(np.uint64) << _SHIFT)
        hi = np.searchsorted(self._keys, (objs.astype(np.uint64) + np.uint64(1)) << _SHIFT)
        n_st = hi - lo
        at: I64 = np.repeat(lo - (np.cumsum(n_st) - n_st), n_st) + np.arange(int(n_st.sum()))
        return at

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

    def _object_tenants(self) -> npt.NDArray[np.int32]:
        """By object code: its tenant's code (filled up to the objects known now)."""
        known, m = self._tenant_known, len(self._objects)
        if known < m:
            self._obj_tenant = grow(self._obj_tenant, m, 0)
            self._obj_tenant[known:m] = self._tenants.of_keys(self._objects.ids[known:m])
            self._tenant_known = m
        return self._obj_tenant

    def _sees(self, objs: I64, fences: I64) -> npt.NDArray[np.bool_]:
        """Per (object code, fence code) pair: whether the fence may see the object: its own
        tenant's, or of a tenant it counts from (a shared pair: a count, never an identity)."""
        obj_t = self._object_tenants()[objs]
        out: npt.NDArray[np.bool_] = obj_t == self._fence_tenant[fences]
        other = np.flatnonzero(~out & (self._opt["counts_from"][fences] > 0))
        if other.size:  # one set lookup per distinct (fence, tenant) of the batch
            pairs, of = np.unique(fences[other] * (1 << 32) + obj_t[other], return_inverse=True)
            shares = self._shares
            ok = np.fromiter(((p & 0xFFFFFFFF) in shares.get(p >> 32, ()) for p in pairs.tolist()), bool,
                             pairs.size)
            out[other] = ok[of]
        return out

    def _dwell_on(self) -> bool:
        """Whether any fence has a dwell time or any stay waits for one (else no dwell work)."""
        return bool(self._unconfirmed.size) or bool(self._opt["dwell_s"].any())

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
        order = np.lexsort((kind, name_rank(fence, self._fence_names),
                            name_rank(obj, self._objects.ids), ts, shown))
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
        s_position = SET_POSITION
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
            s_position(e, None)  # a position's events get theirs afterwards (event_positions.py)
            out.append(e)
        return out
