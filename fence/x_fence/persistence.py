"""Snapshots and journal records of a worker's state (their formats: fence/x_fence/codec.py)."""

from __future__ import annotations

from typing import Any, Self

import numpy as np

from fence.x_fence import codec
from fence.x_fence.held import Held
from fence.x_fence.table import _LOW, _SHIFT, FenceTable


class Persistence(FenceTable):
    """Snapshots and journal records (the formats: fence/x_fence/codec.py)."""

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
    def restore(cls, data: dict[str, Any]) -> Self:
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
