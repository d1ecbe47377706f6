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

from exchanges.fence_def import FenceDef
from exchanges.fence_options import decode_options, encode_options, filters

# 2: objects have a `ttl` row (format 1, without it, is read as no TTL); 3: a fence's replaced
# version is a dict with its options (2's list [version, wkb, band, filter] is still read)
FORMAT = 3
READABLE = (1, 2, 3)
STATS = ("unknown_fence_candidates", "stale_positions", "held_positions", "holds_expired", "rechecks",
         "rechecks_superseded", "walled_candidates")
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
    return {"id": d.fence_id, "version": d.version, "wkb": shapely.to_wkb(d.geometry), "name": d.name,
            "ts": float(f.changed_at), "created": bool(f.created),
            "prev": None if f.prev is None else {"version": f.prev.version,
                                                 "wkb": shapely.to_wkb(f.prev.geometry),
                                                 **encode_options(f.prev)},
            "pending": sorted(f.pending), **encode_options(d)}


def unpack_fence(d: Mapping[str, Any]) -> StoredFence:
    """`pack_fence`'s dict (a record written before re-checks: changed at 0, a replace, no
    previous geometry); geometries prepared for the exact test."""
    geometry = shapely.from_wkb(d["wkb"])
    shapely.prepare(geometry)
    options = decode_options(d)
    prev = d.get("prev")
    old: FenceDef | None = None
    if isinstance(prev, Mapping):
        old = FenceDef(fence_id=d["id"], version=int(prev["version"]), geometry=shapely.from_wkb(prev["wkb"]),
                       name=d["name"], **decode_options(prev))
    elif prev is not None:  # before options were one vocabulary: [version, wkb, band, filter]
        old = FenceDef(fence_id=d["id"], version=int(prev[0]), geometry=shapely.from_wkb(prev[1]),
                       name=d["name"], timeout_s=options["timeout_s"],
                       hysteresis_m=float(prev[2]) if len(prev) > 2 else 0.0,
                       where=filters.parse(prev[3]) if len(prev) > 3 else ())
    if old is not None:
        shapely.prepare(old.geometry)
    pending = frozenset(str(r) for r in d.get("pending") or ()) if old is not None else frozenset()
    return StoredFence(FenceDef(fence_id=d["id"], version=int(d["version"]), geometry=geometry,
                                name=d["name"], **options),
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
