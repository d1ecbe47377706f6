"""The x-fence core's state as plain data (msgpack-able dicts of bytes, numbers and strings),
for its snapshot and journal (fence/journal.py). No I/O.

- `snapshot(x)`: everything, and `restore(data)` the core it describes;
- `changes(x)`: what changed since the last call, as one journal record; `apply(x, record)`
  replays it.

A record holds final values, never operations: the row (last position, handover time) and
every inside pair of each object the batch touched, and the definition and every pair of each
fence defined or dropped. Replaying a record twice, or a record whose effects the state
already has, gives the same state: after a crash between a record's fsync and the ack of
its messages, the redelivered messages meet a state that already saw them, and change
nothing (positions at an object's last known ts add nothing it is not in).

This module reads and writes XFence's internals: it is the core's persistence, kept apart
so that the routing code stays about routing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import shapely

from exchanges.fence_def import FenceDef
from exchanges.worker_batch import WorkerBatch
from fence.state import _LOW, _SHIFT, XFence

FORMAT = 1
_STATS = ("unknown_fence_candidates", "stale_positions", "held_positions", "holds_expired", "rechecks",
          "rechecks_superseded")
U64 = npt.NDArray[np.uint64]
F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


def _b(a: npt.NDArray[Any], dtype: str) -> bytes:
    return np.ascontiguousarray(a, dtype=dtype).tobytes()


def _a(raw: bytes, dtype: str, to: Any) -> npt.NDArray[Any]:
    return np.frombuffer(raw, dtype).astype(to)


def _fence(x: XFence, code: int) -> dict[str, Any] | None:
    """Fence `code` as stored: its definition, change time, whether that version created
    it, and the geometry of the version it replaced (positions routed before a region
    applied the change are judged against it)."""
    d = x._fences[code]
    if d is None:
        return None
    prev = x._prev.get(code)
    return {"id": d.fence_id, "version": d.version, "wkb": shapely.to_wkb(d.geometry),
            "timeout_s": d.timeout_s, "name": d.name, "ts": float(x._changed_at[code]),
            "created": bool(x._created[code]),
            "prev": None if prev is None else [prev[0], shapely.to_wkb(prev[1])],
            "pending": sorted(x._pending.get(code, ()))}


def _unfence(x: XFence, code: int, d: dict[str, Any]) -> None:
    """Install fence `code` from `_fence`'s dict (a record of before re-checks: changed at 0,
    a replace, no previous geometry)."""
    geometry = shapely.from_wkb(d["wkb"])
    shapely.prepare(geometry)
    x._install(code, FenceDef(d["id"], int(d["version"]), geometry, float(d["timeout_s"]), d["name"]),
               float(d.get("ts", 0.0)), bool(d.get("created", False)))
    prev = d.get("prev")
    x._pending.pop(code, None)
    if prev is None:
        x._prev.pop(code, None)
    else:
        old = shapely.from_wkb(prev[1])
        shapely.prepare(old)
        x._prev[code] = (int(prev[0]), old)
        if d.get("pending"):
            x._pending[code] = {str(r) for r in d["pending"]}


def _held(x: XFence) -> list[list[Any]]:
    return [[code, wb.to_wire(), at] for code, items in sorted(x._held.items()) for wb, at in items]


def _unheld(rows: list[list[Any]]) -> dict[int, list[tuple[WorkerBatch, float]]]:
    held: dict[int, list[tuple[WorkerBatch, float]]] = {}
    for code, wire, at in rows:
        held.setdefault(int(code), []).append((WorkerBatch.from_wire(wire), float(at)))
    return held


def _clean(x: XFence) -> None:
    x._dirty_objs, x._dirty_fences, x._dirty_versions, x._held_dirty = [], set(), set(), False


# --------------------------------------------------------------------------- snapshot


def snapshot(x: XFence) -> dict[str, Any]:
    """The whole state; also clears what `changes` would report (the snapshot has it)."""
    n = len(x._objects)
    _clean(x)
    return {
        "format": FORMAT, "worker": x.worker, "ids": list(x._objects.ids),
        "last_ts": _b(x._last_ts[:n], "<f8"), "last_lon": _b(x._last_lon[:n], "<f8"),
        "last_lat": _b(x._last_lat[:n], "<f8"), "ho_ts": _b(x._ho_ts[:n], "<f8"),
        "fences": [_fence(x, c) for c in range(len(x._fences))], "names": list(x._fence_names),
        "versions": dict(x._versions),
        "keys": _b(x._keys, "<u8"), "since": _b(x._since, "<f8"),
        "held": _held(x), "stats": {k: getattr(x, k) for k in _STATS},
    }


def restore(data: dict[str, Any]) -> XFence:
    if data.get("format") != FORMAT:
        raise ValueError(f"x-fence snapshot format {data.get('format')!r}, this code reads {FORMAT}")
    x = XFence(str(data["worker"]))
    ids = list(data["ids"])
    x._objects.codes(ids)
    if x._objects.ids != ids:
        raise ValueError("x-fence snapshot: object ids repeat")
    n = len(ids)
    for name in ("last_ts", "last_lon", "last_lat", "ho_ts"):
        values = _a(data[name], "<f8", np.float64)
        if values.size != n:
            raise ValueError(f"x-fence snapshot: {name} has {values.size} rows for {n} objects")
        setattr(x, f"_{name}", values)
    for code, (name, d) in enumerate(zip(data["names"], data["fences"], strict=True)):
        x._new_slot(name)
        if d is None:
            del x._fence_code[name]  # dropped: the slot stays, unused
        else:
            _unfence(x, code, d)
            x._fence_code[name] = code
    x._versions = {str(k): int(v) for k, v in data["versions"].items()}
    x._keys = _a(data["keys"], "<u8", np.uint64)
    x._since = _a(data["since"], "<f8", np.float64)
    if x._keys.size != x._since.size or (x._keys.size > 1 and (x._keys[1:] <= x._keys[:-1]).any()):
        raise ValueError("x-fence snapshot: inside pairs are not sorted and unique")
    x._held = _unheld(data["held"])
    for k, v in data["stats"].items():
        if k in _STATS:
            setattr(x, k, int(v))
    return x


# --------------------------------------------------------------------------- changes


def changes(x: XFence, n_persisted: int) -> dict[str, Any] | None:
    """What changed since the last call (None: nothing). `n_persisted` is the number of
    object ids the journal already holds; the record carries the ids after them."""
    n = len(x._objects)
    if (not x._dirty_objs and not x._dirty_fences and not x._dirty_versions and not x._held_dirty
            and n == n_persisted):
        return None
    objs = np.unique(np.concatenate(x._dirty_objs)) if x._dirty_objs else np.empty(0, np.int64)
    fences = np.array(sorted(x._dirty_fences), np.int64)
    take = np.zeros(x._keys.size, bool)
    if objs.size:
        take[x._stored_pairs(objs)] = True
    if fences.size:
        take |= np.isin((x._keys & _LOW).astype(np.int64), fences)
    record = {
        "n0": n_persisted, "new_ids": x._objects.ids[n_persisted:n],
        "objs": _b(objs, "<i8"), "last_ts": _b(x._last_ts[objs], "<f8"),
        "last_lon": _b(x._last_lon[objs], "<f8"), "last_lat": _b(x._last_lat[objs], "<f8"),
        "ho_ts": _b(x._ho_ts[objs], "<f8"),
        "fences": [[c, x._fence_names[c], _fence(x, c)] for c in fences.tolist()],
        "versions": {f: x._versions[f] for f in {*(x._fence_names[c] for c in fences.tolist()),
                                                 *x._dirty_versions}},
        "keys": _b(x._keys[take], "<u8"), "since": _b(x._since[take], "<f8"),
        "held": _held(x) if x._held_dirty else None,
        "stats": {k: getattr(x, k) for k in _STATS},
    }
    _clean(x)
    return record


def apply(x: XFence, record: dict[str, Any]) -> None:
    """Replay one record of `changes` (in journal order)."""
    n0 = int(record["n0"])
    if n0 > len(x._objects):
        raise ValueError(f"x-fence journal: a record starts at object {n0}, the state has {len(x._objects)}")
    new_ids = list(record["new_ids"])[len(x._objects) - n0:]  # a replayed record's ids are known
    if new_ids:
        x._codes(new_ids)
    objs = _a(record["objs"], "<i8", np.int64)
    for name in ("last_ts", "last_lon", "last_lat", "ho_ts"):
        getattr(x, f"_{name}")[objs] = _a(record[name], "<f8", np.float64)
    fences = []
    for code, name, d in record["fences"]:
        if code > len(x._fences):
            raise ValueError(f"x-fence journal: fence code {code} after {len(x._fences)} codes")
        if code == len(x._fences):
            x._new_slot(name)
            del x._fence_code[name]
        if d is None:
            if x._fence_code.get(name) == code:
                del x._fence_code[name]
            x._fences[code] = None
            x._geoms[code] = None
            x._prev.pop(code, None)
            x._pending.pop(code, None)
            x._edges.drop(code)
        else:
            _unfence(x, code, d)
            x._fence_code[name] = code
        fences.append(code)
    x._versions.update({str(k): int(v) for k, v in record["versions"].items()})
    keys = x._keys
    drop = np.isin((keys >> _SHIFT).astype(np.int64), objs) | np.isin((keys & _LOW).astype(np.int64), fences)
    new_keys = _a(record["keys"], "<u8", np.uint64)
    new_since = _a(record["since"], "<f8", np.float64)
    order = np.argsort(new_keys, kind="stable")
    x._merge_pairs(keys[~drop], x._since[~drop], new_keys[order], new_since[order])
    if record["held"] is not None:
        x._held = _unheld(record["held"])
    for k, v in record["stats"].items():
        if k in _STATS:
            setattr(x, k, int(v))
    _clean(x)


def equal(a: XFence, b: XFence) -> list[str]:
    """The parts in which two cores differ (empty: the same state). For tests and checks."""
    diffs = []
    n = len(a._objects)
    if a._objects.ids != b._objects.ids:
        diffs.append("object ids")
    else:
        for name in ("_last_ts", "_last_lon", "_last_lat", "_ho_ts"):
            if not np.array_equal(getattr(a, name)[:n], getattr(b, name)[:n], equal_nan=True):
                diffs.append(name)
    if not (np.array_equal(a._keys, b._keys) and np.array_equal(a._since, b._since)):
        diffs.append("inside pairs")
    if a._fence_code != b._fence_code or a._fence_names != b._fence_names or a._versions != b._versions:
        diffs.append("fence codes / versions")
    for c, (fa, fb) in enumerate(zip(a._fences, b._fences, strict=False)):
        if fa is None or fb is None:
            if (fa is None) != (fb is None):
                diffs.append(f"fence {c}")
        elif ((fa.fence_id, fa.version, fa.timeout_s, fa.name, a._changed_at[c], a._created[c]) !=
                (fb.fence_id, fb.version, fb.timeout_s, fb.name, b._changed_at[c], b._created[c])
              or not fa.geometry.equals_exact(fb.geometry, 0)
              or a._pending.get(c) != b._pending.get(c)
              or (a._prev.get(c) is None) != (b._prev.get(c) is None)
              or (c in a._prev and (a._prev[c][0] != b._prev[c][0]
                                    or not a._prev[c][1].equals_exact(b._prev[c][1], 0)))):
            diffs.append(f"fence {c}")
    if _held(a) != _held(b):
        diffs.append("held positions")
    if any(getattr(a, k) != getattr(b, k) for k in _STATS):
        diffs.append("counters")
    return diffs
