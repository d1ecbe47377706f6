"""Position batches: the unit of work between sidecars, and their wire format.

Columns are numpy arrays so every stage works on the whole batch (one C call for the
Hilbert indices, one search for the routing, one vectorised polygon test). On the wire a
batch is msgpack with each numeric column as raw little-endian bytes, so decoding 10,000
positions is a handful of `np.frombuffer` calls, not 10,000 dicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt

CONTENT_TYPE = "application/x-geofence-batch+msgpack"
WIRE_VERSION = 1

F64 = npt.NDArray[np.float64]
U64 = npt.NDArray[np.uint64]


# A position's other fields pass through to the events; msgpack (the pipeline's wire) packs
# at most ~1,000 levels and takes string keys only: a device needs no more than a few levels.
MAX_EXTRA_DEPTH = 16


def extra_problem(rest: dict[Any, Any]) -> str | None:
    """Why a position's extra fields cannot pass through the pipeline, or None."""
    stack: list[tuple[Any, int]] = [(rest, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict | list | tuple):
            if depth > MAX_EXTRA_DEPTH:
                return f"extra fields nested deeper than {MAX_EXTRA_DEPTH} levels"
            if isinstance(v, dict):
                for k, x in v.items():
                    if not isinstance(k, str):
                        return f"extra field key {str(k)[:40]!r} is not a string"
                    stack.append((x, depth + 1))
            else:
                stack.extend((x, depth + 1) for x in v)
    return None


@dataclass(frozen=True, eq=False)
class PositionBatch:
    """Validated positions: object ids, lon/lat degrees, ts (epoch seconds), Hilbert index at
    26 bits per axis (0 until ingress computes it) and the optional pass-through fields."""

    ids: list[str]
    lon: F64
    lat: F64
    ts: F64
    h: U64
    extra: list[dict[str, Any] | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.ids)
        for name in ("lon", "lat", "ts", "h"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"column {name} has shape {getattr(self, name).shape}, expected ({n},)")
        if self.extra and len(self.extra) != n:
            raise ValueError(f"extra has {len(self.extra)} entries for {n} positions")

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, idx: npt.ArrayLike) -> PositionBatch:
        i = np.asarray(idx, dtype=np.int64)
        return PositionBatch(
            [self.ids[j] for j in i.tolist()], self.lon[i], self.lat[i], self.ts[i], self.h[i],
            [self.extra[j] for j in i.tolist()] if self.extra else [],
        )

    @staticmethod
    def concat(batches: list[PositionBatch]) -> PositionBatch:
        if not batches:
            return PositionBatch.empty()
        any_extra = any(b.extra for b in batches)
        ids: list[str] = []
        for b in batches:
            ids += b.ids
        return PositionBatch(
            ids,
            np.concatenate([b.lon for b in batches]), np.concatenate([b.lat for b in batches]),
            np.concatenate([b.ts for b in batches]), np.concatenate([b.h for b in batches]),
            [e for b in batches for e in (b.extra or [None] * len(b))] if any_extra else [],
        )

    @staticmethod
    def empty() -> PositionBatch:
        z = np.empty(0, np.float64)
        return PositionBatch([], z, z.copy(), z.copy(), np.empty(0, np.uint64))

    def to_wire(self) -> dict[str, Any]:
        return {
            "ids": self.ids,
            "lon": self.lon.astype("<f8").tobytes(),
            "lat": self.lat.astype("<f8").tobytes(),
            "ts": self.ts.astype("<f8").tobytes(),
            "h": self.h.astype("<u8").tobytes(),
            "extra": self.extra or None,
        }

    @staticmethod
    def from_wire(d: dict[str, Any]) -> PositionBatch:
        """ValueError if the ids are not strings (the columns' lengths are checked on
        construction)."""
        ids = list(d["ids"])
        if not all(type(i) is str for i in ids):
            raise ValueError("object ids that are not strings")
        extra = list(d["extra"]) if d.get("extra") else []
        problem = next((p for e in extra if e is not None for p in [extra_problem(e) if isinstance(e, dict)
                        else "extra fields that are not an object"] if p), None)
        if problem:
            raise ValueError(problem)
        return PositionBatch(
            ids,
            np.frombuffer(d["lon"], "<f8").astype(np.float64),
            np.frombuffer(d["lat"], "<f8").astype(np.float64),
            np.frombuffer(d["ts"], "<f8").astype(np.float64),
            np.frombuffer(d["h"], "<u8").astype(np.uint64),
            extra,
        )


@dataclass(frozen=True, eq=False)
class RegionBatch:
    """What one region's x-geo gets from an x-ingress batch, in the batch's order: its positions and
    the handover notices of objects that left it (flagged `notice`; the position is the one
    in the region they went to); `gate` is, per row, the ts its object entered the region
    (this one for a position, the one it left for a notice; 0: unknown), see
    exchanges/x_geo/core.py. One message, so the x-geo sees an object's notices and positions in
    the order they happened.

    `announced` flags the first position of an object x-ingress had not seen since its
    start (ingress/core.py, Restarts): in the object's region, a position for every worker,
    gated on its own ts; elsewhere, a notice that is only a barrier (it opens that gate once
    the region's earlier positions of the object are through, and changes nothing else)."""

    batch: PositionBatch
    notice: npt.NDArray[np.bool_]
    gate: npt.NDArray[np.float64]
    announced: npt.NDArray[np.bool_] | None = None

    def announcements(self) -> npt.NDArray[np.bool_]:
        return self.announced if self.announced is not None else np.zeros(len(self.batch), bool)

    def to_wire(self) -> dict[str, Any]:
        d: dict[str, Any] = {"batch": self.batch.to_wire()}
        if self.notice.any():
            d["notice"] = self.notice.astype(np.uint8).tobytes()
        if self.gate.any():
            d["gate"] = self.gate.astype("<f8").tobytes()
        if self.announced is not None and self.announced.any():
            d["announced"] = self.announced.astype(np.uint8).tobytes()
        return d

    @staticmethod
    def from_wire(d: dict[str, Any]) -> RegionBatch:
        """ValueError if the flags or gates do not fit the batch."""
        batch = PositionBatch.from_wire(d["batch"])
        n = len(batch)
        flags = []
        for name in ("notice", "announced"):
            f = np.frombuffer(d[name], np.uint8).astype(bool) if d.get(name) else np.zeros(n, bool)
            if f.size != n:
                raise ValueError(f"{name} flags for {f.size} positions in a batch of {n}")
            flags.append(f)
        gate = np.frombuffer(d["gate"], "<f8").astype(np.float64) if d.get("gate") else np.zeros(n)
        if gate.size != n or not np.isfinite(gate).all():
            raise ValueError(f"gates for {gate.size} positions in a batch of {n}, or not finite")
        return RegionBatch(batch, flags[0], gate, flags[1] if flags[1].any() else None)


def pack(kind: str, **payload: Any) -> bytes:
    """One message body: {"v", "kind", ...payload} as msgpack."""
    out: bytes = msgpack.packb({"v": WIRE_VERSION, "kind": kind, **payload}, use_bin_type=True)
    return out


def unpack(body: bytes) -> dict[str, Any]:
    """Decode a body packed by `pack`; ValueError with the reason if it is not one."""
    try:
        d = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise ValueError(f"not a msgpack body ({type(exc).__name__}: {exc})") from None
    if not isinstance(d, dict) or d.get("v") != WIRE_VERSION or not isinstance(d.get("kind"), str):
        raise ValueError(f"not a geofence message of wire version {WIRE_VERSION}")
    return d
