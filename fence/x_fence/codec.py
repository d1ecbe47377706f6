"""The formats of x-fence's durable state (exchanges/state_dir.py writes them): plain data
(msgpack-able dicts of bytes, numbers and strings), no I/O. The worker's core builds and
reads them (`XFence.snapshot` / `restore`, `changes` / `apply`); this module holds how each
part is encoded, so the core stays about routing and the formats stay in one place.

- a snapshot: everything (`FORMAT` says which layout);
- a journal record: what one batch changed, as final values, never operations: the row (last
  position, handover time) and every inside pair of each object the batch touched, and the
  definition and every pair of each fence defined or dropped. Replaying a record twice, or a
  record whose effects the state already has, gives the same state: after a crash between a
  record's fsync and the ack of its messages, the redelivered messages meet a state that
  already saw them, and change nothing (positions at an object's last known ts add nothing
  it is not in).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import shapely

from exchanges import filters
from exchanges.fence_def import FenceDef

FORMAT = 2  # 2: objects have a `ttl` row (format 1, without it, is read as no TTL)
READABLE = (1, 2)
STATS = ("unknown_fence_candidates", "stale_positions", "held_positions", "holds_expired", "rechecks",
         "rechecks_superseded")
ROWS = ("last_ts", "last_lon", "last_lat", "ho_ts", "ttl")  # the per-object columns
_ROW_DEFAULT = {"ttl": np.inf}  # rows a format-1 snapshot, record or export does not have


def check_format(data: Mapping[str, Any], what: str) -> None:
    if data.get("format") not in READABLE:
        raise ValueError(f"x-fence {what} format {data.get('format')!r}, this code reads "
                         f"{', '.join(map(str, READABLE))}")


def unpack_row(data: Mapping[str, Any], name: str, n: int) -> npt.NDArray[np.float64]:
    """Per-object row `name` of a snapshot, record or export of n objects."""
    if name not in data and name in _ROW_DEFAULT:
        return np.full(n, _ROW_DEFAULT[name])
    out: npt.NDArray[np.float64] = unpack_array(data[name], "<f8", np.float64)
    return out


def pack_array(a: npt.NDArray[Any], dtype: str) -> bytes:
    return np.ascontiguousarray(a, dtype=dtype).tobytes()


def unpack_array(raw: bytes, dtype: str, to: Any) -> npt.NDArray[Any]:
    return np.frombuffer(raw, dtype).astype(to)


@dataclass(frozen=True)
class StoredFence:
    """A fence as stored: its definition, change time, whether that version created it, and
    the version it replaced (its geometry, band and filter) with the regions still to forward
    the change, while the change is in transition (positions routed before a region applied it
    are judged against that version)."""

    fence: FenceDef
    changed_at: float
    created: bool
    prev: FenceDef | None
    pending: frozenset[str]


def pack_fence(f: StoredFence) -> dict[str, Any]:
    d = f.fence
    return {"id": d.fence_id, "version": d.version, "wkb": shapely.to_wkb(d.geometry),
            "timeout_s": d.timeout_s, "name": d.name, "ts": float(f.changed_at), "created": bool(f.created),
            "prev": None if f.prev is None else [f.prev.version, shapely.to_wkb(f.prev.geometry),
                                                 f.prev.hysteresis_m, filters.to_wire(f.prev.where)],
            "pending": sorted(f.pending), **({"hysteresis_m": d.hysteresis_m} if d.hysteresis_m else {}),
            **({"where": filters.to_wire(d.where)} if d.where else {}),
            **({"dwell_s": d.dwell_s} if d.dwell_s else {}), **({"cross": True} if d.cross else {})}


def unpack_fence(d: Mapping[str, Any]) -> StoredFence:
    """`pack_fence`'s dict (a record written before re-checks: changed at 0, a replace, no
    previous geometry); geometries prepared for the exact test."""
    geometry = shapely.from_wkb(d["wkb"])
    shapely.prepare(geometry)
    prev = d.get("prev")
    old: FenceDef | None = None
    if prev is not None:  # [version, wkb] (before bands and filters), or with them
        g = shapely.from_wkb(prev[1])
        shapely.prepare(g)
        old = FenceDef(d["id"], int(prev[0]), g, float(d["timeout_s"]), d["name"],
                       float(prev[2]) if len(prev) > 2 else 0.0,
                       filters.parse(prev[3]) if len(prev) > 3 else ())
    pending = frozenset(str(r) for r in d.get("pending") or ()) if old is not None else frozenset()
    return StoredFence(FenceDef(d["id"], int(d["version"]), geometry, float(d["timeout_s"]), d["name"],
                                float(d.get("hysteresis_m", 0.0)), filters.parse(d.get("where")),
                                float(d.get("dwell_s", 0.0)), bool(d.get("cross", False))),
                       float(d.get("ts", 0.0)), bool(d.get("created", False)), old, pending)


def differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The parts in which two states (`XFence.state()`) differ; empty: the same state."""
    out = []
    if a["ids"] != b["ids"]:
        out.append("object ids")
    else:
        out += [f"_{name}" for name in ROWS
                if not np.array_equal(unpack_array(a[name], "<f8", np.float64),
                                      unpack_array(b[name], "<f8", np.float64), equal_nan=True)]
    if (a["keys"], a["since"]) != (b["keys"], b["since"]):
        out.append("inside pairs")
    if a.get("unconfirmed", b"") != b.get("unconfirmed", b""):
        out.append("unconfirmed stays (dwell)")
    if a["names"] != b["names"] or a["versions"] != b["versions"] or a["codes"] != b["codes"]:
        out.append("fence codes / versions")
    out += [f"fence {c}" for c, (fa, fb) in enumerate(zip(a["fences"], b["fences"], strict=False))
            if fa != fb]
    if a["held"] != b["held"]:
        out.append("held positions")
    if a["stats"] != b["stats"]:
        out.append("counters")
    return out
