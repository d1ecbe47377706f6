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
        return PositionBatch(
            list(d["ids"]),
            np.frombuffer(d["lon"], "<f8").astype(np.float64),
            np.frombuffer(d["lat"], "<f8").astype(np.float64),
            np.frombuffer(d["ts"], "<f8").astype(np.float64),
            np.frombuffer(d["h"], "<u8").astype(np.uint64),
            list(d["extra"]) if d.get("extra") else [],
        )


@dataclass(frozen=True, eq=False)
class RegionBatch:
    """What one region's x-geo gets from an x-ingress batch, in the batch's order: its positions and
    the handover notices of objects that left it (flagged `notice`; the position is the one
    in the region they went to); `entered` flags positions of objects that came in from
    another region. One message, so the x-geo sees an object's notices and positions in
    the order they happened."""

    batch: PositionBatch
    notice: npt.NDArray[np.bool_]
    entered: npt.NDArray[np.bool_]

    def to_wire(self) -> dict[str, Any]:
        d: dict[str, Any] = {"batch": self.batch.to_wire()}
        if self.notice.any():
            d["notice"] = self.notice.astype(np.uint8).tobytes()
        if self.entered.any():
            d["entered"] = self.entered.astype(np.uint8).tobytes()
        return d

    @staticmethod
    def from_wire(d: dict[str, Any]) -> RegionBatch:
        """ValueError if the flags do not fit the batch."""
        batch = PositionBatch.from_wire(d["batch"])
        n = len(batch)
        flags = []
        for name in ("notice", "entered"):
            f = np.frombuffer(d[name], np.uint8).astype(bool) if d.get(name) else np.zeros(n, bool)
            if f.size != n:
                raise ValueError(f"{name} flags for {f.size} positions in a batch of {n}")
            flags.append(f)
        return RegionBatch(batch, flags[0], flags[1])


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
