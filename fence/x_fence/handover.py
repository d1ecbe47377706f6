"""Handover between workers (`geofence worker add / remove / hot`): what a new ring gives
away (export, then forget) and what a worker takes of another's export."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from fence.x_fence import codec
from fence.x_fence.table import _LOW, _SHIFT, FenceTable, Placement


class Handover(FenceTable):
    """`geofence worker add / remove / hot`: what a new ring gives away, and takes."""

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
